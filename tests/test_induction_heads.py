"""numformer reproduce induction_heads: the quick version writes its record, page and figures; the pieces that
read the curves (the phase change, the ablation) on hand-made inputs."""
from __future__ import annotations

import json

import numpy as np
import pytest

from numformer.cli import main
from numformer.analysis import head_scores, per_position_loss
from numformer.experiments.induction_heads import (ablation, build_model, early_positions, in_context,
                                                   induction_heads_of, phase_change, resolved_settings, windows)
from numformer.models import GPT

FIGURES = ("in_context_score_before", "in_context_score_after", "one_layer_in_context_score_after",
           "in_context_score_after_se", "one_layer_in_context_score_after_se", "induction_score_max",
           "previous_token_score_max")


def test_quick_reproduce_writes_the_record_the_page_and_the_figures(tmp_path):
    results = tmp_path / "results"
    assert main(["reproduce", "induction_heads", "--quick", "--results", str(results), "--runs",
                 str(tmp_path / "runs"), "--quiet"]) == 0
    record = json.loads((results / "induction_heads.json").read_text())
    assert set(FIGURES) <= set(record["figures"])
    assert set(record["targets"]) == {"in_context_score_rise", "in_context_score_gap", "induction_score_max",
                                      "ablation_loss_increase"}
    assert 0.0 <= record["figures"]["induction_score_max"] <= 1.0
    two_final = record["history"]["two_layers"][-1]
    assert record["figures"]["previous_token_score_max"] == max(two_final["previous_token"][0])
    assert all(h["in_context_score_se"] > 0 for h in record["history"]["two_layers"])   # a spread over 4 windows
    # an ablation only of heads that are induction heads (none after 6 steps): no figure, the target unmet
    assert record["induction_heads"] == [] and "ablation_loss_increase" not in record["figures"]
    assert "phase_change_step" not in record["figures"]
    assert record["met"]["ablation_loss_increase"] is None
    two = record["history"]["two_layers"]
    assert [h["step"] for h in two] == [0, 3, 6]
    assert np.array(two[-1]["induction"]).shape == (2, 4)            # every head of both layers, every evaluation
    assert np.array(record["history"]["one_layer"][-1]["induction"]).shape == (1, 4)
    assert record["command"] == "numformer reproduce induction_heads --quick"
    md = (results / "induction_heads.md").read_text()
    assert "| induction_score_max |" in md and "Verdict: not reproduced" in md and "nothing to ablate" in md
    assert "; ablation_loss_increase not measured." in md and "ablation_loss_increase missed" not in md
    # no induction head: no phase change is placed, and no caption speaks of one or of an ablation
    assert "No phase change to place" in md and "Phase change (steepest" not in md and "phase_change_step" not in md
    assert "dotted: the phase change" not in md and "with and without the induction heads" not in md
    for name in ("curves", "positions", "scores", "pattern"):
        assert f"figures/induction_heads_{name}.png" in md
        assert (results / "figures" / f"induction_heads_{name}.png").stat().st_size > 1000
    assert "[induction_heads](induction_heads.md)" in (results / "README.md").read_text()


def test_an_unknown_setting_is_one_clear_error():
    with pytest.raises(ValueError, match="induction_heads has no setting train.stpes"):
        resolved_settings(["train.stpes=3"])
    assert resolved_settings(["train.steps=3"])["train"]["steps"] == 3
    for bad in (["eval.late_from=300"], ["eval.early_band=60"], ["eval.early_band=150"]):
        with pytest.raises(ValueError, match="the eval positions need 0 <= early - early_band and early "
                                             "\\+ early_band < late_from < context"):
            resolved_settings(bad)
    assert resolved_settings(["eval.early_band=0"])["eval"]["early_band"] == 0


def test_the_phase_change_is_the_steepest_rise_of_the_best_induction_score():
    history = [{"step": s, "induction": [[0.0, v]]} for s, v in zip((0, 100, 200, 300, 400), (0.02, 0.05, 0.1, 0.7, 0.8))]
    assert phase_change(history) == (2, 250.0)


