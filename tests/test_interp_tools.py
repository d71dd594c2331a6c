"""numformer.analysis's interpretability tools on tiny float64 GPTs where the answer is known by construction:
the logit lens, direct logit attribution, activation patching, attribution patching, head scores."""
from __future__ import annotations

import numpy as np
import pytest

from numformer import analysis as A
from numformer.models import GPT

V, T = 13, 8


def gpt(**kw):
    base = dict(n_layers=2, n_heads=2, d_model=12)
    model = GPT(V, 32, rng=0, dtype=np.float64, **{**base, **kw}).eval()
    rng = np.random.default_rng(5)
    for _, p in model.named_parameters():               # larger than the init's: every head matters
        p.data += rng.normal(scale=0.3, size=p.shape)
    return model


def prompts(differ_at=(3,), batch=2):
    clean = np.random.default_rng(1).integers(0, V, (batch, T))
    corrupted = clean.copy()
    for p in differ_at:
        corrupted[:, p] = (clean[:, p] + 1 + np.arange(batch)) % V
    return clean, corrupted


# -- the logit lens and direct logit attribution ---------------------------------------------------------------
@pytest.mark.parametrize("family", [{}, dict(positional="rope", norm="rms", activation="swiglu", n_kv_heads=1,
                                             bias=False),
                                    dict(norm_placement="sandwich", norm="rms", qk_norm=True, head_dim=5),
                                    dict(norm_placement="sandwich", norm="rms_plus_one", positional="rope",
                                         activation="geglu", bias=False, scale_embeddings=True)])   # Gemma's
def test_logit_lens_last_stage_is_the_output_and_attribution_adds_up_to_the_logit(family):
    model = gpt(**family)
    ids = np.random.default_rng(2).integers(0, V, (3, T))
    lens = A.logit_lens(model, ids)
    assert lens.logits.shape == (model.n_layers + 1, 3, T, V)
    np.testing.assert_allclose(lens.logits[-1], model(ids), atol=1e-12)
    assert lens.next_token_probability().shape == (model.n_layers + 1, 3, T - 1)
    dla = A.direct_logit_attribution(model, ids, tokens=[1, 4, 7], baseline_tokens=2)
    logits = model(ids)[:, -1]
    np.testing.assert_allclose(dla.logit, logits[[0, 1, 2], [1, 4, 7]] - logits[:, 2], atol=1e-10)
    np.testing.assert_allclose(dla.total(), dla.logit, atol=1e-10)
    assert dla.heads.shape == (3, model.n_layers, 2)


def test_a_head_that_writes_nothing_has_no_direct_attribution_and_no_patching_effect():
    model = gpt(feed_forward=False)
    H, dh = 2, 6
    W = model.blocks[1].self_attn.out_proj.weight.data.reshape(12, H, dh)
    W[:, 0] = 0.0                                        # head (1, 0) writes nothing into the residual stream
    ids = np.random.default_rng(2).integers(0, V, (2, T))
    dla = A.direct_logit_attribution(model, ids, tokens=3)
    np.testing.assert_array_equal(dla.heads[:, 1, 0], 0.0)
    assert np.all(np.abs(dla.heads[:, 1, 1]) > 1e-6)
    clean, corrupted = prompts((2, 5))
    result = A.activation_patching(model, clean, corrupted, A.LogitDifference(3, 4), per="head")
    assert result.values.shape == (2, 2)
    assert result.normalized()[1, 0] == pytest.approx(0.0, abs=1e-12)
    assert abs(result.normalized()[1, 1]) > 1e-3


def test_post_ln_models_are_refused_by_direct_logit_attribution():
    with pytest.raises(ValueError, match="post-LN"):
        A.direct_logit_attribution(gpt(norm_first=False), np.zeros((1, 4), dtype=int))


# -- activation patching -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("position", [3, T - 1])
def test_patching_the_first_residual_stream_at_the_one_differing_position_restores_the_clean_run(position):
    """Prompts that differ at one position: at layer 0's resid_pre (the embeddings) patching that position gives
    the clean run exactly (1), and every other position changes nothing (0)."""
    model = gpt()
    clean, corrupted = prompts((position,))
    metric = A.LogitDifference(answer=5, wrong=6)
    result = A.activation_patching(model, clean, corrupted, metric)
    assert result.values.shape == (2, T)
    expected = np.zeros(T)
    expected[position] = 1.0
    np.testing.assert_allclose(result.normalized()[0], expected, atol=1e-10)
    # causal attention: before the differing position both runs are equal at every layer (nothing to patch);
    # when it is the last one, every layer's stream differs there alone, so patching it restores the clean run
    np.testing.assert_allclose(result.normalized()[:, :position], 0.0, atol=1e-10)
    if position == T - 1:
        np.testing.assert_allclose(result.normalized()[1], expected, atol=1e-10)
    assert result.clean == pytest.approx(metric(model(clean)))
    assert result.corrupted == pytest.approx(metric(model(corrupted)))
    assert all(not p.fwd_hooks and not p.bwd_hooks for p in model.hook_dict.values())


