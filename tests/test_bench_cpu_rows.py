"""CPU models told apart (provenance.cpu_from_cpuinfo, machine_info's "cpu_label"), and bench.md's rows by CPU
model: each part with cpu_row keeps one full run's row per CPU label across runs (runner.keep_cpu_rows)."""
from __future__ import annotations

import json
import platform
import types
from pathlib import Path

import pytest

from numformer import provenance
from numformer._results import BENCH_TITLE
from numformer.bench import runner

ROOT = Path(__file__).resolve().parents[1]


def cpuinfo(vendor, family, model, name, flags, processors=2):
    """/proc/cpuinfo's text for a machine of ``processors`` identical processors."""
    block = (f"processor\t: {{}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
             f"model name\t: {name}\nstepping\t: 1\nflags\t\t: fpu sse sse2 {flags}\n\n")
    return "".join(block.format(i) for i in range(processors))


ZEN3 = cpuinfo("AuthenticAMD", 25, 1, "AMD EPYC", "avx avx2 fma")
ZEN4 = cpuinfo("AuthenticAMD", 25, 17, "AMD EPYC", "avx avx2 avx512f avx512bw")
SPR = cpuinfo("GenuineIntel", 6, 143, "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", "avx avx2 avx512f amx_tile")


@pytest.mark.parametrize("text, label", [
    (ZEN3, "AMD EPYC (Zen 3, family 25 model 1, AVX2)"),
    (ZEN4, "AMD EPYC (Zen 4, family 25 model 17, AVX-512)"),
    (SPR, "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz (Sapphire Rapids, family 6 model 143, AVX-512)"),
    (cpuinfo("GenuineIntel", 6, 85, "Intel(R) Xeon(R) CPU @ 2.00GHz", "avx avx2 avx512f"),
     "Intel(R) Xeon(R) CPU @ 2.00GHz (Skylake-SP/Cascade Lake, family 6 model 85, AVX-512)"),
    (cpuinfo("AuthenticAMD", 99, 7, "AMD Future", "avx"), "AMD Future (family 99 model 7, AVX)"),
    (cpuinfo("GenuineIntel", 6, 143, "Old Xeon", ""), "Old Xeon (Sapphire Rapids, family 6 model 143, no AVX)"),
    ("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\nCPU part\t: 0xd0c\n\n", "aarch64"),   # ARM: no name
    ("", "aarch64"),
])
def test_cpu_label_from_cpuinfo(text, label):
    name, got = provenance.cpu_from_cpuinfo(text, "aarch64")
    assert got == label
    assert name == label.split(" (")[0]


def test_the_first_processor_names_the_machine():
    """A hybrid or odd machine lists processors one after another: the label is the first one's."""
    text = ZEN3.split("\n\n")[0] + "\n\n" + ZEN4
    assert provenance.cpu_from_cpuinfo(text, "x86_64")[1] == "AMD EPYC (Zen 3, family 25 model 1, AVX2)"


@pytest.mark.parametrize("processor", ["arm", ""])
def test_machine_info_without_proc_cpuinfo(tmp_path, monkeypatch, processor):
    """macOS and Windows have no /proc/cpuinfo: the CPU is named from what platform says, and nothing fails."""
    monkeypatch.setattr(provenance, "CPUINFO", str(tmp_path / "no_such_file"))
    monkeypatch.setattr(platform, "processor", lambda: processor)
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    info = provenance.machine_info()
    assert info["cpu"] == info["cpu_label"] == (processor or platform.machine())


def test_machine_info_reads_the_label_from_cpuinfo(tmp_path, monkeypatch):
    (tmp_path / "cpuinfo").write_text(ZEN4, encoding="utf-8")
    monkeypatch.setattr(provenance, "CPUINFO", str(tmp_path / "cpuinfo"))
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    info = provenance.machine_info()
    assert info["cpu"] == "AMD EPYC" and info["cpu_label"] == "AMD EPYC (Zen 4, family 25 model 17, AVX-512)"
    assert "blas_coretype" not in info