def test_ablating_a_head_that_writes_nothing_changes_no_loss_and_a_real_head_does():
    model = GPT(7, 16, n_layers=2, n_heads=2, d_model=8, feed_forward=False, rng=0, dtype=np.float64).eval()
    W = model.blocks[1].self_attn.out_proj.weight.data.reshape(8, 2, 4)
    W[:, 1] = 0.0
    ids = np.random.default_rng(0).integers(0, 7, (3, 12))
    ablated, plain = ablation(model, ids, [(1, 1)])
    np.testing.assert_allclose(ablated, plain, atol=1e-12)
    ablated, plain = ablation(model, ids, [(1, 0), (0, 1)])
    assert np.abs(ablated - plain).max() > 1e-4


# -- the instruments on a model whose answer is known ------------------------------------------------------------
def induction_circuit(V, T, gain=10.0):
    """An attention-only 2-layer GPT whose weights implement, by hand, Olsson et al.'s induction circuit: head
    0.0 a previous-token head, head 1.0 an induction head; heads 0.1 and 1.1 write nothing. Learned positions,
    pre-LN, an unembedding of its own; float64. The residual stream (width 3·V + 4) holds

        [ token one-hot (V) | position (4) | previous token one-hot (V) | predicted token one-hot (V) ]

    Position p is the point (cos pα, sin pα) of a quarter circle (α = π/2T), stored with its negative so that the
    stream's mean and norm are the same at every position: each LayerNorm then only divides by a constant σ, which
    the weights undo. Head 0.0 rotates the query back by α, so the key of position i - 1 matches best (scores
    scaled so that the neighbours lose 20 nats); it copies the token into the previous-token slot. Head 1.0's
    query "my token is A" matches the key "the token before me was A" and copies that key's token into the
    predicted slot, which the unembedding reads (logit ``gain`` for it)."""
    tok, pos, prev, pred = slice(0, V), slice(V, V + 4), slice(V + 4, 2 * V + 4), slice(2 * V + 4, 3 * V + 4)
    D = 3 * V + 4
    model = GPT(V, T, n_layers=2, n_heads=2, d_model=D, head_dim=V, positional="learned", feed_forward=False,
                tie_weights=False, attn_scale=1.0, rng=0, dtype=np.float64).eval()
    for p in model.parameters():
        p.data[...] = 0.0
    alpha = np.pi / 2 / T
    circle = np.stack([np.cos(alpha * np.arange(T)), np.sin(alpha * np.arange(T))], axis=1)
    model.tok_emb.weight.data[:, tok] = np.eye(V)
    model.pos_emb.weight.data[:, pos] = np.concatenate([circle, -circle], axis=1)      # mean 0, norm² 2
    # the stream's norm² n (one-hots, 2 for the position) and sum n - 2: LayerNorm subtracts the mean, divides by σ
    sigma = {n: np.sqrt(n / D - ((n - 2) / D) ** 2) for n in (3, 4, 5)}
    for norm, n in ((model.blocks[0].norm1, 3), (model.blocks[1].norm1, 4)):
        norm.weight.data[...] = 1.0
        norm.bias.data[...] = (n - 2) / D / sigma[n]            # the mean added back: LN(x) = x / σ
    model.norm_f.weight.data[...] = 1.0
    (q0, k0, v0), (q1, k1, v1) = (b.self_attn.qkv_proj.weight.data.reshape(3, 2, V, D)[:, 0] for b in model.blocks)
    o0, o1 = (b.self_attn.out_proj.weight.data.reshape(D, 2, V)[:, 0] for b in model.blocks)
    s0, s1 = sigma[3], sigma[4]
    c, s = np.cos(alpha), np.sin(alpha)
    q0[:2, pos.start:pos.start + 2] = np.array([[c, s], [-s, c]]) * s0 * 20.0 / (1 - c)
    k0[:2, pos.start:pos.start + 2] = np.eye(2) * s0
    v0[:, tok], o0[prev, :] = np.eye(V) * s0, np.eye(V)
    q1[:, tok], k1[:, prev] = np.eye(V) * s1 * 30.0, np.eye(V) * s1
    v1[:, tok], o1[pred, :] = np.eye(V) * s1, np.eye(V)
    model.lm_head.weight.data[:, pred] = np.eye(V) * gain * sigma[5]
    return model