def test_patching_every_head_of_a_one_layer_attention_only_model_with_no_final_norm_is_exact_by_hand():
    """logits = W_U (x + Σ_h z_h W_O,hᵀ + b): patching one head's z moves the logit difference by exactly
    (z_clean - z_corrupted) W_O,hᵀ (u_answer - u_wrong), the linear term attribution patching computes."""
    model = gpt(n_layers=1, feed_forward=False, final_norm=False)
    clean, corrupted = prompts((1, 4))
    metric = A.LogitDifference(answer=2, wrong=9)
    real = A.activation_patching(model, clean, corrupted, metric, per="head")
    approx = A.attribution_patching(model, clean, corrupted, metric, per="head")
    _, c_clean = model.run_with_cache(clean)
    _, c_corr = model.run_with_cache(corrupted)
    attn = model.blocks[0].self_attn
    W = attn.out_proj.weight.data.reshape(12, 2, 6)
    u = model.lm_head.weight.data[2] - model.lm_head.weight.data[9]
    by_hand = [metric(model(corrupted)) + np.mean((c_clean["z", 0][:, -1, h] - c_corr["z", 0][:, -1, h])
                                                  @ W[:, h].T @ u) for h in range(2)]
    np.testing.assert_allclose(real.values[0], by_hand, atol=1e-10)
    np.testing.assert_allclose(approx.values, real.values, atol=1e-10)
    assert all(p.grad is None or not p.grad.any() for _, p in model.named_parameters())


@pytest.mark.parametrize("per", ["position", "head"])
def test_attribution_patching_is_the_derivative_of_real_patching(per):
    """Real patching of a (1 - ε) corrupted + ε clean activation, divided by ε, tends to attribution patching's
    term (a_clean - a_corrupted) · ∂metric/∂a: checked at every place with central differences."""
    model = gpt(positional="rope", norm="rms", activation="swiglu")
    clean, corrupted = prompts((2, 6))
    metric = A.LogitDifference(answer=0, wrong=None)
    approx = A.attribution_patching(model, clean, corrupted, metric, per=per)
    _, c_clean = model.run_with_cache(clean)
    _, c_corr = model.run_with_cache(corrupted)
    eps = 1e-5
    for layer in range(2):
        name = f"blocks.{layer}.hook_resid_pre" if per == "position" else f"blocks.{layer}.attn.hook_z"
        delta = c_clean[name] - c_corr[name]
        for i in range(approx.values.shape[1]):
            def moved(e):
                def hook(act, _):
                    index = (slice(None), i) if per == "position" else (slice(None), slice(None), i)
                    act[index] = c_corr[name][index] + e * delta[index]
                    return act
                return metric(model.run_with_hooks(corrupted, fwd_hooks=[(name, hook)]))
            derivative = (moved(eps) - moved(-eps)) / (2 * eps)
            assert derivative == pytest.approx(approx.values[layer, i] - approx.corrupted, abs=1e-6)


def test_patching_refuses_prompts_of_different_shapes_and_metrics_without_a_gradient():
    model = gpt()
    with pytest.raises(ValueError, match="same shape"):
        A.activation_patching(model, np.zeros((1, 4), int), np.zeros((1, 5), int), lambda logits: 0.0)
    with pytest.raises(ValueError, match="needs the metric's gradient"):
        A.attribution_patching(model, np.zeros((1, 4), int), np.ones((1, 4), int), lambda logits: 0.0)


@pytest.mark.parametrize("returned, named", [(np.array([1.0, 2.0]), "an array of shape (2,)"), (None, "a NoneType")])
def test_patching_names_a_metric_that_returns_no_number(returned, named):
    """activation_patching's metric gets the same one-line check as head_ablation's (``metric_value``)."""
    with pytest.raises(ValueError) as err:
        A.activation_patching(gpt(), np.zeros((1, 4), int), np.ones((1, 4), int), lambda logits: returned)
    assert named in str(err.value) and "metric(logits) must return one real number" in str(err.value)


