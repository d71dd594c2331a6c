"""Fuzzing every file numformer reads from a run folder or a Hugging Face folder (issue 27): config.json,
tokenizer.json, metrics.jsonl, the safetensors files' header and metadata; the experiment records (issue 36);
and the newer surfaces' files: a LoRA run's, a DPO run's reference_logps.safetensors, chat data, token files
(meta.json, tokenizer.json), the exercises' hint memory. Each example damages one file of a
fresh copy (a random truncation, random bytes, a JSON value replaced by one of another type, deep nesting)
and runs the command that reads it; the only allowed outcomes are success or exit code 2 with exactly one
line ``numformer COMMAND: error: ...`` and no traceback.

The number of examples per file is modest so that the default suite stays fast; raise it with
NUMFORMER_FUZZ_EXAMPLES=500 for a longer search."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from numformer.cli import main  # noqa: E402

from conftest import FakeClock, hf_bpe_folder, set_commit, tiny_copy_toml, tiny_text_toml  # noqa: E402

EXAMPLES = int(os.environ.get("NUMFORMER_FUZZ_EXAMPLES", "12"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
DEEP = "\u2063deep\u2063"


def cli(*args):
    """(exit code, stderr) of ``numformer ARGS`` run in this process."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([str(a) for a in args])
    return rc, err.getvalue()


def assert_success_or_one_line(rc, err, command):
    lines = [line for line in err.splitlines() if line.startswith(f"numformer {command}: error: ")]
    assert rc == 0 or (rc == 2 and len(lines) == 1 and "Traceback" not in err), f"exit code {rc}, stderr:\n{err}"


# -- damage --------------------------------------------------------------------------------------------------
def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:20]):
            yield from _paths(v, prefix + (i,))


def _replace(obj, path, value):
    if not path:
        return value
    obj[path[0]] = _replace(obj[path[0]], path[1:], value)
    return obj


def damage_json(draw, text):
    """A JSON text with one value replaced by a random one (another type, maybe) or by deep nesting."""
    obj = json.loads(text)
    paths = list(_paths(obj))
    path = paths[draw(st.integers(0, len(paths) - 1))]
    deep = draw(st.booleans())
    value = DEEP if deep else draw(JSON_VALUES)
    out = json.dumps(_replace(obj, path, value))
    if deep:
        depth = draw(st.sampled_from([90, 200, 5000, 100_000]))
        out = out.replace(json.dumps(DEEP), "[" * depth + "]" * depth)
    return out


def damage_bytes(draw, data):
    """Bytes truncated, overwritten with random bytes somewhere, or prefixed with deep nesting."""
    kind = draw(st.sampled_from(["truncate", "overwrite", "deep"]))
    if kind == "truncate":
        return data[:draw(st.integers(0, max(len(data) - 1, 0)))]
    if kind == "overwrite":
        junk = draw(st.binary(min_size=1, max_size=24))
        at = draw(st.integers(0, len(data)))
        return data[:at] + junk + data[at + len(junk):]
    return b"[" * draw(st.sampled_from([200, 100_000])) + data


def damage_text_file(draw, data, jsonl=False):
    """A JSON file (or one line of a JSON-lines file) damaged as bytes or as JSON."""
    if draw(st.booleans()):
        return damage_bytes(draw, data)
    lines = data.decode().splitlines()
    if jsonl:                                           # metrics.jsonl: one line
        i = draw(st.integers(0, len(lines) - 1))
        lines[i] = damage_json(draw, lines[i])
        return ("\n".join(lines) + "\n").encode()
    return damage_json(draw, data.decode()).encode()


def damage_safetensors(draw, data):
    """A safetensors file with its header (tensor entries or metadata) or a metadata value damaged."""
    n = struct.unpack("<Q", data[:8])[0]
    header, body = data[8:8 + n].decode(), data[8 + n:]
    kind = draw(st.sampled_from(["bytes", "header", "metadata"]))
    if kind == "bytes":
        return damage_bytes(draw, data)
    obj = json.loads(header)
    meta = obj.get("__metadata__", {})
    json_keys = [k for k, v in meta.items() if v[:1] in "{["]
    if kind == "metadata" and json_keys:
        key = json_keys[draw(st.integers(0, len(json_keys) - 1))]
        meta[key] = damage_json(draw, meta[key]) if draw(st.booleans()) else \
            damage_bytes(draw, meta[key].encode()).decode("utf-8", "replace")
        new = json.dumps(obj)
    else:
        new = damage_json(draw, header)
    new = new.encode()
    return struct.pack("<Q", len(new)) + new + body


