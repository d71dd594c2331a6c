"""The throughput benchmark: the PyTorch reference computes what numformer computes, and a tiny run works end to end."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from numformer.bench import runner, throughput  # noqa: E402
from numformer.bench.torch_reference import from_numformer  # noqa: E402
from numformer.models import GPT, EncoderClassifier  # noqa: E402

TINY = {
    "gpt": {"title": "tiny GPT", "kind": "gpt",
            "model": {"vocab_size": 11, "block_size": 8, "n_layers": 2, "n_heads": 2, "d_model": 16, "dropout": 0.0,
                      "bias": False},
            "batch": 3, "seq": 8},
    "gpt_bias": {"title": "tiny GPT with biases", "kind": "gpt",
                 "model": {"vocab_size": 11, "block_size": 8, "n_layers": 1, "n_heads": 2, "d_model": 16,
                           "dropout": 0.0, "bias": True},
                 "batch": 2, "seq": 6},
    "clf": {"title": "tiny classifier", "kind": "classifier",
            "model": {"vocab_size": 30, "n_classes": 3, "max_len": 10, "d_model": 8, "n_heads": 1, "n_layers": 1,
                      "dropout": 0.0, "pooling": "mean", "pad_id": 0},
            "batch": 4, "seq": 10},
}


@pytest.mark.parametrize("name", list(TINY))
def test_reference_trains_like_numformer(name):
    """Same weights, same batches: the same losses over a few AdamW steps (so the speed comparison is fair)."""
    cfg = TINY[name]
    model, ref = throughput.build_models(cfg, seed=3)
    nf_step, pt_step = throughput.NumformerTrainer(model, cfg), throughput.torch_trainer(ref, cfg)
    batches = throughput.make_batches(cfg, n=3)
    if cfg["kind"] == "classifier":               # some padding, so that the mask path is compared too
        batches[0][0][1, -3:] = 0
    for x, y in batches + batches:
        a = nf_step(x, y)
        b = pt_step(torch.from_numpy(x), torch.from_numpy(y))
        assert abs(a - b) < 1e-4 * (1 + abs(b)), (a, b)


def test_reference_forward_matches_in_float32():
    rng = np.random.default_rng(0)
    for model in (GPT(13, 9, 2, 2, 16, rng=rng), EncoderClassifier(20, 2, max_len=9, d_model=8, dropout=0.0, rng=rng)):
        ref = from_numformer(model)
        ids = rng.integers(1, 13, (2, 9))
        ids[1, -2:] = 0
        out = model(ids)
        with torch.no_grad():
            tout = ref(torch.from_numpy(ids)).numpy()
        np.testing.assert_allclose(out, tout, atol=1e-5, rtol=1e-4)


def test_flops_count():
    cfg = throughput.CONFIGS["nanogpt"]
    d, T, L, V = 128, 64, 4, 65
    per_token = L * (2 * 12 * d * d + 4 * T * d) + 2 * d * V
    assert throughput.model_flops_per_step(cfg) == pytest.approx(3 * per_token * 12 * T)


def test_tiny_throughput_run_writes_json_and_markdown(tmp_path, monkeypatch, native_blas_afterwards):
    configs = {"gpt": TINY["gpt"], "clf": TINY["clf"]}
    plan = {"gpt": (1, 2, 2), "clf": (1, 2, 2)}
    peaks = []
    monkeypatch.setattr(throughput, "matmul_peak", lambda **kw: peaks.append(kw) or 100e9)     # FLOP/s
    monkeypatch.setattr(throughput, "torch_matmul_peak", lambda n=0, repeats=0: 100.0)
    original = throughput.run
    monkeypatch.setattr(throughput, "run", lambda quick=False: original(quick, configs, plan))
    out = tmp_path / "new" / "bench"                       # --out a folder that does not exist yet
    done = runner.run_parts(["throughput"], quick=True, out_dir=out, log=lambda *a: None)
    result = done["throughput"]
    for name in configs:
        r = result["configs"][name]
        assert r["median_ratio"] > 0 and len(r["ratios"]) == 2
        assert 0 < r["numformer_mfu"] and 0 < r["torch_mfu"]
        assert abs(r["first_loss"]["numformer"] - r["first_loss"]["torch"]) < 1e-4
        assert r["single_core"]["numformer_cpu_ms_per_step"] > 0 and r["single_core"]["ratio"] > 0
    assert [p["threads"] for p in peaks] == [throughput.get_num_threads()] * 2      # every thread, before and after
    assert result["matmul_peak_gflops"] == 100.0
    saved = json.loads((out / "bench.json").read_text())
    assert "throughput" in saved and saved["throughput"]["_run"]["quick"] is True
    md = (out / "bench.md").read_text()
    assert "Training throughput" in md and "figures/throughput.png" in md and "Per-core efficiency" in md
    assert (out / "figures" / "throughput.png").stat().st_size > 0
    # another part's entry is kept when this part is run again
    saved["other_part"] = {"x": 1}
    (out / "bench.json").write_text(json.dumps(saved))
    runner.run_parts(["throughput"], quick=True, out_dir=out, log=lambda *a: None)
    assert "other_part" in json.loads((out / "bench.json").read_text())


def test_unknown_part_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark part"):
        runner.run_parts(["no_such_part"], out_dir=tmp_path)