def test_patching_figures(tmp_path):
    model = gpt()
    clean, corrupted = prompts((2,))
    metric = A.LogitDifference(answer=1, wrong=3)
    A.activation_patching(model, clean, corrupted, metric).plot(tokens=list("abcdefgh"), path=tmp_path / "p.png")
    A.activation_patching(model, clean, corrupted, metric, per="head").plot(path=tmp_path / "h.png")
    A.logit_lens(model, clean).plot(path=tmp_path / "lens.png")
    assert all((tmp_path / n).stat().st_size > 1000 for n in ("p.png", "h.png", "lens.png"))


# -- head scores -------------------------------------------------------------------------------------------------
def test_scores_of_hand_made_patterns():
    n = 5
    size = 2 * n
    previous = np.eye(size, k=-1)
    previous[0, 0] = 1.0
    induction = np.zeros((size, size))
    induction[np.arange(size), np.maximum(np.arange(size) - n + 1, 0)] = 1.0
    duplicate = np.zeros((size, size))
    duplicate[np.arange(size), np.maximum(np.arange(size) - n, 0)] = 1.0
    patterns = np.stack([previous, induction, duplicate])[None, None]          # (L=1, B=1, H=3, T, T)
    s = A.scores_from_patterns(patterns, n)
    np.testing.assert_allclose(s.previous_token, [[1.0, 1 / 9, 1 / 9]])      # row 1 of both reads row 0
    np.testing.assert_allclose(s.induction, [[0.0, 1.0, 0.0]])
    np.testing.assert_allclose(s.duplicate_token, [[0.0, 0.0, 1.0]])
    assert s.top("induction", 1) == [(0, 1)]


def test_head_scores_read_the_models_patterns():
    """A hook that makes head (1, 0) attend to the token after the earlier copy: its induction score is 1."""
    model = gpt()
    n = 6

    def induction_pattern(act, hook):
        size = act.shape[-1]
        rows = np.arange(size)
        act[:, 0] = 0.0
        act[:, 0, rows, np.where(rows >= n, rows - n + 1, 0)] = 1.0
        return act

    model.add_hook("blocks.1.attn.hook_pattern", induction_pattern)
    scores = A.head_scores(model, seq_len=n, batch=3, rng=0)
    model.reset_hooks()
    assert scores.induction[1, 0] == pytest.approx(1.0)
    assert scores.induction.shape == scores.previous_token.shape == (2, 2)
    assert np.all((scores.induction >= 0) & (scores.induction <= 1))
    assert scores.top("induction", 1) == [(1, 0)]


