"""The scaling benchmark parts (attention, checkpointing, generate, depth) run and return their figures.

Tiny sizes here; never an assertion on time. The quick modes through the runner are marked slow.
"""
from __future__ import annotations

import json
import os

import pytest

from numformer.bench import _measure, attention, checkpointing, depth, generate

TINY_GPT = {"vocab_size": 11, "block_size": 16, "n_layers": 2, "n_heads": 2, "d_model": 8, "dropout": 0.1}


def _markdown(module, result, tmp_path):
    fig_dir = tmp_path / "figures"
    fig_dir.mkdir()
    text = module.markdown(json.loads(json.dumps(result)), fig_dir)
    assert text.startswith("## ")
    pngs = list(fig_dir.glob("*.png"))
    assert pngs and all(p.stat().st_size > 0 for p in pngs)
    assert all(f"figures/{p.name}" in text for p in pngs)
    return text


def test_fit_exponent_and_linear_fit():
    xs = [128, 256, 512, 1024]
    assert _measure.fit_exponent(xs, [x ** 2 for x in xs]) == pytest.approx(2.0)
    assert _measure.fit_exponent(xs, [3 * x for x in xs]) == pytest.approx(1.0)
    assert _measure.fit_exponent([1], [1]) is None
    fit = attention.linear_fit(xs, [1000 + 5 * x for x in xs])
    assert fit["bytes_per_token"] == pytest.approx(5) and fit["intercept_bytes"] == pytest.approx(1000)


def test_traced_peak_sees_numpy_arrays():
    import numpy as np

    _, peak, held = _measure.traced_peak(lambda: np.ones(1_000_000).sum())
    assert peak >= 8_000_000 and held < 1_000_000


def test_attention_part(tmp_path):
    r = attention.run(lengths=[32, 64], plain_budget=attention.plain_estimate(32))   # plain: 32 only
    for k in ("plain", "flash"):
        assert {"T", "seconds", "peak_bytes", "max_rss_bytes", "time_exponent", "memory_exponent"} <= set(r[k])
    assert r["flash"]["T"] == [32, 64] and r["plain"]["T"] == [32] and r["plain"]["skipped_T"] == [64]
    assert r["target"]["measured"] is False
    assert "memory_linear_fit" in r["flash"]
    text = _markdown(attention, r, tmp_path)
    assert "skipped" in text


def test_checkpointing_part(tmp_path):
    r = checkpointing.run(config=TINY_GPT, batch=2)
    for k in ("plain", "checkpointing"):
        assert r[k]["activation_bytes"] > 0 and r[k]["peak_bytes"] >= r[k]["activation_bytes"]
    assert r["checkpointing"]["activation_bytes"] < r["plain"]["activation_bytes"]
    assert r["same_loss_and_gradients"]
    _markdown(checkpointing, r, tmp_path)


def test_generate_part(tmp_path):
    r = generate.run(config={k: v for k, v in TINY_GPT.items() if k != "dropout"}, lengths=[2, 8, 64], repeats=2,
                     generation_tokens=5)
    assert r["lengths"] == [2, 8]                       # longer than the context: dropped
    assert len(r["seconds_with_cache"]) == len(r["seconds_without_cache"]) == 2
    assert r["generation"]["same_tokens"]
    _markdown(generate, r, tmp_path)


def test_depth_part(tmp_path):
    r = depth.run(depths=[1, 3], model_cfg={"block_size": 8, "n_heads": 2, "d_model": 8, "dropout": 0.0},
                  train_cfg={**depth.QUICK_TRAIN, "steps": 3, "batch": 2, "chars": 2000})
    assert [(x["layers"], x["norm"]) for x in r["runs"]] == [(1, "post-LN"), (1, "pre-LN"), (3, "post-LN"),
                                                             (3, "pre-LN")]
    for x in r["runs"]:
        assert len(x["grad_norms_init"]) == len(x["grad_norms_trained"]) == x["layers"]
        assert x["finite"]
    _markdown(depth, r, tmp_path)
    assert "post-LN and pre-LN, 1 to 3 layers" in depth.markdown(r, tmp_path)    # the depths measured


@pytest.mark.slow
@pytest.mark.parametrize("part", ["attention", "checkpointing", "generate", "depth"])
def test_quick_mode_through_the_runner(tmp_path, part):
    from numformer.bench.runner import run_parts

    done = run_parts([part], quick=True, out_dir=tmp_path, log=lambda *a: None)
    assert part in json.loads((tmp_path / "bench.json").read_text())
    assert f"## {part}" in (tmp_path / "bench.md").read_text()
    assert done[part]["_run"]["quick"]


def test_child_peak_rss_does_not_include_the_parent():
    """A fresh child must report its own high-water RSS, not the parent's size at fork (Linux ru_maxrss)."""
    import subprocess
    import sys

    import numpy as np

    from numformer.bench._measure import max_rss_bytes

    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs Linux /proc")
    held = np.ones(400 * 2**20 // 8)  # 400 MiB resident in this process
    held[::512] = 2.0
    code = "from numformer.bench._measure import max_rss_bytes; print(max_rss_bytes())"
    child = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert max_rss_bytes() > 400 * 2**20
    assert child < 300 * 2**20, f"child reports {child / 2**20:.0f} MiB: the parent's RSS leaked into it"
    del held


def test_blas_kernels_runs_each_family_in_its_own_process(tmp_path):
    """Each OPENBLAS_CORETYPE takes effect in its child (the kernels it reports), families the CPU lacks are left
    out, and the table compares each with OpenBLAS's own choice."""
    from numformer import _runtime
    from numformer.bench import blas_kernels
    from numformer.bench.runner import run_parts

    if _runtime.openblas_core() is None:
        pytest.skip("needs NumPy's OpenBLAS")
    run_parts(["blas_kernels"], quick=True, out_dir=tmp_path, log=lambda *a: None)
    rows = json.loads((tmp_path / "bench.json").read_text())["blas_kernels"]["rows"]
    flags = blas_kernels.cpu_flags()
    assert set(rows) == {f for f, flag in blas_kernels.FAMILIES.items() if flag is None or flag in flags}
    assert rows["default"]["core"] == _runtime.openblas_core()
    if "Haswell" in rows:
        assert rows["Haswell"]["core"] == "Haswell"
    if "SkylakeX" in rows:
        assert rows["SkylakeX"]["core"] == "SkylakeX"
    md = (tmp_path / "bench.md").read_text()
    assert "## blas_kernels" in md and "| default |" in md and "1.00x" in md


@pytest.mark.parametrize("load, says", [
    ({"start": 1.6, "end": 1.8}, "counts the benchmark's own threads, and stayed within this machine's 2 cores"),
    ({"start": 1.2, "end": 3.1}, "above this machine's 2 cores, other processes shared them"),
    (4.0, "at the end of the run: above this machine's 2 cores"),
])
def test_the_load_average_is_read_against_the_cores(load, says):
    """A generation bench's load note: within the cores the benchmark's own threads explain it; above, other
    work shared the cores (a load of 1.8 from the benchmark's own two threads is not noise from elsewhere)."""
    from numformer.bench.hf_generate import _load_text

    text = _load_text({"load_average": load, "_run": {"machine": {"cores": 2}}})
    assert says in text
    assert _load_text({"load_average": load}).endswith("(on a shared machine these figures are noisy).")
    assert _load_text({}) == ""