@pytest.mark.parametrize("coretype", ["Haswell", " SkylakeX "])
def test_a_forced_openblas_kernel_family_is_part_of_the_label(tmp_path, monkeypatch, coretype):
    """OPENBLAS_CORETYPE in the environment picks OpenBLAS's kernels instead of the CPU: figures measured under it
    get a row of their own (a Zen 5 core runs products about 2x faster with AVX-512 kernels than AVX2 ones)."""
    (tmp_path / "cpuinfo").write_text(ZEN4, encoding="utf-8")
    monkeypatch.setattr(provenance, "CPUINFO", str(tmp_path / "cpuinfo"))
    monkeypatch.setattr(provenance, "openblas_core", lambda: "Haswell")
    monkeypatch.setenv("OPENBLAS_CORETYPE", coretype)
    info = provenance.machine_info()
    forced = coretype.strip()
    assert info["blas_coretype"] == forced
    assert info["cpu_label"] == f"AMD EPYC (Zen 4, family 25 model 17, AVX-512; OPENBLAS_CORETYPE={forced})"
    assert provenance.label_with_coretype("AMD EPYC", "Zen") == "AMD EPYC (OPENBLAS_CORETYPE=Zen)"
    monkeypatch.setattr(provenance, "openblas_core", lambda: None)      # another BLAS: the variable means nothing
    assert provenance.machine_info()["cpu_label"] == "AMD EPYC (Zen 4, family 25 model 17, AVX-512)"


def test_labels_of_records_written_before_labels():
    assert provenance.cpu_label({"cpu": "AMD EPYC"}) == "AMD EPYC (model not recorded)"
    assert provenance.cpu_label({"cpu": "AMD EPYC", "blas_core": "Haswell"}) == \
        "AMD EPYC (model not recorded; OpenBLAS Haswell kernels)"
    assert provenance.cpu_label({"cpu": "AMD EPYC", "cpu_label": "AMD EPYC (Zen 3)"}) == "AMD EPYC (Zen 3)"


def _fake_part(monkeypatch, with_row=True):
    """A part "fake" whose run returns the next of ``part.speeds``; cpu_row keeps its speed."""
    part = types.ModuleType("numformer.bench.fake")
    part.speeds = []
    part.run = lambda quick=False: {"speed": part.speeds.pop(0), "series": [1, 2, 3]}
    part.markdown = lambda result, fig_dir: f"## fake: a part of the tests\n\nspeed {result['speed']}"
    if with_row:
        part.cpu_row = lambda result: {"speed ratio": result["speed"], "both": [result["speed"], 2 * result["speed"]]}
    monkeypatch.setattr(runner, "load_part", lambda name: part)
    monkeypatch.setattr(runner, "git_commit", lambda: "abc1234")
    return part


def _run_on(monkeypatch, out, part, label, speed, quick=False):
    """One run of the fake part on a machine whose CPU label is ``label``; bench.json's section afterwards."""
    monkeypatch.setattr(runner, "machine_info", lambda: {"cpu": label.split(" (")[0], "cpu_label": label, "cores": 2})
    part.speeds.append(speed)
    runner.run_parts(["fake"], quick=quick, out_dir=out, log=lambda *a: None)
    return json.loads((out / "bench.json").read_text(encoding="utf-8"))["fake"]


ZEN3_LABEL, ZEN4_LABEL = "AMD EPYC (Zen 3, family 25 model 1, AVX2)", "AMD EPYC (Zen 4, family 25 model 17, AVX-512)"