def repeated_text(V, period, length, rows):
    """(rows, length) ids: token 0, then ``period`` distinct tokens of 1 … V-1 repeated: the only way to predict
    a token of a repeat is to find its earlier occurrence."""
    segments = [np.random.default_rng(i).permutation(np.arange(1, V))[:period] for i in range(rows)]
    return np.stack([np.concatenate([[0], np.tile(r, length // period + 1)])[:length] for r in segments])


def test_the_head_scores_of_the_hand_built_induction_circuit():
    scores = head_scores(induction_circuit(V=128, T=80), seq_len=40, batch=4, rng=1)
    assert scores.previous_token[0, 0] == pytest.approx(1.0, abs=1e-6)
    # every query of the second half attends to the token after the earlier copy; the first one, r0, splits its
    # attention with position 0 (whose "previous token" is r0 itself): 1 - 0.5 / 40
    assert scores.induction[1, 0] == pytest.approx(1 - 0.5 / 40, abs=1e-4)
    others = [(0, 0), (0, 1), (1, 1)]
    assert max(scores.induction[h] for h in others) < 0.05 and scores.top("induction", 1) == [(1, 0)]
    assert induction_heads_of(scores.induction) == [(1, 0)]


def test_the_loss_by_position_and_the_in_context_score_on_the_hand_built_circuit():
    """A 60-token segment repeated: position t predicts token t + 1, so the loss falls at t = 61 (token 61 is the
    first of the second copy, the first token after the earlier occurrence of its predecessor can be found)."""
    e = resolved_settings([])["eval"]
    V = 64
    model, text = induction_circuit(V, e["context"]), repeated_text(V, 60, e["context"] + 1, rows=3)
    losses = per_position_loss(model, text, batch_size=3)
    assert losses.shape == (e["context"],)
    assert np.all(losses[:61] > 3.0) and np.all(losses[61:] < 0.01)         # log 64 = 4.2 before, ~0 after
    score = in_context(losses, e)
    assert score == pytest.approx(losses[40:61].mean() - losses[200:256].mean()) and score > 3.0   # it helps
    assert early_positions(e) == (40, 61)
    ablated, plain = ablation(model, text, [(1, 0)])
    np.testing.assert_allclose(plain, losses)
    assert np.mean(ablated[200:256] - plain[200:256]) > 3.0                # the induction head carried it
    for idle in ([(1, 1)], [(0, 1)]):                                      # heads that write nothing
        ablated, plain = ablation(model, text, idle)
        np.testing.assert_allclose(ablated, plain, atol=1e-12)


def test_the_models_are_attention_only_causal_with_an_unembedding_of_their_own():
    settings = resolved_settings(["eval.context=32", "eval.early=4", "eval.early_band=2", "eval.late_from=20",
                                  "model.d_model=16"])
    for n_layers in (1, 2):
        model = build_model(n_layers, settings, vocab_size=11).eval()
        names = [name for name, _ in model.named_parameters()]
        assert not any(".ff." in name for name in names) and len(model.blocks) == n_layers
        assert model.lm_head.weight is not model.tok_emb.weight
        ids = np.random.default_rng(0).integers(0, 11, (2, 32))
        changed = ids.copy()
        changed[:, 20:] = (changed[:, 20:] + 1) % 11                    # the future of position 19 changed
        a, b = model(ids), model(changed)
        np.testing.assert_array_equal(a[:, :20], b[:, :20])
        assert np.abs(a[:, 20:] - b[:, 20:]).max() > 1e-4


def test_the_training_windows_are_contiguous_text():
    ids = np.arange(1000)
    batch = windows(ids, 5, 33, np.random.default_rng(0))
    assert batch.shape == (5, 33) and np.all(np.diff(batch, axis=1) == 1)
