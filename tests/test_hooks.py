"""Hook points (numformer.nn.hooks): run_with_cache, run_with_hooks, and backward through a patched forward.

The models are tiny float64 GPTs of every family the GPTConfig describes (GPT-2, Llama with grouped-query
attention, Gemma-like sandwich norms with q/k norm, soft-caps and head_dim, ALiBi with a sliding window,
post-LN, attention-only) and the encoder classifier. Backward under patching is checked against finite
differences of the patched forward (the hooks write constants, so the patched computation is a function of the
parameters that finite differences evaluate exactly).
"""
from __future__ import annotations

import numpy as np
import pytest

from numformer import reference_mode
from numformer.models import GPT, EncoderClassifier
from numformer.nn.hooks import HookPoint

V, T, B = 11, 7, 2
FAMILIES = {
    "gpt2": dict(n_layers=2, n_heads=2, d_model=8),
    "llama_gqa": dict(n_layers=2, n_heads=4, n_kv_heads=2, d_model=8, positional="rope", norm="rms",
                      activation="swiglu", bias=False, tie_weights=False),
    "gemma_like": dict(n_layers=2, n_heads=2, n_kv_heads=1, d_model=8, head_dim=6, positional="rope", norm="rms",
                       activation="geglu", qk_norm=True, norm_placement="sandwich", attn_scale=0.3,
                       attn_logit_softcap=4.0, final_logit_softcap=3.0, scale_embeddings=True, bias=False),
    "alibi_window": dict(n_layers=2, n_heads=2, d_model=8, positional="alibi", sliding_window=3),
    "post_ln": dict(n_layers=2, n_heads=2, d_model=8, norm_first=False, positional="sinusoidal"),
    "attention_only": dict(n_layers=2, n_heads=2, d_model=8, feed_forward=False),
}


def gpt(family, **kw):
    return GPT(V, 16, rng=0, dtype=np.float64, **{**FAMILIES[family], **kw}).eval()


def ids(seed=0, b=B, t=T):
    return np.random.default_rng(seed).integers(0, V, (b, t))


def no_hooks_left(model):
    return all(not p.fwd_hooks and not p.bwd_hooks for p in model.hook_dict.values())


# -- the cache ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_run_with_cache_gives_the_forward_logits_and_hooks_do_not_stay(family):
    model = gpt(family)
    x = ids()
    logits, cache = model.run_with_cache(x)
    np.testing.assert_allclose(logits, model(x), rtol=0, atol=1e-12)
    assert no_hooks_left(model)
    assert set(cache) == set(model.hook_dict)
    order = list(cache)                           # the cache is in the order of the forward pass
    steps = ["hook_embed", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_q", "blocks.0.attn.hook_pattern",
             "blocks.0.attn.hook_z", "blocks.0.hook_attn_out", "blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"]
    assert [order.index(n) for n in steps] == sorted(order.index(n) for n in steps)


@pytest.mark.parametrize("family", FAMILIES)
def test_residual_stream_hook_points_add_up(family):
    model = gpt(family)
    _, c = model.run_with_cache(ids())
    L = model.n_layers
    for layer in range(L - 1):
        np.testing.assert_array_equal(c["resid_post", layer], c["resid_pre", layer + 1])
    if family == "post_ln":                       # the residual hook points hold the normed sums
        assert "blocks.0.hook_resid_mid" in c
        return
    for layer in range(L):
        if family == "attention_only":
            assert f"blocks.{layer}.hook_resid_mid" not in c and f"blocks.{layer}.hook_mlp_out" not in c
            np.testing.assert_allclose(c["resid_pre", layer] + c["attn_out", layer], c["resid_post", layer],
                                       atol=1e-14)
            continue
        np.testing.assert_allclose(c["resid_pre", layer] + c["attn_out", layer], c["resid_mid", layer], atol=1e-14)
        np.testing.assert_allclose(c["resid_mid", layer] + c["mlp_out", layer], c["resid_post", layer], atol=1e-14)
    if model.positional in ("learned", "sinusoidal"):
        np.testing.assert_allclose(c["embed"] + c["pos_embed"], c["resid_pre", 0], atol=1e-14)
    else:
        assert "hook_pos_embed" not in c
        np.testing.assert_allclose(c["embed"], c["resid_pre", 0], atol=1e-14)