def test_each_cpu_model_keeps_its_row(tmp_path, monkeypatch):
    part, out = _fake_part(monkeypatch), tmp_path / "out"
    _run_on(monkeypatch, out, part, ZEN3_LABEL, 0.96)
    section = _run_on(monkeypatch, out, part, ZEN4_LABEL, 1.06)
    rows = section["_per_cpu"]
    assert {k: r["speed ratio"] for k, r in rows.items()} == {ZEN3_LABEL: 0.96, ZEN4_LABEL: 1.06}
    assert rows[ZEN4_LABEL]["command"] == "numformer bench fake" and rows[ZEN4_LABEL]["commit"] == "abc1234"
    assert rows[ZEN4_LABEL]["date"] == section["_run"]["date"] and rows[ZEN4_LABEL]["both"] == [1.06, 2.12]
    zen4_row = rows[ZEN4_LABEL]

    # the first CPU model again: its row is replaced, the other one's kept as it was
    rows = _run_on(monkeypatch, out, part, ZEN3_LABEL, 0.99)["_per_cpu"]
    assert rows[ZEN3_LABEL]["speed ratio"] == 0.99 and rows[ZEN4_LABEL] == zen4_row and len(rows) == 2

    # a quick run adds no row and keeps the others
    section = _run_on(monkeypatch, out, part, "Intel(R) Xeon(R) Platinum 8481C (Sapphire Rapids)", 5.0, quick=True)
    assert section["speed"] == 5.0 and set(section["_per_cpu"]) == {ZEN3_LABEL, ZEN4_LABEL}

    md = (out / "bench.md").read_text(encoding="utf-8")
    assert "Measured on each CPU model" in md
    assert "| CPU model | date | commit | speed ratio | both |" in md
    assert f"| {ZEN3_LABEL} | {rows[ZEN3_LABEL]['date'][:10]} | abc1234 | 0.99 | 0.99 / 1.98 |" in md
    assert f"| {ZEN4_LABEL} | " in md and "Sapphire Rapids" not in md.split("<sub>")[0]


def test_a_quick_run_alone_has_no_rows_and_its_footer_names_the_cpu_model(tmp_path, monkeypatch):
    part, out = _fake_part(monkeypatch), tmp_path / "out"
    assert "_per_cpu" not in _run_on(monkeypatch, out, part, ZEN3_LABEL, 1.0, quick=True)
    md = (out / "bench.md").read_text(encoding="utf-8")
    assert "Measured on each CPU model" not in md and f"{ZEN3_LABEL}, 2 cores" in md


def _old_results(out, **sections):
    out.mkdir()
    (out / "bench.md").write_text(BENCH_TITLE + "\n", encoding="utf-8")
    (out / "bench.json").write_text(json.dumps(sections), encoding="utf-8")


def _old_section(speed, quick=False, **machine):
    return {"speed": speed, "_run": {"quick": quick, "seconds": 1.0, "date": "2026-11-23T15:08:30",
                                     "command": "numformer bench fake", "machine": {"cpu": "AMD EPYC", **machine}}}


def test_a_section_written_before_rows_keeps_its_run_as_a_row(tmp_path, monkeypatch):
    part, out = _fake_part(monkeypatch), tmp_path / "out"
    _old_results(out, fake=_old_section(0.5, blas_core="Haswell"), other={"x": 1})
    rows = _run_on(monkeypatch, out, part, ZEN4_LABEL, 1.06)["_per_cpu"]
    old = "AMD EPYC (model not recorded; OpenBLAS Haswell kernels)"
    assert set(rows) == {old, ZEN4_LABEL}
    assert rows[old] == {"date": "2026-11-23T15:08:30", "command": "numformer bench fake", "speed ratio": 0.5,
                         "both": [0.5, 1.0]}
    md = (out / "bench.md").read_text(encoding="utf-8")
    assert f"| {old} | 2026-11-23 |  | 0.50 | 0.50 / 1.00 |" in md
    assert "other" in json.loads((out / "bench.json").read_text(encoding="utf-8"))


def test_an_old_quick_section_gives_no_row(tmp_path, monkeypatch):
    part, out = _fake_part(monkeypatch), tmp_path / "out"
    _old_results(out, fake=_old_section(0.5, quick=True))
    assert set(_run_on(monkeypatch, out, part, ZEN4_LABEL, 1.06)["_per_cpu"]) == {ZEN4_LABEL}


