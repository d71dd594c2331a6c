"""numformer.analysis: head statistics on hand-built matrices, attention maps, exact ablation restore,
saliency against finite differences, and every figure as a PNG in a headless run."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from numformer import GPT, EncoderClassifier, Transformer, ops
from numformer import analysis as A
from numformer.analysis._common import override_method

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T = 7


def _png_ok(path):
    data = path.read_bytes()
    return len(data) > 1000 and data[:8] == PNG_MAGIC


def _one_hot_rows(cols, Tk=T):
    a = np.zeros((len(cols), Tk))
    a[np.arange(len(cols)), cols] = 1.0
    return a


# -- head statistics on matrices built by hand -------------------------------------------------------------


def test_previous_token_head():
    causal = _one_hot_rows([0] + list(range(T - 1)))          # row 0 has no previous token: it sees itself
    assert A.previous_token_mass(causal) == pytest.approx(1.0)
    assert A.mean_distance(causal) == pytest.approx((T - 1) / T)   # row 0 is at distance 0
    assert A.self_mass(causal) == pytest.approx(1 / T)
    assert A.entropy(causal) == pytest.approx(0.0)
    full = _one_hot_rows([1] + list(range(T - 1)))            # without a mask, row 0 can look one ahead
    assert A.previous_token_mass(full) == pytest.approx(1.0)
    assert A.mean_distance(full) == pytest.approx(1.0)


def test_uniform_head():
    a = np.full((T, T), 1.0 / T)
    assert A.entropy(a) == pytest.approx(np.log(T))
    assert A.entropy(a, normalize=True) == pytest.approx(1.0)
    assert A.first_token_mass(a) == pytest.approx(1.0 / T)
    assert A.previous_token_mass(a) == pytest.approx(1.0 / T)
    assert A.anti_diagonal_mass(a) == pytest.approx(1.0 / T)
    assert A.mean_distance(a) == pytest.approx((T * T - 1) / (3 * T))     # E|i - j| for i, j uniform on 0..T-1


def test_uniform_causal_head_normalized_entropy():
    allowed = np.tril(np.ones((T, T), bool))
    a = allowed / allowed.sum(axis=1, keepdims=True)
    assert A.entropy(a) == pytest.approx(np.mean(np.log(np.arange(1, T + 1))))
    assert A.entropy(a, allowed, normalize=True) == pytest.approx(1.0)
    # Without the mask the normalization counts every key: below 1.
    assert A.entropy(a, normalize=True) < 0.9


def test_anti_diagonal_identity_and_first_token_heads():
    anti = _one_hot_rows([T - 1 - i for i in range(T)])
    assert A.anti_diagonal_mass(anti) == pytest.approx(1.0)
    assert A.self_mass(anti) == pytest.approx(1.0 / T)                # T odd: the middle row is on both
    ident = np.eye(T)
    assert A.self_mass(ident) == pytest.approx(1.0)
    assert A.mean_distance(ident) == pytest.approx(0.0)
    assert A.entropy(ident) == pytest.approx(0.0)
    assert A.previous_token_mass(ident) == pytest.approx(0.0)
    first = _one_hot_rows([0] * T)
    assert A.first_token_mass(first) == pytest.approx(1.0)
    assert A.mean_distance(first) == pytest.approx((T - 1) / 2)


def test_statistics_batch_rectangular_and_masked_rows():
    heads = np.stack([np.eye(T), np.full((T, T), 1.0 / T), _one_hot_rows([T - 1 - i for i in range(T)])])
    stats = A.head_statistics(np.stack([heads, heads]))          # (B=2, H=3, T, T)
    assert set(stats) == set(A.STATISTICS)
    assert stats["self"].shape == (2, 3)
    np.testing.assert_allclose(stats["self"][:, 0], 1.0)
    np.testing.assert_allclose(stats["entropy"][:, 1], np.log(T))
    np.testing.assert_allclose(stats["anti_diagonal"][:, 2], 1.0)
    # Cross-attention (Tq != Tk): the anti-diagonal is j = Tk - 1 - i.
    cross = _one_hot_rows([6, 5, 4], Tk=7)
    assert A.anti_diagonal_mass(cross) == pytest.approx(1.0)
    # An all-masked query row (zero weights) is left out, not counted as 0.
    a = np.eye(T)
    a[3] = 0.0
    assert A.self_mass(a) == pytest.approx(1.0)
    table = A.format_head_statistics({"entropy": np.zeros((2, 3)), "self": np.ones((2, 3))})
    assert table.count("\n") == 2 + 6 - 1


# -- models ---------------------------------------------------------------------------------------------------


def _gpt(dtype=np.float32, dropout=0.0, seed=0):
    return GPT(vocab_size=11, block_size=16, n_layers=2, n_heads=2, d_model=16, dropout=dropout,
               rng=np.random.default_rng(seed), dtype=dtype)


def _classifier(dtype=np.float32, dropout=0.0, seed=1):
    return EncoderClassifier(vocab_size=13, n_classes=3, max_len=16, d_model=16, n_heads=2, n_layers=2,
                             d_ff=32, dropout=dropout, pad_id=0, rng=np.random.default_rng(seed), dtype=dtype)


def _transformer(dtype=np.float32, dropout=0.0, seed=2):
    return Transformer(13, 14, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=dropout, max_len=16,
                       norm_first=True, rng=np.random.default_rng(seed), dtype=dtype)


SRC = np.array([3, 5, 7, 9, 11, 2])
TGT = np.array([1, 4, 6, 8, 10])


def test_attention_maps_of_every_model_type():
    ids = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 3, 2, 1]])
    gpt = _gpt(dropout=0.1)
    before = [m.training for m in gpt.modules()]
    maps = A.attention_maps(gpt, ids)
    assert list(maps) == ["self"] and maps["self"].shape == (2, 2, 2, 8, 8)
    causal = np.tril(np.ones((8, 8), bool))
    assert (maps.allowed["self"] == causal).all()
    assert np.all(maps["self"][..., ~causal] == 0)
    np.testing.assert_allclose(maps["self"].sum(-1), 1.0, rtol=1e-5)
    assert [m.training for m in gpt.modules()] == before                      # flags restored
    for _, m in A.attention_modules(gpt)["self"]:
        assert m.record_weights is False and m.last_weights is None and "forward" not in m.__dict__
    # The recorded weights are the ones the layer computes itself.
    gpt.eval()
    for _, m in A.attention_modules(gpt)["self"]:
        m.record_weights = True
    gpt(ids)
    np.testing.assert_array_equal(A.attention_modules(gpt)["self"][1][1].last_weights, maps["self"][1])

    clf = _classifier()
    cm = A.attention_maps(clf, [4, 5, 6, 0, 0])                               # two padding positions
    assert cm["self"].shape == (2, 1, 2, 5, 5)
    assert not cm.allowed["self"][..., 3:].any() and cm.allowed["self"][..., :3].all()
    assert np.all(cm["self"][..., 3:] == 0)

    tr = _transformer()
    tm = A.attention_maps(tr, (SRC, TGT))
    assert {g: tm[g].shape for g in tm} == {"encoder": (2, 1, 2, 6, 6), "decoder": (2, 1, 2, 5, 5),
                                            "cross": (2, 1, 2, 5, 6)}
    assert (tm.query_input["cross"], tm.key_input["cross"]) == ("tgt", "src")
    assert (tm.allowed["decoder"] == np.tril(np.ones((5, 5), bool))).all()
    stats = A.head_statistics(tm)
    assert set(stats) == {"encoder", "decoder", "cross"} and stats["cross"]["entropy"].shape == (2, 2)


# -- ablation -------------------------------------------------------------------------------------------------


def test_ablating_a_head_and_restoring_is_exact():
    for model, inputs in ((_gpt(), {"idx": np.array([[1, 2, 3, 4, 5, 6]])}),
                          (_transformer(), {"src": SRC[None], "tgt": TGT[None]})):
        model.eval()
        before = model(**inputs).copy()
        group = next(iter(A.attention_modules(model)))
        with A.ablate_heads(model, [(group, 1, 0)]):
            ablated = model(**inputs).copy()
        after = model(**inputs)
        assert not np.array_equal(before, ablated)
        assert np.array_equal(before, after)                                  # bit for bit
        assert all(m.head_mask is None for g in A.attention_modules(model).values() for _, m in g)


def test_head_mask_zeroes_exactly_that_heads_share_of_the_output_projection():
    gpt = _gpt(np.float64).eval()
    ids = np.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    with A.ablate_heads(gpt, [("self", 0, 1)]):
        ablated = gpt(ids)
    W = gpt.blocks[0].self_attn.out_proj.weight.data
    dh = gpt.blocks[0].self_attn.d_head
    saved = W[:, dh:2 * dh].copy()
    W[:, dh:2 * dh] = 0.0
    try:
        manual = gpt(ids)
    finally:
        W[:, dh:2 * dh] = saved
    np.testing.assert_allclose(ablated, manual, rtol=1e-12, atol=1e-14)


def test_head_ablation_grid_and_restore_after_an_error():
    gpt = _gpt()
    ids = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9])
    metric = A.loss_metric(gpt, ids)
    result = A.head_ablation(gpt, metric, metric_name="loss")
    assert result.values["self"].shape == (2, 2) and np.isfinite(result.values["self"]).all()
    with A.ablate_heads(gpt, [("self", 1, 1)]):
        assert metric(gpt) == result.values["self"][1, 1]
    assert result.delta["self"][1, 1] == result.values["self"][1, 1] - result.baseline
    assert metric(gpt) == result.baseline
    with pytest.raises(RuntimeError):
        with A.ablate_heads(gpt, [("self", 0, 0)]):
            raise RuntimeError("boom")
    assert gpt.blocks[0].self_attn.head_mask is None
    with pytest.raises(ValueError, match="out of range"):
        with A.ablate_heads(gpt, [("self", 5, 0)]):
            pass



@pytest.mark.parametrize("returned, named", [
    (np.array([1.0, 2.0]), "an array of shape (2,)"), ("1.5", "a str"), (None, "a NoneType"),
    (np.array(["x"]), "dtype <U1")])
def test_head_ablation_names_a_metric_that_returns_no_number(returned, named):
    gpt = _gpt()
    with pytest.raises(ValueError) as err:
        A.head_ablation(gpt, lambda model: returned)
    assert named in str(err.value) and "must return one real number" in str(err.value)
    assert gpt.blocks[0].self_attn.head_mask is None


def test_head_ablation_takes_a_metric_of_one_element_or_a_numpy_scalar():
    gpt = _gpt()
    assert A.head_ablation(gpt, lambda model: np.array([0.5])).baseline == 0.5
    assert A.head_ablation(gpt, lambda model: np.float32(0.25)).values["self"][0, 0] == 0.25

# -- saliency -------------------------------------------------------------------------------------------------


def _fd_saliency(model, inputs, target, name, emb, eps=1e-6):
    """Central difference of the score when position t's embedding is scaled by (1 ± ε), divided by ε."""
    model.eval()
    T_ = inputs[name].shape[1]
    out = np.zeros(T_)
    for t in range(T_):
        vals = []
        for sign in (1.0, -1.0):
            forward = emb.forward

            def scaled(ids, forward=forward, sign=sign, t=t):
                y = forward(ids).copy()
                y[:, t] *= 1.0 + sign * eps
                return y

            with override_method(emb, "forward", scaled):
                vals.append(float(target(model(**inputs))[0].sum()))
        out[t] = (vals[0] - vals[1]) / (2 * eps)
    return out


