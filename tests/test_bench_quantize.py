"""numformer bench quantize runs at tiny sizes and writes its section; the runner passes it its options.
Never an assertion on time (the speeds of a tiny model say nothing)."""
from __future__ import annotations

import json

import pytest

from numformer import _runtime
from numformer._results import BENCH_TITLE
from numformer.bench import quantize as bench
from numformer.bench.runner import run_parts
from numformer.train import Trainer

TINY_SHAPE = {"vocab_size": 64, "d_model": 32, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "d_ff": 48,
              "head_dim": 8}


@pytest.fixture(scope="module")
def speedrun_like_run(tmp_path_factory):
    """A run folder of the speedrun's config, shrunk to 2 steps of a 1-layer model on 3,000 characters."""
    from numformer.config import load_config
    from numformer.data.text import read_corpus
    from numformer.experiments.runner import find_config

    root = tmp_path_factory.mktemp("qrun")
    (root / "small.txt").write_text(read_corpus("")[:3000])
    overrides = ["train.budget_minutes=0", "train.max_steps=2", "train.eval_every=2", "train.processes=1",
                 "train.batch_size=2", "model.n_layers=1", "data.block_size=16", f"data.path={root / 'small.txt'}"]
    Trainer(load_config(find_config("shakespeare_speedrun")), root / "run", overrides=overrides, quiet=True).train()
    return root / "run"


def test_quantize_part_figures_and_markdown(speedrun_like_run, tmp_path, monkeypatch):
    monkeypatch.setitem(_runtime._threads, "n", 2)                     # "processes" is measured with 2 threads
    result = bench.run(quick=True, run_dir=speedrun_like_run, group_size=16, shape=TINY_SHAPE,
                       sweep=[(8, None), (4, 8)], log=lambda *a: None)
    speed, acc = result["speed"], result["accuracy"]
    assert [(r["mode"], r["batch"]) for r in speed["rows"]] == [(m, b) for m in ("one_thread", "numformer",
                                                                                 "processes") for b in (1, 8)]
    assert bench.kernel._product_pool is None   # the workers are gone
    assert [r["batch"] for r in speed["best"]] == [1, 8]
    assert result["speedup_b1"] == max(r["int8_tokens_per_s"] for r in speed["rows"] if r["batch"] == 1) / max(
        r["float32_tokens_per_s"] for r in speed["rows"] if r["batch"] == 1)
    assert all(r["cpu_speedup"] > 0 and r["int8_bound_tokens_per_s"] > r["float32_bound_tokens_per_s"]
               for r in speed["rows"])
    assert speed["bytes_per_token"]["int8"] < speed["bytes_per_token"]["float32"]
    assert speed["shape"]["head_dim_used"] == 8 and speed["layers_quantized"] > 0
    ns = speed["kernel"]["ns_per_weight"]
    assert {"float32", "int8", "conversion", "product"} <= set(ns) and all(v > 0 for v in ns.values())
    assert f"int8 block {bench.kernel.BLOCK_BYTES >> 10} KiB" in ns                  # restored after the sizes
    assert [(r["bits"], r["group_size"]) for r in acc["rows"]] == [(8, 16), (8, None), (4, 8)]
    assert result["val_loss_increase"] == acc["rows"][0]["increase"] and not acc["trained_here"]
    assert 0 <= speed["logits_error"]["max_relative"] < 0.05 and 0 < result["logits_error"] < 0.05
    for key in ("speedup_b1", "speedup_b8", "speedup_b1_one_thread_cpu"):
        assert result[key] > 0
    fig_dir = tmp_path / "figures"
    fig_dir.mkdir()
    text = bench.markdown(json.loads(json.dumps(result)), fig_dir)
    assert text.startswith("## quantize") and "figures/quantize_group_size.png" in text
    assert (fig_dir / "quantize_group_size.png").stat().st_size > 10_000
    assert "| 4 | 8 |" in text and "`speedup_b1`" in text and "| one_thread | 8 |" in text
    assert "Where the time goes" in text and "conversion alone" in text


def test_the_runner_passes_options_only_to_the_parts_that_take_them(tmp_path):
    with pytest.raises(ValueError, match="--run-dir is not an option of generate"):
        run_parts(["generate"], quick=True, out_dir=tmp_path, options={"run_dir": "x"})


def test_a_group_size_without_quantize_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="--group-size 32 is the int8 weights' group size: give it with --quantize"):
        run_parts(["generate"], quick=True, out_dir=tmp_path, options={"group_size": 32})
    assert not (tmp_path / "bench.json").exists()


def test_bench_command_takes_the_quantize_options(monkeypatch, run_cli, tmp_path):
    """`numformer bench quantize --run-dir R --group-size G` reaches run() with those values."""
    seen = {}
    monkeypatch.setattr(bench, "run", lambda quick=False, run_dir=None, group_size=None, **kw:
                        seen.update(quick=quick, run_dir=run_dir, group_size=group_size) or {})
    monkeypatch.setattr(bench, "markdown", lambda result, fig_dir: "## quantize\n")
    rc, _, _ = run_cli("bench", "quantize", "--quick", "--run-dir", "runs/x", "--group-size", "64", "--out", tmp_path)
    assert rc == 0 and json.loads((tmp_path / "bench.json").read_text())["quantize"]["_run"]["command"] == \
        "numformer bench quantize --quick --run-dir runs/x --group-size 64"
    assert seen == {"quick": True, "run_dir": "runs/x", "group_size": 64}


@pytest.mark.slow
def test_quick_mode_through_the_runner_trains_its_model(tmp_path, monkeypatch):
    """`numformer bench quantize --quick` without --run-dir trains the speedrun's model (briefly) in ./runs."""
    monkeypatch.chdir(tmp_path)
    done = run_parts(["quantize"], quick=True, out_dir=tmp_path / "out", log=lambda *a: None)
    assert done["quantize"]["accuracy"]["trained_here"]
    assert (tmp_path / bench.RUN_DIR / "model.safetensors").is_file()
    assert "## quantize" in (tmp_path / "out" / "bench.md").read_text()


def test_bench_generate_quantize_int8_writes_its_own_section(monkeypatch, tmp_path):
    """`numformer bench generate --quantize int8` measures the int8 model and keeps the float32 section."""
    from numformer.bench import generate as bench_generate

    monkeypatch.setattr(bench_generate, "CONFIG", {"vocab_size": 17, "block_size": 16, "n_layers": 1, "n_heads": 2,
                                                   "d_model": 16})
    (tmp_path / "bench.json").write_text(json.dumps({"generate": {"kept": True}}))
    (tmp_path / "bench.md").write_text(BENCH_TITLE + "\n")          # an earlier run's results folder
    done = run_parts(["generate"], quick=True, out_dir=tmp_path, log=lambda *a: None,
                     options={"quantize": "int8", "group_size": 8})
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert list(done) == ["generate_int8"] and saved["generate"] == {"kept": True}
    assert saved["generate_int8"]["quantized"].startswith("int8 (groups of 8): 5 linear layers quantized")
    assert saved["generate_int8"]["_run"]["command"] == "numformer bench generate --quick --quantize int8 --group-size 8"
    assert "## generate_int8" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "figures" / "generate_int8_latency.png").is_file()
    with pytest.raises(ValueError, match="takes int8"):
        bench_generate.run(quick=True, quantize="int4")