def test_an_old_section_cpu_row_cannot_read_is_left_out(tmp_path, monkeypatch):
    """A section of an older layout: its row is left out (and said so), the run's own figures are written."""
    part, out = _fake_part(monkeypatch), tmp_path / "out"
    old = _old_section(0.5)
    del old["speed"]
    _old_results(out, fake=old)
    said = []
    monkeypatch.setattr(runner, "machine_info", lambda: {"cpu": "AMD EPYC", "cpu_label": ZEN3_LABEL})
    part.speeds.append(0.9)
    runner.run_parts(["fake"], out_dir=out, log=said.append)
    assert set(json.loads((out / "bench.json").read_text(encoding="utf-8"))["fake"]["_per_cpu"]) == {ZEN3_LABEL}
    assert any("cpu_row() failed" in line and "KeyError" in line for line in said)


def test_a_part_without_cpu_row_keeps_no_rows_and_records_the_commit(tmp_path, monkeypatch):
    part, out = _fake_part(monkeypatch, with_row=False), tmp_path / "out"
    section = _run_on(monkeypatch, out, part, ZEN3_LABEL, 1.0)
    assert "_per_cpu" not in section and section["_run"]["commit"] == "abc1234"


PARTS_WITH_ROWS = {"throughput": {"nanogpt ratio", "nanogpt per-core ratio", "nanogpt MFU numformer / PyTorch"},
                   "generate": {"cache speedup at L=256"},
                   "quantize": {"int8 speedup batch 1", "int8 speedup batch 8", "val loss increase (8 bits)"},
                   "hf_generate": {"ratio batch 1", "ratio batch 8"}, "llama_generate": {"ratio batch 1"},
                   "qwen3_generate": {"ratio batch 1", "ratio batch 8"},
                   "gemma3_generate": {"ratio batch 1", "ratio batch 8"}}


@pytest.mark.parametrize("name", list(PARTS_WITH_ROWS))
def test_the_committed_sections_give_rows(name):
    """The sections of results/bench.json give their headline figures as numbers; one written before rows were
    kept gives its row when the next full run of its part replaces it, one written since keeps its rows."""
    section = runner.load_results(ROOT / "results").get(name)
    if section is None:
        pytest.skip(f"results/bench.json has no section {name}")
    row = runner.load_part(name).cpu_row(section)
    assert PARTS_WITH_ROWS[name] <= set(row)
    assert all(isinstance(v, (int, float)) or (isinstance(v, list) and len(v) == 2) for v in row.values()
               if v is not None)
    rows = runner.keep_cpu_rows(runner.load_part(name), section, {"_run": {"quick": True}}, log=None)
    kept = section.get(runner.CPU_ROWS_KEY)         # a section written since rows are kept: its rows, unchanged
    assert rows == kept if kept else list(rows) == [provenance.cpu_label(section["_run"]["machine"])]


def test_a_run_under_a_forced_kernel_family_keeps_its_own_row_and_says_so(tmp_path, monkeypatch):
    """The same CPU with OPENBLAS_CORETYPE set is another row: neither run's figures replace the other's."""
    part, out = _fake_part(monkeypatch), tmp_path / "out"
    _run_on(monkeypatch, out, part, ZEN4_LABEL, 1.5)
    forced = provenance.label_with_coretype(ZEN4_LABEL, "Haswell")
    said = []
    monkeypatch.setattr(runner, "machine_info", lambda: {"cpu": "AMD EPYC", "cpu_label": forced,
                                                         "blas_coretype": "Haswell"})
    part.speeds.append(1.1)
    runner.run_parts(["fake"], out_dir=out, log=said.append)
    rows = json.loads((out / "bench.json").read_text(encoding="utf-8"))["fake"]["_per_cpu"]
    assert {label: row["speed ratio"] for label, row in rows.items()} == {ZEN4_LABEL: 1.5, forced: 1.1}
    assert any(line.startswith("note: OPENBLAS_CORETYPE=Haswell in the environment") for line in said)
    assert f"| {forced} |" in (out / "bench.md").read_text(encoding="utf-8")