@pytest.mark.parametrize("kind", ["gpt", "classifier", "transformer"])
def test_gradient_x_input_matches_finite_differences(kind):
    if kind == "gpt":
        model = _gpt(np.float64, dropout=0.2)
        inputs = {"idx": np.array([[2, 5, 2, 7, 1, 9]])}                     # a repeated id: rows shared in E
        targets = [A.LogitTarget(), A.next_token_target(inputs["idx"])]
    elif kind == "classifier":
        model = _classifier(np.float64, dropout=0.2)
        inputs = {"ids": np.array([[4, 7, 4, 9, 0]])}
        targets = [A.LogitTarget(2), A.LossTarget(np.array([1]))]
    else:
        model = _transformer(np.float64, dropout=0.2)
        inputs = {"src": SRC[None], "tgt": TGT[None]}
        targets = [A.LogitTarget(position=2), A.LossTarget(np.array([[4, 6, 8, 10, 3]]))]
    embs = A._common.embedding_modules(model)
    for target in targets:
        sal, resolved = A.gradient_x_input(model, inputs, target, return_target=True)
        for name, emb in embs.items():
            fd = _fd_saliency(model, inputs, resolved, name, emb)
            err = np.max(np.abs(sal[name][0] - fd)) / max(np.max(np.abs(fd)), 1e-3)
            assert err < 1e-6, (kind, name, err)
    assert all(p.grad is None for p in model.parameters())                   # grads left as they were
    assert all("backward" not in e.__dict__ for e in embs.values())