# -- the folders ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A trained character-level text run, a copy-task run, a Hugging Face folder with a byte-level BPE
    tokenizer.json, and the run folder import-hf makes of it (its tokenizer.json holds the BPE as hf_json)."""
    from numformer.data.text import read_corpus

    root = tmp_path_factory.mktemp("fuzz")
    text = read_corpus("")[:4000]
    (root / "small.txt").write_text(text)
    (root / "text.toml").write_text(tiny_text_toml(root / "small.txt", checkpoint_every=2))
    (root / "copy.toml").write_text(tiny_copy_toml(max_steps=4, batch_size=4, eval_every=2, checkpoint_every=2,
                                                   processes=1))
    for name in ("text", "copy"):
        assert cli("train", root / f"{name}.toml", "--out", root / name, "--quiet")[0] == 0
    hf = root / "hf"
    hf_bpe_folder(hf, text)
    assert cli("generate", hf, "--prompt", "The", "--max-new-tokens", "2")[0] == 0
    assert cli("import-hf", hf, "--out", root / "imported", "--data", root / "small.txt")[0] == 0
    newer_surfaces(root)
    return root


def newer_surfaces(root):
    """The runs and files of the newer surfaces: a LoRA run fine-tuned from the text run, a DPO run with its
    reference_logps.safetensors, a chat data file with its config, a folder of token files, an exercises
    folder with its hint memory."""
    import tomllib

    from numformer.train import Trainer
    from test_dpo import dpo_config, sft_base

    text = tomllib.loads((root / "text.toml").read_text())
    Trainer({"model": {"init_from": str(root / "text")}, "data": text["data"], "train": text["train"],
             "lora": {"r": 2, "alpha": 4.0, "target_modules": ["c_attn"]}}, root / "lora", quiet=True).train()
    dpo = root / "dpo_data"
    dpo.mkdir()
    Trainer(dpo_config(dpo, sft_base(dpo), max_steps=2, checkpoint_every=2), root / "dpo", quiet=True).train()
    chat = root / "chat"
    chat.mkdir()
    assert cli("train", root / "text.toml", "--out", root / "chat_base", "--quiet",
               "--set", "data.block_size=64")[0] == 0
    turns = [[{"role": "user", "content": "hi " * (i + 1)}, {"role": "assistant", "content": "dull."}]
             for i in range(6)]
    (chat / "chat.jsonl").write_text("".join(json.dumps({"messages": m}) + "\n" for m in turns))
    (chat / "chat.toml").write_text(f'[model]\ninit_from = "{root / "chat_base"}"\n[data]\ntask = "chat"\n'
                                    f'block_size = 64\nval_size = 2\n[train]\nmax_steps = 1\nbatch_size = 2\n'
                                    f'processes = 1\n')
    tokens = root / "tokens"
    (tokens / "src").mkdir(parents=True)
    (tokens / "src" / "t.txt").write_text((root / "small.txt").read_text())
    (tokens / "bpe.toml").write_text(tiny_text_toml(tokens / "src" / "t.txt").replace(
        'block_size = 16', 'block_size = 16\ntokenizer = "bpe"\nvocab_size = 300'))
    assert cli("train", tokens / "bpe.toml", "--out", root / "bpe_run", "--quiet")[0] == 0
    from numformer.data.token_files import token_cache

    cached = next(p.parent for p in token_cache().parent.rglob("meta.json")
                  if str(tokens / "src" / "t.txt") in p.read_text(encoding="utf-8"))
    for name in ("train.bin", "val.bin", "tokenizer.json", "meta.json"):
        shutil.copy(cached / name, tokens / name)
    exercises = root / "exercises"
    exercises.mkdir()
    assert cli("exercises", "hint", "rope", "--dir", exercises)[0] == 0


# (folder, file, command): the command that reads the file
TARGETS = [
    ("text", "config.json", ["eval", "{dir}"]),
    ("text", "tokenizer.json", ["generate", "{dir}", "--prompt", "The", "--max-new-tokens", "2"]),
    ("text", "tokenizer.json", ["train", "--out", "{dir}", "--resume", "--quiet"]),
    ("text", "metrics.jsonl", ["train", "--out", "{dir}", "--resume", "--quiet", "--set", "train.max_steps=5"]),
    ("text", "model.safetensors", ["eval", "{dir}"]),
    ("text", "checkpoint.safetensors", ["train", "--out", "{dir}", "--resume", "--quiet", "--set",
                                        "train.max_steps=5"]),
    ("copy", "config.json", ["train", "--out", "{dir}", "--resume", "--quiet"]),
    ("copy", "tokenizer.json", ["generate", "{dir}", "--prompt", "1 2 <sep>", "--max-new-tokens", "2"]),
    ("imported", "tokenizer.json", ["generate", "{dir}", "--prompt", "The", "--max-new-tokens", "2"]),
    ("imported", "config.json", ["eval", "{dir}"]),
    ("hf", "config.json", ["generate", "{dir}", "--prompt", "The", "--max-new-tokens", "2"]),
    ("hf", "tokenizer.json", ["import-hf", "{dir}", "--out", "{tmp}/imported"]),
    ("hf", "model.safetensors", ["generate", "{dir}", "--prompt", "The", "--max-new-tokens", "2"]),
    # the newer surfaces (issue 36): LoRA and DPO runs, chat data, token files, the exercises' hint memory
    ("lora", "config.json", ["eval", "{dir}"]),
    ("lora", "checkpoint.safetensors", ["train", "--out", "{dir}", "--resume", "--quiet", "--set",
                                        "train.max_steps=5"]),
    ("dpo", "reference_logps.safetensors", ["train", "--out", "{dir}", "--resume", "--quiet", "--set",
                                            "train.max_steps=3"]),
    ("chat", "chat.jsonl", ["train", "{dir}/chat.toml", "--out", "{dir}/out", "--quiet", "--set",
                            "data.path=\"{dir}/chat.jsonl\""]),
    ("tokens", "meta.json", ["train", "{dir}/bpe.toml", "--out", "{dir}/out", "--quiet", "--set",
                             "data.tokens_dir=\"{dir}\"", "--set", "data.path=\"\""]),
    ("tokens", "tokenizer.json", ["train", "{dir}/bpe.toml", "--out", "{dir}/out", "--quiet", "--set",
                                  "data.tokens_dir=\"{dir}\"", "--set", "data.path=\"\""]),
    ("exercises", ".numformer-exercises.json", ["exercises", "hint", "rope", "--dir", "{dir}"]),
]


@pytest.mark.parametrize("folder, name, command", TARGETS, ids=[f"{f}/{n}:{c[0]}" for f, n, c in TARGETS])
def test_a_damaged_file_gives_success_or_one_line(folders, folder, name, command):
    source = folders / folder
    original = (source / name).read_bytes()
    with tempfile.TemporaryDirectory() as tmp:          # undamaged, the command succeeds: it reads the file
        shutil.copytree(source, Path(tmp) / folder)
        rc, err = cli(*[a.format(dir=Path(tmp) / folder, tmp=tmp) for a in command])
        assert rc == 0, err

    @FUZZ
    @given(st.data())
    def run(data):
        if name.endswith(".safetensors"):
            damaged = damage_safetensors(data.draw, original)
        else:
            damaged = damage_text_file(data.draw, original, jsonl=name.endswith(".jsonl"))
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / folder
            shutil.copytree(source, d)
            (d / name).write_bytes(damaged)
            args = [a.format(dir=d, tmp=tmp) for a in command]
            rc, err = cli(*args)
            assert_success_or_one_line(rc, err, args[0])
            outside = sorted(p.name for p in Path(tmp).iterdir())
            assert outside in ([folder], [folder, "imported"]), outside      # nothing written elsewhere

    run()


# -- the experiment records (issue 36) ------------------------------------------------------------------------
ABLATION, PROFILE = "shakespeare_speedrun_ablation", "shakespeare_speedrun_profile"
FAKE_PROFILE = {"families": {"linear (matrix products)": 0.002, "other": 0.001}, "step_seconds": 0.003,
                "processes": 2, "batch_share": 4, "tokens_per_step": 128, "flops_per_s": 1e8}


@pytest.fixture
def experiment_patches(monkeypatch):
    patch_experiments(monkeypatch)


def patch_experiments(monkeypatch):
    """A fixed git commit, a fake clock for budgeted runs and an instant profile: each example runs the command
    that reads the damaged record, not a measurement."""
    import time

    import numformer.experiments.speedrun as speedrun

    set_commit(monkeypatch, "abc1234")
    monkeypatch.setattr(time, "perf_counter", FakeClock(tick=0.05))
    monkeypatch.setattr(speedrun, "matmul_peak", lambda **kw: 1e9)
    monkeypatch.setattr(speedrun, "profile_training_step", lambda *a, **kw: dict(FAKE_PROFILE))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """exp/: a quick speedrun, a quick ablation over one seed (its runs reused by the next ablation), a PyTorch
    anchor record and a profile record, all at commit abc1234."""
    root = tmp_path_factory.mktemp("records")
    exp = root / "exp"
    with pytest.MonkeyPatch.context() as mp:
        patch_experiments(mp)
        for name, args in (("shakespeare_speedrun", ()), (ABLATION, ("--seeds", "1")), (PROFILE, ())):
            rc, err = cli("reproduce", name, "--quick", "--runs", exp / "runs", "--results", exp / "results",
                          "--quiet", *args)
            assert rc == 0, err
    run = {"model_class": "TorchGPT", "steps": 10, "tokens_per_s": 100.0, "wall_seconds": 1.0, "val_loss": 2.0,
           "torch": "2.13.0", "threads": 2}
    (exp / "results" / "shakespeare_speedrun_torch.json").write_text(json.dumps({
        "name": "shakespeare_speedrun_torch", "description": "", "command": "numformer reproduce "
        "shakespeare_speedrun_torch", "commit": "abc1234", "date": "2026-01-01", "figures": {}, "targets": {},
        "budget_minutes": 0.25, "seed": 0, "runs": {"recipe": run, "nanogpt_cpu": run}}))
    return root


REPRODUCE = ["--quick", "--runs", "{dir}/runs", "--results", "{dir}/results", "--quiet"]
RECORD_TARGETS = [
    (f"runs/{ABLATION}/*/seed_0/summary.json", ["reproduce", ABLATION, "--seeds", "1", *REPRODUCE]),
    (f"runs/{ABLATION}/*/seed_0/config.json", ["reproduce", ABLATION, "--seeds", "1", *REPRODUCE]),
    ("results/shakespeare_speedrun.json", ["reproduce", PROFILE, *REPRODUCE]),
    (f"results/{ABLATION}.json", ["reproduce", PROFILE, *REPRODUCE]),
    ("results/shakespeare_speedrun_torch.json", ["reproduce", PROFILE, *REPRODUCE]),
    (f"results/{PROFILE}.json", ["reproduce", PROFILE, *REPRODUCE]),
]


@pytest.mark.parametrize("pattern, command", RECORD_TARGETS, ids=[p.split("/")[-1] if p.startswith("results")
                                                                   else "ablation " + p.split("/")[-1]
                                                                   for p, _ in RECORD_TARGETS])
def test_a_damaged_experiment_record_gives_success_or_one_line(records, experiment_patches, pattern, command):
    source = records / "exp"
    name = str(sorted(source.glob(pattern))[0].relative_to(source))
    original = (source / name).read_bytes()

    @FUZZ
    @given(st.data())
    def run(data):
        damaged = damage_text_file(data.draw, original)
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / "exp"
            shutil.copytree(source, d)
            (d / name).write_bytes(damaged)
            args = [a.format(dir=d) for a in command]
            rc, err = cli(*args)
            assert_success_or_one_line(rc, err, args[0])
            assert "Traceback" not in err
            assert sorted(p.name for p in Path(tmp).iterdir()) == ["exp"]

    run()


def test_a_damaged_seed_study_or_benchmark_record_is_text_or_one_error(tmp_path):
    """The seed study's page section and bench.json's reader, called directly: a page's text (saying the record
    is damaged) or one ValueError naming the file, for any damage."""
    from numformer.bench.runner import load_results
    from numformer.experiments.language_model import seeds_markdown

    seeds = {"command": "numformer reproduce shakespeare_char --seeds 2", "date": "2026-01-01", "commit": "abc",
             "val_loss": {"mean": 1.9, "sd": 0.01, "n": 2}, "last_val_loss": {"mean": 1.9, "sd": 0.01, "n": 2},
             "seeds": [{"seed": 0, "step": 10, "val_loss": 1.9, "last_val_loss": 1.9}] * 2,
             "nanogpt_estimate": {"seed": 0, "whole_val_loss": 1.9, "draws": 4, "batches": 20, "batch_size": 12,
                                  "block_size": 64, "mean": 1.9, "sd": 0.02, "min": 1.8, "max": 2.0,
                                  "at_or_below_1.88": 0.5}}
    bench = {"depth": {"rows": [1, 2], "_meta": {"quick": True}}}
    originals = {"seeds.json": json.dumps(seeds).encode(), "bench.json": json.dumps(bench).encode()}

    @FUZZ
    @given(st.data())
    def run(data):
        for name, original in originals.items():
            folder = tmp_path / "d"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            path = folder / ("shakespeare_char_seeds.json" if name == "seeds.json" else name)
            path.write_bytes(damage_text_file(data.draw, original))
            with contextlib.redirect_stderr(io.StringIO()):
                if name == "seeds.json":
                    assert isinstance(seeds_markdown(path, "shakespeare_char"), str)
                    continue
                try:
                    load_results(folder)
                except ValueError as e:
                    assert str(path) in str(e) and "\n" not in str(e)

    run()