@pytest.mark.parametrize("family", FAMILIES)
def test_patterns_are_causal_rows_summing_to_one_with_the_layouts_of_transformerlens(family):
    model = gpt(family)
    _, c = model.run_with_cache(ids())
    block = model.config.layers[0]
    H, Hkv, dh = block.n_heads, block.n_kv_heads, block.head_dim
    for layer in range(model.n_layers):
        p = c["pattern", layer]
        assert p.shape == (B, H, T, T)
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-12)
        assert np.all(np.triu(p, k=1) == 0)
        assert c["attn_scores", layer].shape == (B, H, T, T)
        assert c["q", layer].shape == (B, T, H, dh) and c["z", layer].shape == (B, T, H, dh)
        assert c["k", layer].shape == c["v", layer].shape == (B, T, Hkv, dh)       # the key/value heads
        if family == "alibi_window":
            assert np.all(np.tril(p, k=-block.sliding_window) == 0)
    assert ("blocks.0.attn.hook_rot_q" in c) == (model.positional == "rope")


def test_the_cache_of_an_attention_layer_recomputes_its_output():
    """z = pattern · v per head, attn_out = z W_Oᵀ + b (eval mode, no dropout): the cached arrays are the ones
    the forward pass used."""
    model = gpt("gpt2")
    _, c = model.run_with_cache(ids())
    attn = model.blocks[1].self_attn
    z = np.einsum("bhqk,bkhd->bqhd", c["pattern", 1], c["v", 1])
    np.testing.assert_allclose(z, c["z", 1], atol=1e-13)
    out = z.reshape(B, T, -1) @ attn.out_proj.weight.data.T + attn.out_proj.bias.data
    np.testing.assert_allclose(out, c["attn_out", 1], atol=1e-13)


def test_names_filter_and_short_names():
    model = gpt("gpt2")
    _, c = model.run_with_cache(ids(), names_filter=lambda n: n.endswith("hook_pattern"))
    assert list(c) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    _, c = model.run_with_cache(ids(), names_filter="ln_final.hook_normalized")
    assert list(c) == ["ln_final.hook_normalized"]
    with pytest.raises(KeyError, match="no activation 'blocks.0.attn.hook_q'"):
        c["q", 0]


def test_unknown_hook_name_and_a_replacement_of_the_wrong_shape_are_one_clear_error():
    model = gpt("gpt2")
    with pytest.raises(ValueError, match="no hook point 'blocks.0.hook_resid_pr'; did you mean "
                                         "blocks.0.hook_resid_pre"):
        model.run_with_hooks(ids(), fwd_hooks=[("blocks.0.hook_resid_pr", lambda a, h: a)])
    with pytest.raises(ValueError, match=r"the hook on blocks.0.hook_attn_out returned an array of shape \(3,\)"):
        model.run_with_hooks(ids(), fwd_hooks=[("blocks.0.hook_attn_out", lambda a, h: np.zeros(3))])
    assert no_hooks_left(model)                   # removed although the call failed


# -- patching ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_an_identity_hook_changes_nothing(family):
    model = gpt(family)
    x = ids()
    base = model(x)
    every = [(lambda n: True, lambda a, h: a), (lambda n: True, lambda a, h: None)]
    # a hook on the pattern runs the reference's arithmetic (the same values, up to the fused kernel's rounding)
    np.testing.assert_allclose(model.run_with_hooks(x, fwd_hooks=every), base, rtol=0, atol=1e-13)
    with reference_mode():
        np.testing.assert_array_equal(model.run_with_hooks(x, fwd_hooks=every), model(x))
    assert no_hooks_left(model)
    assert all(p._written is None for p in model.hook_dict.values())