def test_occlusion_is_the_score_drop_when_a_token_is_replaced():
    gpt = _gpt(np.float64)
    ids = np.array([[1, 2, 3, 4, 5, 6]])
    occ, (target,) = A.occlusion(gpt, ids, replace_id=10, return_target=True)
    gpt.eval()
    base = target(gpt(ids))[0][0]
    for t in range(ids.shape[1]):
        x = ids.copy()
        x[0, t] = 10
        assert occ["idx"][0, t] == pytest.approx(base - target(gpt(x))[0][0], abs=1e-12)
    assert occ["idx"][0, :-1].any()
    clf = _classifier(np.float64)
    occ = A.occlusion(clf, [4, 5, 6, 7])                                       # default: the pad id (0)
    assert occ["ids"].shape == (1, 4) and np.isfinite(occ["ids"]).all()


# -- figures, headless -----------------------------------------------------------------------------------------


def _train_tiny_gpt(steps=25, seed=0):
    """A few steps of plain SGD on 'repeat the sequence' (no trainer): non-random weights and a metrics log."""
    rng = np.random.default_rng(seed)
    gpt = _gpt(seed=seed)
    records = []
    lr = 0.5
    for step in range(1, steps + 1):
        half = rng.integers(1, 11, size=(8, 6))
        idx = np.concatenate([half, half], axis=1)
        logits = gpt(idx[:, :-1])
        loss, cache = ops.cross_entropy_forward(logits, idx[:, 1:])
        gpt.zero_grad()
        gpt.backward(ops.cross_entropy_backward(cache))
        gnorm = float(np.sqrt(sum(float((p.grad ** 2).sum()) for p in gpt.parameters() if p.grad is not None)))
        lr_t = lr * min(1.0, step / 5)
        for p in gpt.parameters():
            if p.grad is not None:
                p.data -= lr_t * p.grad
        records.append({"step": step, "train_loss": loss, "lr": lr_t, "grad_norm": gnorm, "tokens_per_s": 1e3})
        if step % 10 == 0:
            records.append({"step": step, "val_loss": loss * 1.05, "val_accuracy": 0.1 * step / steps})
    return gpt, records


