"""Muon: Newton-Schulz and the update rule against torch reimplementations, the AdamW part against
torch.optim.AdamW, which parameters Muon takes, training and exact resume through the trainer, config errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import tiny_copy_toml
from numformer.config import TRAIN_DEFAULTS
from numformer.models.gpt import GPT
from numformer.nn import Parameter
from numformer import _runtime
from numformer.optim import AdamW, Muon, hidden_matrices, newton_schulz, newton_schulz_many
from numformer.train import Trainer, resolve_config
from numformer.run_files import CHECKPOINT
from numformer.train.trainer import make_optimizer

torch = pytest.importorskip("torch")

A, B, C = 3.4445, -4.7750, 2.0315


# -- torch references, written from the equations ------------------------------------------------------------
def torch_newton_schulz(g, steps=5):
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / (torch.linalg.matrix_norm(x) + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = A * x + (B * gram + C * gram @ gram) @ x
    return x.T if g.shape[0] > g.shape[1] else x


def torch_muon(w0, grads, lrs, momentum, nesterov, weight_decay, ns_steps=5):
    """The weights after Muon steps with the given gradients and learning rates."""
    w = torch.tensor(w0)
    buf = torch.zeros_like(w)
    scale = max(1.0, w.shape[0] / w.shape[1]) ** 0.5
    for g, lr in zip(grads, lrs):
        g = torch.tensor(g)
        buf = momentum * buf + g
        u = g + momentum * buf if nesterov else buf
        o = torch_newton_schulz(u, ns_steps)
        w = w * (1.0 - lr * weight_decay)
        w = w - (lr * scale) * o
    return w.numpy()


# -- Newton-Schulz -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(8, 8), (6, 20), (20, 6), (48, 16)])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_newton_schulz_matches_torch(shape, dtype, tol):
    g = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    ours = newton_schulz(g)
    theirs = torch_newton_schulz(torch.tensor(g)).numpy()
    assert ours.dtype == dtype and ours.shape == shape
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=tol)


def singular_values(x):
    return np.linalg.svd(x.astype(np.float64), compute_uv=False)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_newton_schulz_singular_values_in_the_quintic_band(dtype):
    """φ(σ) = aσ + bσ³ + cσ⁵ five times takes every σ ≥ 0.003 (of ‖G‖_F = 1) into [0.68, 1.21]; the singular
    vectors are G's, and a zero singular value stays zero."""
    rng = np.random.default_rng(1)
    for shape in [(16, 16), (8, 40), (40, 8), (64, 64)]:
        g = rng.standard_normal(shape).astype(dtype)
        s = singular_values(newton_schulz(g))
        assert 0.68 <= s.min() and s.max() <= 1.21, (shape, s)
        u, _, vt = np.linalg.svd(g.astype(np.float64), full_matrices=False)     # the same singular vectors
        core = u.T @ newton_schulz(g).astype(np.float64) @ vt.T
        np.testing.assert_allclose(core, np.diag(np.diag(core)), atol=1e-4 if dtype == np.float32 else 1e-10)
    low_rank = (rng.standard_normal((24, 3)) @ rng.standard_normal((3, 12))).astype(dtype)
    s = singular_values(newton_schulz(low_rank))
    assert np.all((0.68 <= s[:3]) & (s[:3] <= 1.21)) and np.all(s[3:] < 1e-3), s
    scaled = newton_schulz(1e4 * low_rank)          # the result does not depend on G's scale
    np.testing.assert_allclose(scaled, newton_schulz(low_rank), atol=1e-4 if dtype == np.float32 else 1e-9)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("own_blas", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_newton_schulz_many_is_the_reference_on_each_matrix(threads, own_blas, dtype, monkeypatch):
    """The matrices shared among threads give, bit for bit, what newton_schulz gives each on one thread."""
    monkeypatch.setitem(_runtime._threads, "n", threads)
    monkeypatch.setitem(_runtime._state, "own_blas", own_blas)
    rng = np.random.default_rng(4)
    shapes = [(16, 16), (8, 40), (40, 8), (24, 24), (12, 30), (30, 12), (16, 16)]
    matrices = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
    steps = [5, 5, 3, 5, 1, 5, 2]
    got = newton_schulz_many(matrices, steps)
    with _runtime.single_threaded():
        expected = [newton_schulz(g, s) for g, s in zip(matrices, steps)]
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.dtype == dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert newton_schulz_many([], []) == []


def test_newton_schulz_rejects_a_vector():
    with pytest.raises(ValueError, match="orthogonalizes a matrix"):
        newton_schulz(np.ones(4))


# -- the update rule ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(6, 10), (12, 4)])
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_muon_steps_match_torch(shape, nesterov, weight_decay):
    rng = np.random.default_rng(2)
    w0 = rng.standard_normal(shape)
    grads = [rng.standard_normal(shape) for _ in range(5)]
    factors = [0.2, 0.6, 1.0, 0.7, 0.3]                  # a schedule's lr over the base lr
    p = Parameter(w0.copy())
    opt = Muon([p], lr=0.05, momentum=0.9, nesterov=nesterov, weight_decay=weight_decay)
    for g, f in zip(grads, factors):
        opt.set_lr(f)                                    # without an AdamW, lr_ratio = 1: lr = f
        p.grad = g.copy()
        opt.step()
        opt.zero_grad()
    expected = torch_muon(w0, grads, factors, 0.9, nesterov, weight_decay)
    np.testing.assert_allclose(p.data, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
def test_muon_steps_on_several_matrices_match_torch(threads, monkeypatch):
    """One step orthogonalizes all matrices together (newton_schulz_many): each ends where its own torch
    reference does, whatever the number of threads; a matrix without a gradient is left alone."""
    monkeypatch.setitem(_runtime._threads, "n", threads)
    rng = np.random.default_rng(5)
    shapes = [(6, 10), (12, 4), (8, 8), (5, 9)]
    w0 = [rng.standard_normal(shape) for shape in shapes]
    grads = [[rng.standard_normal(shape) for shape in shapes] for _ in range(4)]
    factors = [0.3, 1.0, 0.8, 0.2]
    params = [Parameter(w.copy()) for w in w0]
    opt = Muon([{"params": params[:2]}, {"params": params[2:3], "nesterov": False, "weight_decay": 0.1},
                {"params": params[3:], "ns_steps": 3}], lr=0.05, momentum=0.9)
    for step_grads, f in zip(grads, factors):
        opt.set_lr(f)
        for p, g in zip(params[:3], step_grads):
            p.grad = g.copy()
        opt.step()
        opt.zero_grad()
    options = [(True, 0.0, 5), (True, 0.0, 5), (False, 0.1, 5)]
    for i, (nesterov, weight_decay, ns_steps) in enumerate(options):
        expected = torch_muon(w0[i], [g[i] for g in grads], factors, 0.9, nesterov, weight_decay, ns_steps)
        np.testing.assert_allclose(params[i].data, expected, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(params[3].data, w0[3])
    assert id(params[3]) not in opt.state


def test_muon_with_adamw_matches_torch_and_scales_both_learning_rates():
    rng = np.random.default_rng(3)
    w0, e0, b0 = rng.standard_normal((8, 5)), rng.standard_normal((11, 8)), rng.standard_normal(8)
    steps = [(rng.standard_normal(w0.shape), rng.standard_normal(e0.shape), rng.standard_normal(b0.shape))
             for _ in range(5)]
    factors = [0.25, 0.5, 1.0, 0.8, 0.4]
    w, e, b = Parameter(w0.copy()), Parameter(e0.copy()), Parameter(b0.copy())
    adamw = AdamW([{"params": [e], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}],
                  lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    opt = Muon([w], adamw, lr=0.02, momentum=0.95, weight_decay=0.1)
    assert opt.params == [w, e, b]

    te, tb = torch.tensor(e0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    tadamw = torch.optim.AdamW([{"params": [te], "weight_decay": 0.1}, {"params": [tb], "weight_decay": 0.0}],
                               lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    for (gw, ge, gb), f in zip(steps, factors):
        opt.set_lr(3e-3 * f)
        w.grad, e.grad, b.grad = gw.copy(), ge.copy(), gb.copy()
        opt.step()
        opt.zero_grad()
        assert w.grad is None and e.grad is None and b.grad is None
        for group in tadamw.param_groups:
            group["lr"] = 3e-3 * f
        te.grad, tb.grad = torch.tensor(ge), torch.tensor(gb)
        tadamw.step()
    np.testing.assert_allclose(e.data, te.detach().numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(b.data, tb.detach().numpy(), rtol=0, atol=1e-12)
    expected = torch_muon(w0, [s[0] for s in steps], [0.02 * f for f in factors], 0.95, True, 0.1)
    np.testing.assert_allclose(w.data, expected, rtol=0, atol=1e-12)


def test_state_dict_round_trip_is_exact():
    rng = np.random.default_rng(4)
    grads = [(rng.standard_normal((6, 4)), rng.standard_normal(4)) for _ in range(6)]

    def make():
        w, b = Parameter(np.linspace(-1, 1, 24).reshape(6, 4)), Parameter(np.ones(4))
        return w, b, Muon([w], AdamW([b], lr=1e-2), lr=0.05)

    def run(w, b, opt, part):
        for gw, gb in part:
            opt.set_lr(5e-3)
            w.grad, b.grad = gw.copy(), gb.copy()
            opt.step()

    w, b, opt = make()
    run(w, b, opt, grads)
    w2, b2, opt2 = make()
    run(w2, b2, opt2, grads[:3])
    arrays, meta = opt2.state_dict()
    assert set(arrays) == {"0.momentum_buffer", "adamw.0.exp_avg", "adamw.0.exp_avg_sq"}
    meta = json.loads(json.dumps(meta))                 # what a checkpoint stores
    w3, b3, opt3 = make()
    w3.data[...], b3.data[...] = w2.data, b2.data
    opt3.load_state_dict({k: v.copy() for k, v in arrays.items()}, meta)
    run(w3, b3, opt3, grads[3:])
    assert np.array_equal(w3.data, w.data) and np.array_equal(b3.data, b.data)
    with pytest.raises(ValueError, match="for Muon with an AdamW for the other parameters, this Muon has none"):
        Muon([Parameter(np.ones((2, 2)))], lr=0.05).load_state_dict(arrays, meta)


def test_muon_rejects_bad_options():
    m = Parameter(np.ones((3, 3)))
    with pytest.raises(ValueError, match="Muon updates 2-D weight matrices.*shape \\(3,\\)"):
        Muon([Parameter(np.ones(3))])
    with pytest.raises(ValueError, match="momentum must be in \\[0, 1\\)"):
        Muon([m], momentum=1.0)
    with pytest.raises(ValueError, match="ns_steps must be an integer >= 1"):
        Muon([m], ns_steps=0)
    with pytest.raises(ValueError, match="both Muon and its AdamW"):
        Muon([m], AdamW([m]))
    with pytest.raises(ValueError, match="AdamW learning rate must be > 0"):
        Muon([m], AdamW([Parameter(np.ones(3))], lr=0.0))


# -- which parameters Muon takes ---------------------------------------------------------------------------
def split(model):
    train = {**TRAIN_DEFAULTS, "optimizer": "muon", "weight_decay": 0.1}
    opt = make_optimizer(model, train)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in opt.param_groups for p in g["params"]]
    adamw = [[names[id(p)] for p in g["params"]] for g in opt.adamw.param_groups]
    return opt, muon, adamw


def test_llama_style_split():
    model = GPT(30, 8, n_layers=2, n_heads=2, d_model=16, positional="rope", activation="swiglu", norm="rms",
                tie_weights=True, bias=False)
    opt, muon, adamw = split(model)
    assert muon == [f"blocks.{i}.{n}.weight" for i in (0, 1)
                    for n in ("self_attn.qkv_proj", "self_attn.out_proj", "ff.gate_proj", "ff.up_proj", "ff.down_proj")]
    assert adamw == [["tok_emb.weight"],                # decayed; the tied head is the same array
                     ["blocks.0.norm1.weight", "blocks.0.norm2.weight", "blocks.1.norm1.weight",
                      "blocks.1.norm2.weight", "norm_f.weight"]]
    assert [g["weight_decay"] for g in opt.adamw.param_groups] == [0.1, 0.0]
    assert opt.param_groups[0]["weight_decay"] == 0.1
    assert opt.param_groups[0]["lr_ratio"] == pytest.approx(0.02 / 1e-3)


def test_gpt2_style_split_untied_head():
    model = GPT(30, 8, n_layers=1, n_heads=2, d_model=16, tie_weights=False)
    _, muon, adamw = split(model)
    assert muon == ["blocks.0.self_attn.qkv_proj.weight", "blocks.0.self_attn.out_proj.weight",
                    "blocks.0.ff.linear1.weight", "blocks.0.ff.linear2.weight"]
    decayed, kept = adamw
    assert decayed == ["tok_emb.weight", "pos_emb.weight", "lm_head.weight"]
    assert all(n.endswith("bias") or "norm" in n for n in kept) and "blocks.0.ff.linear1.bias" in kept


# -- training through the trainer ---------------------------------------------------------------------------
def text_config(corpus, **train):
    return {
        "model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16, "positional": "rope",
                  "activation": "swiglu", "norm": "rms", "bias": False},
        "data": {"task": "text", "path": str(corpus), "block_size": 16},
        "train": {"max_steps": 30, "batch_size": 8, "lr": 3e-3, "optimizer": "muon", "dtype": "float64",
                  "schedule": "cosine", "warmup_steps": 3, "weight_decay": 0.01, "eval_every": 10,
                  "checkpoint_every": 10, "log_every": 5, "processes": 1, "seed": 5, **train},
    }


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 60)
    return path


def test_training_with_muon_lowers_the_loss(tmp_path, corpus):
    run = tmp_path / "run"
    Trainer(text_config(corpus, lr=1e-2), run, quiet=True).train()
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in lines if "train_loss" in r]
    evals = [r["val_loss"] for r in lines if "val_loss" in r]
    assert losses[-1] < 0.75 * losses[0] and evals[-1] < 0.9 * evals[0]


def test_muon_keeps_muon_lr_when_every_trainable_parameter_is_a_hidden_matrix(tmp_path, corpus):
    """With LoRA only the adapters' matrices train: Muon alone, no AdamW, still at muon_lr (times the
    schedule's factor), not at [train] lr."""
    config = text_config(corpus, lr=1e-3, muon_lr=0.02, schedule="constant", warmup_steps=0)
    config["lora"] = {"r": 2}
    trainer = Trainer(config, tmp_path / "run", quiet=True)
    try:
        assert trainer.optimizer.adamw is None
        trainer.train(stop_after=1)
        assert [g["lr"] for g in trainer.optimizer.param_groups] == [pytest.approx(0.02)]
    finally:
        trainer.close()
    with pytest.raises(ValueError, match="Muon's base_lr must be > 0"):
        Muon([Parameter(np.ones((2, 2)))], base_lr=0.0)


def test_muon_resume_is_bit_exact(tmp_path, corpus):
    from safetensors.numpy import load_file
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    Trainer(text_config(corpus), straight, quiet=True).train()
    Trainer(text_config(corpus), resumed, quiet=True).train(stop_after=13)
    Trainer(None, resumed, resume=True, quiet=True).train()
    a, b = load_file(str(straight / CHECKPOINT)), load_file(str(resumed / CHECKPOINT))
    assert set(a) == set(b) and any(k.endswith("momentum_buffer") for k in a)
    for k in a:
        assert np.array_equal(a[k], b[k]), k            # weights, momentum buffers and AdamW moments


# -- config errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key,value,expected", [
    ("muon_momentum", 1.0, "[train] muon_momentum = 1.0 is out of range; muon_momentum must be in [0, 1)"),
    ("muon_lr", 0, "[train] muon_lr = 0.0 is out of range"),
    ("muon_ns_steps", 0, "[train] muon_ns_steps = 0 is out of range"),
    ("muon_nesterov", "yes", "[train] muon_nesterov = 'yes' should be a boolean"),
    ("lr", 0.0, "[train] optimizer = \"muon\" needs lr > 0"),
])
def test_config_errors(key, value, expected):
    cfg = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
           "data": {"task": "copy", "length": 4}, "train": {"optimizer": "muon", key: value}}
    with pytest.raises(ValueError) as err:
        resolve_config(cfg, build_task=False)
    assert expected in str(err.value)


def test_cli_config_error_is_one_line(tmp_path, cli_error):
    cfg = tmp_path / "c.toml"
    cfg.write_text(tiny_copy_toml(optimizer="muon", muon_momentum=1.5, max_steps=2, processes=1))
    line = cli_error("train", cfg, "--out", tmp_path / "r")
    assert "muon_momentum = 1.5 is out of range" in line
    assert not (tmp_path / "r").exists()


# -- the documentation's example ------------------------------------------------------------------------------
def test_the_training_reference_example_runs(capsys):
    """docs/reference/training.md's Muon section: its Python block runs and prints what it says."""
    from pathlib import Path
    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "training.md").read_text(encoding="utf-8")
    section = page.split("## Muon\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "training.md (Muon)", "exec"), {})
    assert capsys.readouterr().out == "10 matrices for Muon\n"
