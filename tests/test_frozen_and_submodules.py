"""Frozen parameters (``requires_grad``, torch's name) and modules reached by name (``named_modules``,
``get_submodule``, ``set_submodule``): a frozen parameter gets no gradient, no update and no optimizer state,
and a module put in place of another is the one that runs, forward, backward and in cached generation."""
from __future__ import annotations

import json

import numpy as np
import pytest

from numformer.models import GPT, Transformer
from numformer.nn import Linear, Module
from numformer.optim import AdamW, hidden_matrices, param_groups
from numformer.run_files import load_checkpoint, load_metadata, save_checkpoint


def small(**kw):
    return GPT(17, 12, n_layers=2, n_heads=2, d_model=8, rng=0, dtype=np.float64, **kw)


def step(model, idx, seed=1):
    model.zero_grad()
    out = model(idx)
    model.backward(np.random.default_rng(seed).standard_normal(out.shape))
    return out


IDX = np.random.default_rng(0).integers(0, 17, (2, 6))


# -- frozen parameters ----------------------------------------------------------------------------------
def test_a_frozen_parameter_gets_no_gradient_and_the_others_the_same_ones():
    free, frozen = small(), small()
    frozen.blocks[0].self_attn.qkv_proj.weight.requires_grad = False
    frozen.tok_emb.requires_grad_(False)
    assert not frozen.lm_head.weight.requires_grad                     # tied: the same Parameter
    step(free, IDX), step(frozen, IDX)
    for (name, p), (_, q) in zip(free.named_parameters(), frozen.named_parameters()):
        if q.requires_grad:
            np.testing.assert_array_equal(p.grad, q.grad, err_msg=name)
        else:
            assert q.grad is None, name


def test_a_frozen_parameter_gets_no_adamw_update_and_no_optimizer_state():
    model = small()
    frozen = model.blocks[1].ff.linear1.weight
    frozen.requires_grad = False
    before = frozen.data.copy()
    opt = AdamW(param_groups(model, weight_decay=0.1), lr=0.1)
    assert all(p is not frozen for g in opt.param_groups for p in g["params"])
    for _ in range(3):
        step(model, IDX)
        opt.step()
    np.testing.assert_array_equal(frozen.data, before)
    assert id(frozen) not in opt.state and len(opt.state) == sum(p.requires_grad for p in model.parameters())
    assert frozen not in hidden_matrices(model) and model.blocks[1].ff.linear2.weight in hidden_matrices(model)


def test_requires_grad_freezes_and_unfreezes_a_whole_module():
    model = small()
    assert model.blocks[0].requires_grad_(False) is model.blocks[0]
    assert not any(p.requires_grad for p in model.blocks[0].parameters())
    assert all(p.requires_grad for p in model.blocks[1].parameters())
    step(model, IDX)
    assert all(p.grad is None for p in model.blocks[0].parameters())
    model.requires_grad_(True)
    step(model, IDX)
    assert all(p.grad is not None for p in model.parameters())


def test_the_checkpoint_records_the_frozen_parameters(tmp_path):
    model = small()
    model.blocks[0].requires_grad_(False)
    opt = AdamW(param_groups(model, 0.0), lr=0.1)
    step(model, IDX)
    opt.step()
    save_checkpoint(tmp_path / "c.safetensors", model, opt, {"step": 1})
    frozen = json.loads(load_metadata(tmp_path / "c.safetensors", "checkpoint")["frozen"])
    assert frozen == [n for n, p in model.named_parameters() if not p.requires_grad] and frozen
    same = small()
    same.blocks[0].requires_grad_(False)
    assert load_checkpoint(tmp_path / "c.safetensors", same, AdamW(param_groups(same, 0.0), lr=0.1)) == {"step": 1}
    other = small()
    with pytest.raises(ValueError, match=r"trained with the parameters \['blocks.0.*frozen, but this model freezes "
                                         r"none; freeze the same parameters to resume it"):
        load_checkpoint(tmp_path / "c.safetensors", other, AdamW(param_groups(other, 0.0), lr=0.1))