def test_every_figure_is_a_png(tmp_path):
    gpt, records = _train_tiny_gpt()
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    vocab = list("_abcdefghij")
    report = A.write_report(tmp_path / "report", gpt, text="abcdeabcde", encode=lambda s: [vocab.index(c) for c in s],
                            decode_tokens=lambda ids: [vocab[i] for i in ids], metrics_path=metrics)
    out = report.parent
    expected = ["model_diagram.png", "attention_self.png", "head_stats_self.png", "head_ablation.png",
                "position_importance.png", "loss.png", "lr.png", "eval_metrics.png", "positional_pos_emb.png",
                "position_similarity_pos_emb.png", "wavelengths.png"]
    for f in expected:
        assert _png_ok(out / f), f
    text = report.read_text()
    for f in expected:
        assert f"({f})" in text
    assert "| layer | head | entropy |" in text and "## Head ablation" in text
    assert sorted(p.name for p in out.glob("*.png")) == sorted(expected)       # nothing else

    # Again into the same folder, without the ablation and the curves: their figures of the first report go,
    # a file of the user's stays.
    (out / "mine.png").write_bytes(b"not a report's")
    A.write_report(out, gpt, text="abcdeabcde", encode=lambda s: [vocab.index(c) for c in s], ablation=False)
    left = {"head_ablation.png", "loss.png", "lr.png", "eval_metrics.png"}
    assert sorted(p.name for p in out.glob("*.png")) == sorted(set(expected) - left | {"mine.png"})

    # The stand-alone plotting functions, including the sinusoidal table and a long thinned input.
    figs = tmp_path / "figs"
    A.plot_positional_encoding(A.positional.sinusoidal_table(64, 64), path=figs / "pe.png")
    A.plot_wavelengths(64, path=figs / "wl.png")
    A.plot_position_similarity(A.positional.sinusoidal_table(64, 64), path=figs / "sim.png")
    long = np.full((1, 2, 150, 150), 1 / 150)
    A.plot_attention(long, [f"tok{i}" for i in range(150)], [f"tok{i}" for i in range(150)], path=figs / "long.png")
    A.plot_model_diagram(_classifier(), 4, 12, path=figs / "clf.png")
    for f in ("pe.png", "wl.png", "sim.png", "long.png", "clf.png"):
        assert _png_ok(figs / f), f


def test_reports_for_classifier_and_transformer(tmp_path):
    letters = "_abcdefghijkl"
    r1 = A.write_report(tmp_path / "clf", _classifier(), text="abc d", ablation=False,
                        encode=lambda s: [letters.index(c) if c in letters else 12 for c in s],
                        decode_tokens=lambda ids: [letters[i] for i in ids])
    assert "`ids` (5 tokens): `abcld`" in r1.read_text()                     # labels from decode_tokens
    with pytest.raises(ValueError, match="pair"):
        A.write_report(tmp_path / "bad", _transformer(), text="abc", encode=list)
    r2 = A.write_report(tmp_path / "tr", _transformer(), (SRC, TGT), tokens={"src": list("abcdef"),
                                                                          "tgt": list("ABCDE")})
    for f in ("attention_self.png", "head_stats_self.png", "position_importance.png", "model_diagram.png"):
        assert _png_ok(r1.parent / f), f
    for f in ("attention_encoder.png", "attention_decoder.png", "attention_cross.png", "head_stats_cross.png",
              "head_ablation.png", "positional_src_pos.png", "positional_tgt_pos.png", "model_diagram.png"):
        assert _png_ok(r2.parent / f), f