def test_repeated_random_tokens_and_the_in_context_score():
    ids = A.repeated_random_tokens(50, 7, batch=2, rng=0, low=3)
    assert ids.shape == (2, 14) and np.all(ids[:, :7] == ids[:, 7:]) and ids.min() >= 3
    losses = np.concatenate([np.full(100, 3.0), np.full(200, 2.5)])
    assert A.in_context_score(losses, early=50, late=(200, 256)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least 302 tokens"):
        A.in_context_score(losses, late=(250, 300 + 1))
    assert A.in_context_score(losses, early=(40, 61), late=(200, 256)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"the early positions \[150, 210\) must come before the late ones from 200"):
        A.in_context_score(losses, early=(150, 210))
    model = gpt()
    ids = np.random.default_rng(0).integers(0, V, (5, 9))
    per_position = A.per_position_loss(model, ids, batch_size=2)
    assert per_position.shape == (8,) and np.all(per_position > 0)
    per_window = A.per_window_loss(model, ids, batch_size=2)           # one row per window, the same losses
    assert per_window.shape == (5, 8) and per_window.dtype == np.float64
    np.testing.assert_allclose(per_window.mean(axis=0), per_position, rtol=1e-12)
    np.testing.assert_allclose(A.per_window_loss(model, ids[2:3])[0], per_window[2], rtol=1e-6)
    scores = A.in_context_score(per_window, early=(1, 3), late=(5, 8))      # a score per window, mean = score
    assert scores.shape == (5,)
    assert scores.mean() == pytest.approx(A.in_context_score(per_position, early=(1, 3), late=(5, 8)), rel=1e-12)



# -- padded prompts: {"idx": ids, "attention_mask": mask} -------------------------------------------------------
def padded(ids, pad=2):
    """{"idx", "attention_mask"} of ids (B, T) left-padded with ``pad`` positions of token 0."""
    ids = np.atleast_2d(ids)
    mask = np.c_[np.zeros((len(ids), pad), int), np.ones(ids.shape, int)]
    return {"idx": np.c_[np.zeros((len(ids), pad), int), ids], "attention_mask": mask}


@pytest.mark.parametrize("family", [{}, dict(positional="rope", norm="rms", activation="swiglu", bias=False)])
def test_the_lens_and_attribution_of_a_left_padded_row_are_those_of_the_row_alone(family):
    """The mask is used: a padded row reads as the row alone (its positions count its real tokens)."""
    model = gpt(**family)
    row, other = np.random.default_rng(3).integers(0, V, 6), np.random.default_rng(4).integers(0, V, 8)
    inputs = {"idx": np.stack([np.r_[[0, 0], row], other]), "attention_mask": np.array([[0, 0] + [1] * 6, [1] * 8])}
    lens, alone = A.logit_lens(model, inputs), A.logit_lens(model, row)
    np.testing.assert_allclose(lens.logits[:, 0, 2:], alone.logits[:, 0], atol=1e-10)
    np.testing.assert_allclose(lens.logits[:, 1], A.logit_lens(model, other).logits[:, 0], atol=1e-10)
    p = lens.next_token_probability()
    assert np.isnan(p[:, 0, :2]).all() and not np.isnan(p[:, 0, 2:]).any() and not np.isnan(p[:, 1]).any()
    np.testing.assert_allclose(p[:, 0, 2:], alone.next_token_probability()[:, 0], atol=1e-10)
    dla, by_row = A.direct_logit_attribution(model, inputs, tokens=[3, 5]), A.direct_logit_attribution(model, row, 3)
    for term in ("embed", "heads", "attn_bias", "mlp", "norm_bias", "logit"):
        np.testing.assert_allclose(getattr(dla, term)[0], getattr(by_row, term)[0], atol=1e-10, err_msg=term)
    np.testing.assert_allclose(dla.logit, model(**inputs)[[0, 1], -1, [3, 5]], atol=1e-10)


@pytest.mark.parametrize("per", ["position", "head"])
def test_patching_left_padded_prompts_gives_the_result_of_the_prompts_alone(per):
    model = gpt()
    clean, corrupted = prompts((3,), batch=1)
    metric = A.LogitDifference(answer=1, wrong=4)
    for run in (A.activation_patching, A.attribution_patching):
        with_pad, alone = run(model, padded(clean), padded(corrupted), metric, per), run(model, clean, corrupted,
                                                                                          metric, per)
        assert (with_pad.clean, with_pad.corrupted) == pytest.approx((alone.clean, alone.corrupted), abs=1e-10)
        np.testing.assert_allclose(with_pad.values[:, 2:] if per == "position" else with_pad.values, alone.values,
                                   atol=1e-10, err_msg=run.__name__)
        if per == "position":                        # a padding position patched changes nothing
            np.testing.assert_allclose(with_pad.values[:, :2], with_pad.corrupted, atol=1e-10)


def test_padding_the_tools_cannot_read_is_one_clear_error():
    model = gpt()
    clean, corrupted = prompts((3,), batch=1)
    inputs = padded(np.r_[clean, corrupted])
    right = {"idx": inputs["idx"][:, ::-1].copy(), "attention_mask": inputs["attention_mask"][:, ::-1].copy()}
    with pytest.raises(ValueError, match=r"position -1, which is padding in batch row\(s\) \[0, 1\]"):
        A.direct_logit_attribution(model, right, tokens=3)
    with pytest.raises(ValueError, match="metric reads position -1, which is padding"):
        A.attribution_patching(model, right, right, A.LogitDifference(1, 2))
    unmasked = padded(corrupted)["idx"]
    other_mask = {"idx": unmasked, "attention_mask": padded(corrupted)["attention_mask"] * 0 + 1}
    for corrupted_inputs in (unmasked, other_mask):
        with pytest.raises(ValueError, match="same padding mask"):
            A.activation_patching(model, padded(clean), corrupted_inputs, A.LogitDifference(1, 2))
        with pytest.raises(ValueError, match="same padding mask"):
            A.attribution_patching(model, padded(clean), corrupted_inputs, A.LogitDifference(1, 2))
    with pytest.raises(ValueError, match="padding mask only; got 'logits_to_keep'"):
        A.logit_lens(model, {"idx": clean, "logits_to_keep": 1})