@pytest.mark.parametrize("family", ["gpt2", "llama_gqa", "gemma_like"])
def test_zeroing_mlp_out_equals_putting_resid_mid_in_place_of_resid_post(family):
    model = gpt(family)
    x = ids()
    _, c = model.run_with_cache(x)
    zeroed = model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_mlp_out", lambda a, h: np.zeros_like(a))])
    replaced = model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_resid_post", lambda a, h: c["resid_mid", 0])])
    np.testing.assert_allclose(zeroed, replaced, atol=1e-13)
    assert np.abs(zeroed - model(x)).max() > 1e-6


def test_a_hook_may_change_the_array_it_is_given_in_place():
    """TransformerLens's idiom act[:, pos] = ...; the model's own arrays are not touched."""
    model = gpt("gpt2")
    x = ids()

    def zero_position_3(act, hook):
        act[:, 3] = 0.0

    patched = model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_resid_pre", zero_position_3)])
    _, c = model.run_with_cache(x)
    expected = model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_resid_pre", lambda a, h: np.where(
        np.arange(T)[None, :, None] == 3, 0.0, c["resid_pre", 1]))])
    np.testing.assert_allclose(patched, expected, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(patched[:, :3], model(x)[:, :3])     # causal: earlier positions unchanged


def test_hooks_in_cached_generation_see_the_new_positions():
    model = gpt("llama_gqa")
    shapes = []
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", lambda a, h: shapes.append(a.shape))]):
        model.generate(ids(b=1, t=3), 2, greedy=True)
    assert shapes == [(1, 4, 3, 3), (1, 4, 1, 4)]
    assert no_hooks_left(model)


# -- backward under patching ----------------------------------------------------------------------------------
def patched_loss(model, x, weights, hooks):
    logits = model.run_with_hooks(x, fwd_hooks=hooks)
    return float(np.sum(logits * weights)), logits


def check_patched_gradients(model, hooks, x, n_checks=40, seed=0, eps=1e-6):
    """model.backward after run_with_hooks against central differences of the patched loss, on entries of
    every parameter."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(x.shape[0], x.shape[1], V))
    model.zero_grad()
    patched_loss(model, x, weights, hooks)
    assert no_hooks_left(model)                   # removed at the end of the call ...
    model.backward(weights)                       # ... and backward is still the patched computation's
    params = list(model.named_parameters())
    worst = 0.0
    for name, p in params:
        grad = np.zeros_like(p.data) if p.grad is None else p.grad
        for _ in range(max(1, n_checks // len(params))):
            i = tuple(rng.integers(0, s) for s in p.shape)
            old = p.data[i]
            p.data[i] = old + eps
            up, _ = patched_loss(model, x, weights, hooks)
            p.data[i] = old - eps
            down, _ = patched_loss(model, x, weights, hooks)
            p.data[i] = old
            numeric = (up - down) / (2 * eps)
            worst = max(worst, abs(numeric - grad[i]) / max(1.0, abs(numeric)))
            assert abs(numeric - grad[i]) <= 1e-6 * max(1.0, abs(numeric)), (name, i, numeric, grad[i])
    return worst


def constant_like(seed):
    def fn(act, hook):
        return np.random.default_rng(seed).normal(size=act.shape)
    return fn


def write_at(index, value):
    def fn(act, hook):
        act[index] = value(act[index]) if callable(value) else value
        return act
    return fn


def valid_pattern(act, hook):
    """Head 0's pattern replaced by uniform attention over the past (a constant pattern)."""
    n = act.shape[-1]
    act[:, 0] = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    return act


# mean ablation with the mean of other text (a constant; a mean of the patched batch itself would be a function
# of the activation, which a hook is not differentiated as: see nn/hooks.py)
MEAN_Z = gpt("alibi_window").run_with_cache(ids(seed=9, b=4))[1]["z", 0].mean(axis=(0, 1), keepdims=True)

PATCHES = {
    "resid_post whole": ("gpt2", [("blocks.0.hook_resid_post", constant_like(1))]),
    "resid_mid at a position": ("gpt2", [("blocks.1.hook_resid_mid", write_at((slice(None), 2), 0.5))]),
    "pattern of one head": ("gpt2", [("blocks.1.attn.hook_pattern", valid_pattern)]),
    "scores of a head": ("gemma_like", [("blocks.0.attn.hook_attn_scores",
                                         write_at((slice(None), 1, 4, 2), 1.5))]),
    "q zeroed for a head": ("llama_gqa", [("blocks.0.attn.hook_q", write_at((slice(None), slice(None), 1), 0.0))]),
    "v of a key/value head": ("llama_gqa", [("blocks.1.attn.hook_v", write_at((slice(None), slice(None), 0), 0.3))]),
    "rotated k": ("gemma_like", [("blocks.1.attn.hook_rot_k", write_at((0, slice(2, 4)), 0.0))]),
    "z mean-ablated": ("alibi_window", [("blocks.0.attn.hook_z", lambda a, h: np.broadcast_to(
        MEAN_Z, a.shape).copy())]),
    "mlp neurons": ("gpt2", [("blocks.0.mlp.hook_post", write_at((Ellipsis, slice(0, 5)), 0.0))]),
    "gated mlp input": ("llama_gqa", [("blocks.0.mlp.hook_pre_linear", write_at((Ellipsis, 3), 1.0))]),
    "embeddings": ("post_ln", [("hook_embed", write_at((0, 1), 0.2)), ("hook_pos_embed", constant_like(2))]),
    "final norm at a position": ("gemma_like", [("ln_final.hook_normalized", write_at((1, 5), 0.0))]),
    "attention-only attn_out": ("attention_only", [("blocks.0.hook_attn_out", write_at((slice(None), 4), 0.0))]),
    "two hooks on one point": ("gpt2", [("blocks.0.hook_attn_out", write_at((0, 1), 0.0)),
                                        ("blocks.0.hook_attn_out", write_at((1, 2), 0.0))]),
}


@pytest.mark.parametrize("patch", PATCHES)
def test_backward_through_a_patched_forward_matches_finite_differences(patch):
    family, hooks = PATCHES[patch]
    model = gpt(family)
    x = ids()
    assert np.abs(model.run_with_hooks(x, fwd_hooks=hooks) - model(x)).max() > 1e-6   # the patch changes things
    check_patched_gradients(model, hooks, x)


def test_a_hook_computing_from_its_activation_is_not_differentiated_through():
    """act * 2 changes every element: they count as constants (the documented rule), so nothing upstream of the
    hook point gets a gradient through it."""
    model = gpt("gpt2")
    logits = model.run_with_hooks(ids(), fwd_hooks=[("blocks.1.hook_resid_pre", lambda a, h: a * 2)])
    model.zero_grad()
    model.backward(np.ones_like(logits))
    assert not model.blocks[0].self_attn.qkv_proj.weight.grad.any()


def test_a_whole_replaced_residual_cuts_every_gradient_to_what_produced_it():
    model = gpt("gpt2")
    model.zero_grad()
    x = ids()
    logits = model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_resid_pre", constant_like(3))])
    model.backward(np.ones_like(logits))
    assert all(p.grad is None or not p.grad.any() for n, p in model.named_parameters()
               if n.startswith("blocks.0.") or n == "pos_emb.weight")
    assert model.blocks[1].self_attn.qkv_proj.weight.grad.any()


def test_gradient_checkpointing_gives_the_patched_gradients_too():
    hooks = [("blocks.0.hook_resid_mid", write_at((slice(None), 2), 0.5))]
    grads = []
    for checkpointing in (False, True):
        model = gpt("gpt2", gradient_checkpointing=checkpointing)
        logits = model.run_with_hooks(ids(), fwd_hooks=hooks)
        model.backward(np.ones_like(logits))
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name in grads[0]:
        np.testing.assert_allclose(grads[1][name], grads[0][name], atol=1e-13, err_msg=name)


@pytest.mark.parametrize("name", ["blocks.1.hook_resid_pre", "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_k",
                                  "hook_embed", "blocks.0.mlp.hook_pre"])
def test_a_backward_hook_receives_the_gradient_of_the_activation(name):
    """dL/d(activation) at an element, from a backward hook, against a finite difference of an added ε."""
    model = gpt("llama_gqa" if name.endswith("hook_k") else "gpt2")
    x = ids()
    weights = np.random.default_rng(4).normal(size=(B, T, V))
    seen = {}
    with model.hooks(bwd_hooks=[(name, lambda g, h: seen.setdefault(h.name, g))]):
        model(x)
        model.backward(weights)
    assert no_hooks_left(model)
    grad = seen[name]
    _, c = model.run_with_cache(x, names_filter=name)
    assert grad.shape == c[name].shape
    for index in [tuple(np.random.default_rng(s).integers(0, n) for n in grad.shape) for s in range(3)]:
        def loss(delta):
            logits = model.run_with_hooks(x, fwd_hooks=[(name, write_at(index, lambda v: v + delta))])
            return float(np.sum(logits * weights))
        numeric = (loss(1e-6) - loss(-1e-6)) / 2e-6
        assert abs(numeric - grad[index]) <= 1e-6 * max(1.0, abs(numeric)), (index, numeric, grad[index])


def parameter_grads(model, run, weights):
    """{name: gradient} of sum(logits * weights) after ``run()`` (a forward returning the logits, or None to
    use the forward already run) and one backward."""
    model.zero_grad()
    run()
    model.backward(weights)
    grads = {n: p.grad.copy() for n, p in model.named_parameters()}
    model.zero_grad()
    return grads


@pytest.mark.parametrize("family", ["gpt2", "gemma_like"])
def test_changing_a_cache_entry_or_an_array_a_hook_kept_leaves_the_models_gradients(family):
    """The cache's arrays and those a hook keeps are the hooks' own (nn/hooks.py): changing them after the
    forward (``cache[name] *= 0.5`` in a notebook) does not change what backward reads."""
    model = gpt(family)
    x, weights = ids(), np.random.default_rng(3).normal(size=(B, T, V))
    reference = parameter_grads(model, lambda: model(x), weights)
    for name in model.hook_dict:
        kept = []

        def run():
            _, cache = model.run_with_cache(x, names_filter=name)
            cache[name] *= 0.5
        grads = parameter_grads(model, run, weights)
        for n in reference:
            np.testing.assert_allclose(grads[n], reference[n], rtol=0, atol=1e-12, err_msg=f"{name}: {n}")

        def keep_then_change():
            model.run_with_hooks(x, fwd_hooks=[(name, lambda a, h: kept.append(a))])
            kept[-1][...] = 0.0
        grads = parameter_grads(model, keep_then_change, weights)
        for n in reference:
            np.testing.assert_allclose(grads[n], reference[n], rtol=0, atol=1e-12, err_msg=f"kept {name}: {n}")


def test_an_array_a_hook_wrote_and_kept_or_returned_is_not_the_models():
    """A hook that writes in place and keeps its array, or returns an array it keeps, then changes it: the
    model's patched gradients stay those of the values written in the forward pass."""
    model = gpt("gpt2")
    x, weights = ids(), np.random.default_rng(3).normal(size=(B, T, V))
    name = "blocks.1.ln1.hook_normalized"
    kept = []

    def write_and_keep(act, hook):
        act[:, 2] = 1.0
        kept.append(act)

    def give_and_keep(act, hook):
        kept.append(np.where(np.arange(T)[:, None] == 2, 1.0, act))
        return kept[-1]
    for hook in (write_and_keep, give_and_keep):
        reference = parameter_grads(model, lambda: model.run_with_hooks(x, fwd_hooks=[(name, hook)]), weights)

        def change_later():
            model.run_with_hooks(x, fwd_hooks=[(name, hook)])
            kept[-1][...] = 7.0
        grads = parameter_grads(model, change_later, weights)
        for n in reference:
            np.testing.assert_allclose(grads[n], reference[n], rtol=0, atol=1e-12, err_msg=f"{hook.__name__}: {n}")


def test_a_backward_hook_alone_on_the_position_embeddings_runs():
    """hook_pos_embed's array is added inside the position table's module: a backward hook there needs it apart."""
    model = gpt("gpt2")
    seen = []

    def zero(grad, hook):
        seen.append(grad.shape)
        return np.zeros_like(grad)
    model.zero_grad()
    with model.hooks(bwd_hooks=[("hook_pos_embed", zero)]):
        logits = model(ids())
        model.backward(np.ones_like(logits))
    assert seen == [(B, T, 8)] and not model.pos_emb.weight.grad.any()
    np.testing.assert_allclose(logits, model(ids()), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["gpt2", "llama_gqa"])
def test_backward_after_a_forward_whose_hook_raised_is_refused(family):
    """Layers before the hook keep the failed pass's activations, those after it the previous pass's."""
    model = gpt(family)
    model(ids(0))

    def boom(act, hook):
        raise RuntimeError("hook failed")
    with pytest.raises(RuntimeError, match="hook failed"):
        model.run_with_hooks(ids(1), fwd_hooks=[("blocks.1.hook_resid_pre", boom)])
    with pytest.raises(RuntimeError, match="forward pass that raised"):
        model.backward(np.ones((B, T, V)))
    logits = model(ids(1))                             # a forward that completes allows backward again
    model.backward(np.ones_like(logits))
    classifier = EncoderClassifier(V, 3, max_len=16, d_model=8, n_heads=2, n_layers=2, rng=0, dtype=np.float64)
    classifier(ids(0))
    with pytest.raises(RuntimeError, match="hook failed"):
        classifier.run_with_hooks(ids(1), fwd_hooks=[("blocks.1.hook_resid_pre", boom)])
    with pytest.raises(RuntimeError, match="forward pass that raised"):
        classifier.backward(np.ones((B, 3)))


def test_hook_lists_and_the_cache_read_names_as_the_cache_does():
    model = gpt("gpt2")
    with pytest.raises(ValueError, match=r"fwd_hooks is a list of \(name, fn\) pairs; got one pair"):
        model.run_with_hooks(ids(), fwd_hooks=("hook_embed", lambda a, h: None))
    with pytest.raises(ValueError, match="bwd_hooks is a list of .* got an item 'hook_embed'"):
        model.run_with_hooks(ids(), bwd_hooks=["hook_embed"])
    assert no_hooks_left(model)
    _, cache = model.run_with_cache(ids())
    assert ("pattern", 0) in cache and "embed" in cache and "blocks.0.hook_resid_pre" in cache
    assert ("pattern", 5) not in cache and "nothing" not in cache
    assert cache.get(("pattern", 0)) is cache["pattern", 0] and cache.get("embed") is cache["hook_embed"]
    assert cache.get(("pattern", 5)) is None and cache.get("nothing", 3) == 3


# -- zero cost ------------------------------------------------------------------------------------------------
def test_without_hooks_no_hook_point_keeps_anything():
    model = gpt("llama_gqa").train()
    x = ids()
    model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_resid_post", write_at((0, 1), 0.0))])
    model(x)                                          # an unhooked forward forgets the last patch
    model.backward(np.ones((B, T, V)))
    points = model.hook_dict
    assert points and all(isinstance(p, HookPoint) for p in points.values())
    assert all(p._written is None and not p.fwd_hooks and not p.bwd_hooks for p in points.values())
    # a hook point is not a module: nothing new to save, count or walk
    assert not any(n.startswith("hook") or ".hook" in n for n, _ in model.named_modules())
    assert all("hook" not in n for n in model.state_dict())


# -- the encoder classifier and imported Hugging Face models --------------------------------------------------
def test_encoder_classifier_hook_points():
    model = EncoderClassifier(V, 3, max_len=16, d_model=8, n_heads=2, n_layers=2, norm_first=True, rng=0,
                              dtype=np.float64, dropout=0.0).eval()
    x = ids()
    x[1, 5:] = 0                                       # padding (pad_id 0)
    logits, c = model.run_with_cache(x)
    np.testing.assert_allclose(logits, model(x), atol=1e-13)
    assert {"hook_embed", "hook_pos_embed", "blocks.1.attn.hook_pattern", "blocks.0.hook_resid_mid",
            "ln_final.hook_normalized"} <= set(c)
    p = c["pattern", 0]
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-12)
    assert np.all(p[1, :, :, 5:] == 0)                 # nobody attends to padding
    np.testing.assert_array_equal(c["resid_post", 0], c["resid_pre", 1])
    np.testing.assert_allclose(c["resid_mid", 1] + c["mlp_out", 1], c["resid_post", 1], atol=1e-14)
    hooks = [("blocks.0.hook_attn_out", write_at((slice(None), 1), 0.0))]
    weights = np.random.default_rng(0).normal(size=logits.shape)
    model.zero_grad()
    model.run_with_hooks(x, fwd_hooks=hooks)
    model.backward(weights)
    W = model.encoder.layers[0].self_attn.qkv_proj.weight
    i = (3, 2)
    old = W.data[i]
    losses = []
    for d in (1e-6, -1e-6):
        W.data[i] = old + d
        losses.append(float(np.sum(model.run_with_hooks(x, fwd_hooks=hooks) * weights)))
    W.data[i] = old
    assert abs((losses[0] - losses[1]) / 2e-6 - W.grad[i]) < 1e-7