# -- modules by name ---------------------------------------------------------------------------------------------
class Doubled(Module):
    """A wrapper around a linear layer: twice its output (as a LoRA wrapper or an int8 layer would stand in
    for it); counts its calls."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.calls = {"forward": 0, "backward": 0}

    def forward(self, x):
        self.calls["forward"] += 1
        return 2 * self.inner(x)

    def backward(self, dy):
        self.calls["backward"] += 1
        return self.inner.backward(2 * dy)


def test_get_submodule_reaches_modules_by_their_dotted_names():
    model = small()
    assert model.get_submodule("blocks.1.self_attn.qkv_proj") is model.blocks[1].self_attn.qkv_proj
    assert model.get_submodule("") is model
    names = dict(model.named_modules())
    assert names["blocks.0.ff.linear2"] is model.blocks[0].ff.linear2
    with pytest.raises(AttributeError, match=r"blocks.0.self_attn has no sub-module 'q_proj'"):
        model.get_submodule("blocks.0.self_attn.q_proj")
    with pytest.raises(AttributeError, match="no sub-module 'nope'"):
        model.set_submodule("blocks.0.nope", Linear(2, 2))


@pytest.mark.parametrize("name", ["blocks.0.self_attn.qkv_proj", "blocks.1.self_attn.out_proj", "blocks.0.ff.linear1"])
def test_a_swapped_module_runs_in_forward_and_backward(name):
    """The wrapped model equals a model whose wrapped layer has twice the weights; the wrapped layer's
    gradient is twice that one's, and every other gradient the same."""
    wrapped, doubled = small(), small()
    inner = wrapped.get_submodule(name)
    wrapped.set_submodule(name, Doubled(inner))
    twin = doubled.get_submodule(name)
    twin.weight.data *= 2
    twin.bias.data *= 2
    assert [n for n, _ in wrapped.named_modules()].index(name) < [n for n, _ in wrapped.named_modules()].index(
        "lm_head")                                                       # in its place, not moved to the end
    out_w, out_d = step(wrapped, IDX), step(doubled, IDX)
    np.testing.assert_allclose(out_w, out_d, rtol=1e-12, atol=1e-12)
    assert wrapped.get_submodule(name).calls == {"forward": 1, "backward": 1}
    np.testing.assert_allclose(inner.weight.grad, 2 * twin.weight.grad, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(wrapped.tok_emb.weight.grad, doubled.tok_emb.weight.grad, rtol=1e-10, atol=1e-13)


def test_a_swapped_qkv_projection_runs_in_cached_generation():
    wrapped, doubled = small().eval(), small().eval()
    wrapped.set_submodule("blocks.0.self_attn.qkv_proj", Doubled(wrapped.blocks[0].self_attn.qkv_proj))
    doubled.blocks[0].self_attn.qkv_proj.weight.data *= 2
    doubled.blocks[0].self_attn.qkv_proj.bias.data *= 2
    prompt = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(wrapped.generate(prompt, 5, greedy=True), doubled.generate(prompt, 5, greedy=True))
    assert wrapped.blocks[0].self_attn.qkv_proj.calls["forward"] >= 5          # the cache path called it too


def test_cross_attention_needs_the_projection_that_splits_its_rows():
    model = Transformer(13, 13, d_model=8, n_heads=2, n_layers=1, d_ff=16, rng=0)
    model.set_submodule("decoder.layers.0.cross_attn.qkv_proj",
                        Doubled(model.decoder.layers[0].cross_attn.qkv_proj))
    with pytest.raises(ValueError, match="cross-attention projects the query and the memory with different rows"):
        model(np.array([[1, 2, 3]]), np.array([[1, 2]]))


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="data parallelism forks (Linux only)")
def test_data_parallel_workers_leave_a_frozen_parameter_without_gradient():
    from numformer.train.parallel import DataParallel
    from numformer.train.step import loss_and_backward

    def make():
        model = small()
        model.blocks[0].self_attn.requires_grad_(False)
        return model

    rng = np.random.default_rng(2)
    inputs, targets = {"idx": rng.integers(0, 17, (4, 6))}, rng.integers(0, 17, (4, 6))
    single = make()
    loss_and_backward(single, inputs, targets)
    model = make()
    with DataParallel(model, 2, seed=0) as dp:
        dp.forward_backward(inputs, targets)
    for (name, a), (_, b) in zip(single.named_parameters(), model.named_parameters()):
        if a.requires_grad:
            np.testing.assert_allclose(b.grad, a.grad, rtol=1e-10, atol=1e-13, err_msg=name)
        else:
            assert a.grad is None and b.grad is None, name
