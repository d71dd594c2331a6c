"""The op-family benchmark: PyTorch's profiler events read into numformer's families, and a tiny run end to end."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from numformer.bench import op_families, runner, throughput  # noqa: E402

TINY = {
    "gpt": {"title": "tiny GPT", "kind": "gpt", "batch": 3, "seq": 8,
            "model": {"vocab_size": 11, "block_size": 8, "n_layers": 2, "n_heads": 2, "d_model": 16, "dropout": 0.0,
                      "bias": False}},
    "clf": {"title": "tiny classifier", "kind": "classifier", "batch": 4, "seq": 10,
            "model": {"vocab_size": 30, "n_classes": 3, "max_len": 10, "d_model": 8, "n_heads": 1, "n_layers": 1,
                      "dropout": 0.0, "pooling": "mean", "pad_id": 0}},
}


def test_torch_ops_fall_into_numformer_families():
    family = op_families.torch_family
    assert family("aten::mm") == family("aten::addmm") == "linear (matrix products)"
    assert family("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention"
    assert family("aten::gelu_backward") == family("aten::silu") == "activation"
    assert family("aten::native_layer_norm_backward") == "norm"
    assert family("aten::_log_softmax") == family("aten::nll_loss_backward") == "cross-entropy"
    assert family("aten::embedding_dense_backward") == "embedding"
    assert family("Optimizer.step#AdamW.step") == family("aten::_foreach_mul_") == "optimizer"
    assert family("aten::copy_") == family("autograd::engine::evaluate_function: MmBackward0") == "other"


def test_numformer_split_times_the_optimizer_and_leaves_it_as_it_was():
    cfg = TINY["gpt"]
    model, _ = throughput.build_models(cfg)
    trainer = throughput.NumformerTrainer(model, cfg)
    families, step_ms = op_families.numformer_families(trainer, throughput.make_batches(cfg), steps=2)
    assert families["optimizer"] > 0 and families["attention"] > 0 and families["norm"] > 0
    assert sum(families.values()) == pytest.approx(step_ms)
    assert "step" not in vars(trainer.opt)                  # the timer is gone: the class's step again


def test_torch_split_puts_the_optimizer_ops_under_optimizer(capfd):
    cfg = TINY["gpt"]
    _, ref = throughput.build_models(cfg)
    batches = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in throughput.make_batches(cfg)]
    families, step_ms = op_families.torch_families(throughput.torch_trainer(ref, cfg), batches, steps=2)
    assert families["linear (matrix products)"] > 0 and families["optimizer"] > 0 and families["norm"] > 0
    assert families["attention"] > 0 and families["cross-entropy"] > 0 and step_ms > 0
    assert capfd.readouterr().err == ""                     # the profiler's native log lines stay off stderr


def test_tiny_run_writes_json_and_markdown(tmp_path, monkeypatch, native_blas_afterwards):
    original = op_families.run
    monkeypatch.setattr(op_families, "run", lambda quick=False: original(quick, TINY, {"gpt": 2, "clf": 2}))
    done = runner.run_parts(["op_families"], quick=True, out_dir=tmp_path, log=lambda *a: None)
    result = done["op_families"]
    for name in TINY:
        r = result["configs"][name]
        assert r["numformer"]["linear (matrix products)"] > 0 and r["torch"]["linear (matrix products)"] > 0
        assert sum(r["numformer"].values()) == pytest.approx(r["numformer_step_ms"])
        assert r["numformer_non_product_ms"] == op_families.non_product_ms(r["numformer"]) > 0
        assert r["torch_products_ms"] == r["torch"]["linear (matrix products)"]
    rates = result["elementwise_ns_per_element"]
    assert set(rates) == {"multiply (x · x)", "exp", "tanh", "int8 → float32"}
    assert all(r["numpy"] > 0 and r["torch"] > 0 for r in rates.values())
    assert json.loads((tmp_path / "bench.json").read_text())["op_families"]["_run"]["quick"] is True
    md = (tmp_path / "bench.md").read_text()
    assert "## op_families" in md and "| linear (matrix products) |" in md and "int8 → float32" in md
    row = op_families.cpu_row(result)
    assert set(row) == {"gpt non-product ops ms", "clf non-product ops ms", "exp ns per element"}