def test_model_diagram_text_matches_the_model():
    gpt = _gpt()
    text = A.format_model_diagram(gpt, batch_size=3, seq_len=9)
    assert f"(3, 9, {gpt.vocab_size})" in text and "pre-LN block × 2" in text
    lines = text.splitlines()
    first = [i for i, l in enumerate(lines) if "LayerNorm" in l][0]
    assert "self-attention" in lines[first + 1]                              # pre-LN: norm, then attention
    post = A.format_model_diagram(_transformer().__class__(13, 14, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                                                           rng=np.random.default_rng(0)), 1, 6, 5)
    block = [l for l in post.splitlines() if l.startswith("  │")]
    assert "self-attention" in block[0] and "+ residual, LayerNorm" in block[1]   # post-LN: add & norm after
    assert "cross-attention" in post and "(1, 2, 5, 6)" in post
    assert gpt(np.zeros((3, 9), int)).shape == (3, 9, gpt.vocab_size)


def test_model_diagram_of_a_gemma_style_gpt(tmp_path):
    """RoPE acts in attention (nothing added to the embeddings), a sandwich block has a norm after each sub-layer
    too, grouped-query attention has fewer key/value heads, and the embedding is scaled by √d."""
    from numformer.models import GPTConfig

    c = GPTConfig.from_keywords(vocab_size=50, block_size=16, n_layers=2, n_heads=2, d_model=16, d_ff=32,
                                positional="rope", norm="rms_plus_one", norm_placement="sandwich",
                                activation="geglu", bias=False, n_kv_heads=1, scale_embeddings=True)
    text = A.format_model_diagram(GPT(c, rng=0), 1, 8)
    assert "sinusoidal" not in text and "E[ids]·√d" in text and "dropout (positions act in attention)" in text
    assert "sandwich-norm block × 2" in text and "1 key/value head, RoPE on q, k" in text
    assert "Q (1, 2, 8, 8), K,V (1, 1, 8, 8)" in text and "GeGLU" in text
    block = [line[4:].split("  ")[0] for line in text.splitlines() if line.startswith("  │")]
    assert block[:4] == ["RMSNorm (1 + w)", block[1], "RMSNorm (1 + w)", "+ residual"]
    A.plot_model_diagram(GPT(c, rng=0), 1, 8, path=tmp_path / "d.png")                  # the picture draws too
    assert (tmp_path / "d.png").stat().st_size > 1000


def test_read_metrics_tolerates_a_truncated_last_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "train_loss": 2.0, "lr": 0.1}\n\n{"step": 2, "val_loss": 1.5}\n{"step": 3, "tr')
    recs = A.read_metrics(p)
    assert [r["step"] for r in recs] == [1, 2]
    assert A.eval_metric_names(recs) == []
    p.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2"):
        A.read_metrics(p)


def test_headless_without_pyplot(tmp_path):
    """A fresh interpreter with no display draws a figure and never imports pyplot."""
    code = textwrap.dedent(f"""
        import os, sys
        os.environ.pop("DISPLAY", None); os.environ.pop("MPLBACKEND", None)
        import numpy as np
        from numformer import analysis as A
        A.plot_attention(np.eye(4)[None, None], list("abcd"), list("abcd"), path={str(tmp_path / 'eye.png')!r})
        assert "matplotlib.pyplot" not in sys.modules, "pyplot was imported"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert _png_ok(tmp_path / "eye.png")


def test_token_ticks_label_every_token_when_they_fit():
    """A font size chosen to fit n labels shows all n (rounding once thinned such axes to every second one)."""
    from numformer.analysis._common import label_ticks

    for n in range(2, 80):
        for length in np.linspace(2.4, 8.0, 29):
            ticks, fontsize = label_ticks(n, float(length))
            if fontsize > 5.0:             # above the smallest size every label fits
                assert len(ticks) == n, (n, length, fontsize)
    ticks, _ = label_ticks(400, 3.0)       # too many for the axis: thinned, evenly
    assert 1 < len(ticks) < 400 and len(set(np.diff(ticks))) == 1