def test_hooks_blocks_nest_and_remove_only_their_own():
    """run_with_cache inside a ``hooks`` block (as attribution patching does) keeps the block's backward hooks."""
    model = gpt("gpt2")
    seen = []
    with model.hooks(bwd_hooks=[("blocks.0.hook_resid_post", lambda g, h: seen.append(g.shape))]):
        logits, cache = model.run_with_cache(ids(), names_filter="blocks.0.hook_resid_post")
        assert model.hook_dict["blocks.0.hook_resid_post"].bwd_hooks and not any(
            p.fwd_hooks for p in model.hook_dict.values())
        model.backward(np.ones_like(logits))
    assert seen == [(B, T, 8)] and no_hooks_left(model)
    model.add_hook("blocks.1.hook_resid_pre", lambda a, h: None)
    model.run_with_hooks(ids(), fwd_hooks=[("blocks.1.hook_resid_pre", lambda a, h: None)])
    assert len(model.hook_dict["blocks.1.hook_resid_pre"].fwd_hooks) == 1      # the one added with add_hook
    model.reset_hooks()
    assert no_hooks_left(model)


def test_an_imported_hugging_face_llama_caches_what_transformers_computes(tmp_path):
    """A random grouped-query Llama saved by transformers and loaded by numformer: the cache's residual streams
    are transformers' hidden states and its patterns transformers' attention weights (eager attention)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from numformer.interop import hf

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=50, max_position_embeddings=32, hidden_size=16, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=24,
                                      tie_word_embeddings=False, attn_implementation="eager")
    reference = transformers.LlamaForCausalLM(config).eval()
    reference.save_pretrained(tmp_path / "llama")
    model = hf.load_pretrained(tmp_path / "llama")[0].eval()
    x = np.random.default_rng(0).integers(0, 50, (2, 9))
    logits, cache = model.run_with_cache(x)
    with torch.no_grad():
        out = reference(torch.tensor(x), output_hidden_states=True, output_attentions=True)
    np.testing.assert_allclose(logits, out.logits.numpy(), atol=1e-5)
    for layer in range(2):
        np.testing.assert_allclose(cache["resid_pre", layer], out.hidden_states[layer].numpy(), atol=1e-5)
        np.testing.assert_allclose(cache["pattern", layer], out.attentions[layer].numpy(), atol=1e-6)
    np.testing.assert_allclose(cache["ln_final.hook_normalized"], out.hidden_states[2].numpy(), atol=1e-5)
    assert cache["k", 0].shape == (2, 9, 2, 4)                # the key/value heads, as TransformerLens's GQA
