"""What a forward hook wrote, and so which gradients backward cuts: every element it assigned (also an
equal value), as torch's ``act[...] = value``; a returned new array writes everything. Float64 GPTs."""
from __future__ import annotations

import numpy as np
import pytest

from numformer.models import GPT

V = 30


def gpt():
    return GPT(V, 16, n_layers=2, n_heads=2, d_model=8, rng=0, dtype=np.float64, dropout=0.0).eval()


CLEAN = np.array([[1, 2, 3, 4, 5, 6]])
CORRUPTED = np.array([[1, 2, 3, 4, 9, 6]])     # position 0 is the same in both


def embedding_grad_and_fd(model, hook, row=1):
    """(backward's gradient of tok_emb row ``row``, central differences of the patched forward)."""
    R = np.random.default_rng(1).normal(size=(1, CORRUPTED.shape[1], V))
    hooks = [("blocks.1.hook_resid_pre", hook)]
    model.zero_grad()
    model.run_with_hooks(CORRUPTED, fwd_hooks=hooks)
    model.backward(R)
    grad = model.tok_emb.weight.grad[row].copy()
    w, fd, eps = model.tok_emb.weight.data[row], np.zeros(w_len := model.tok_emb.weight.shape[1]), 1e-6
    for j in range(w_len):
        old = w[j]
        w[j] = old + eps
        up = (model.run_with_hooks(CORRUPTED, fwd_hooks=hooks) * R).sum()
        w[j] = old - eps
        down = (model.run_with_hooks(CORRUPTED, fwd_hooks=hooks) * R).sum()
        w[j] = old
        fd[j] = (up - down) / (2 * eps)
    return grad, fd


def source():
    model = gpt()
    return model.run_with_cache(CLEAN)[1]["resid_pre", 1].copy()


def assign(act, hook):
    act[:, 0] = SRC[:, 0]                    # the value act already has there
    return act


def through_a_view(act, hook):
    view = act[:, 0]
    view[...] = SRC[:, 0]


def copy_to(act, hook):
    np.copyto(act[:, 0], SRC[:, 0])


def flat_assign(act, hook):
    width = act.shape[2]
    act.flat[:width] = SRC[:, 0].ravel()     # act is (1, T, d): its first d flat elements are position 0


def put(act, hook):
    act.put(np.arange(act.shape[2]), SRC[:, 0].ravel())


def put_through_numpy(act, hook):
    np.put(act, np.arange(-act.size, -act.size + act.shape[2]), SRC[:, 0].ravel())   # negative indices too


SRC = source()


@pytest.mark.parametrize("hook", [assign, through_a_view, copy_to, flat_assign, put, put_through_numpy])
def test_an_element_written_with_its_own_value_passes_no_gradient(hook):
    grad, fd = embedding_grad_and_fd(gpt(), hook)   # token 1 appears only at position 0
    np.testing.assert_allclose(grad, fd, atol=1e-7)
    assert np.abs(grad).max() > 1e-3                 # other paths (layer 0's later positions) remain


def test_a_returned_new_array_writes_every_element():
    """Even the elements it copied from act: a hook is not differentiated (nn/hooks.py)."""
    def replace(act, hook):
        out = act.copy()
        out[:, 0] = SRC[:, 0]
        return out
    model = gpt()
    logits = model.run_with_hooks(CORRUPTED, fwd_hooks=[("blocks.1.hook_resid_pre", replace)])
    model.zero_grad()
    model.backward(np.ones_like(logits))
    assert all(p.grad is None or not p.grad.any() for n, p in model.named_parameters()
               if n.startswith("blocks.0."))


@pytest.mark.parametrize("returned, said", [(lambda a: a.astype(np.complex128), "complex128"),
                                            (lambda a: "abc", "a str"),
                                            (lambda a: np.array(a, dtype=object), "object")])
def test_a_hook_returning_no_real_array_is_one_clear_error(returned, said):
    model = gpt()
    with pytest.raises(ValueError, match=rf"blocks\.0\.hook_resid_post returned .*{said}.*real-valued"):
        model.run_with_hooks(CLEAN, fwd_hooks=[("blocks.0.hook_resid_post", lambda a, h: returned(a))])


def test_the_cache_holds_plain_arrays():
    _, cache = gpt().run_with_cache(CLEAN)
    assert all(type(v) is np.ndarray for v in cache.values())


def test_short_names_work_in_fwd_hooks_and_names_filter_as_in_the_cache():
    model = gpt()
    _, cache = model.run_with_cache(CLEAN, names_filter=("pattern", 0))
    assert list(cache) == ["blocks.0.attn.hook_pattern"]
    _, cache = model.run_with_cache(CLEAN, names_filter=[("resid_pre", 1), "embed"])
    assert sorted(cache) == ["blocks.1.hook_resid_pre", "hook_embed"]
    seen = []
    model.run_with_hooks(CLEAN, fwd_hooks=[(("pattern", 1), lambda a, h: seen.append(h.name))])
    assert seen == ["blocks.1.attn.hook_pattern"]


@pytest.mark.parametrize("hook", [flat_assign, put, put_through_numpy])
def test_flat_and_put_writes_record_exactly_the_elements_written(hook):
    model = gpt()
    model.run_with_hooks(CORRUPTED, fwd_hooks=[("blocks.1.hook_resid_pre", hook)])
    written = model.blocks[1].hook_resid_pre._written
    expected = np.zeros((1, CORRUPTED.shape[1], 8), bool)
    expected[:, 0] = True
    np.testing.assert_array_equal(written, expected)
    model.clear_cache()
