"""Sampling and decoding: logits processors (HF semantics), GPT generation with the KV cache and the
sliding window, encoder-decoder greedy / sampling / beam search."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from numformer import GPT, Transformer
from numformer.decoding import _beam_search
from numformer.generate import (apply_temperature, beam_search, generate, greedy_decode, sample_decode,
                                sample_next, top_k_filter, top_p_filter, warp_logits)

EXACT = 1e-10   # cached vs recomputed logits, float64


def R(seed):
    return np.random.default_rng(seed)


def small_gpt(seed=0, **kw):
    args = dict(vocab_size=11, block_size=8, n_layers=2, n_heads=2, d_model=8, dtype=np.float64, rng=R(seed))
    args.update(kw)
    return GPT(**args)


def small_transformer(seed=0, flatten=0.3, **kw):
    args = dict(src_vocab_size=13, tgt_vocab_size=7, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.1,
                max_len=16, src_pad_id=0, dtype=np.float64, rng=R(seed))
    args.update(kw)
    model = Transformer(**args)
    model.out_proj.weight.data *= flatten     # flatter output distributions: varied lengths, beams that differ
    return model


def kept(x):
    return np.isfinite(x)


# -- logits processors ---------------------------------------------------------------------
def test_temperature_divides_and_zero_is_greedy():
    logits = R(0).standard_normal((5, 11))
    np.testing.assert_allclose(apply_temperature(logits, 0.5), logits * 2)
    with pytest.raises(ValueError, match="greedy"):
        apply_temperature(logits, 0)
    argmax = logits.argmax(-1)
    assert (sample_next(logits, R(1), temperature=0) == argmax).all()
    assert (sample_next(logits, R(1), greedy=True, temperature=1.5, top_k=3, top_p=0.5) == argmax).all()
    # temperature -> 0 concentrates the distribution on the argmax
    for seed in range(20):
        assert (sample_next(logits, R(seed), temperature=1e-4) == argmax).all()


def test_top_k_keeps_exactly_k():
    logits = R(1).standard_normal((4, 11))
    for k in range(1, 12):
        out = top_k_filter(logits, k)
        assert (kept(out).sum(-1) == k).all()
        top = np.argsort(-logits, axis=-1)[:, :k]
        assert kept(np.take_along_axis(out, top, -1)).all()
        np.testing.assert_array_equal(out[kept(out)], logits[kept(out)])   # kept logits unchanged
    assert kept(top_k_filter(logits, 50)).all()                            # k > vocabulary: keep all
    # ties with the k-th largest are kept (HF: remove only what is strictly below it)
    np.testing.assert_array_equal(kept(top_k_filter(np.array([[1.0, 2.0, 2.0, 3.0]]), 2)), [[0, 1, 1, 1]])


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.array([0.1, 0.4, 0.2, 0.3])          # sorted: 0.4 (1), 0.3 (3), 0.2 (2), 0.1 (0)
    logits = np.log(probs)[None]
    cases = {0.05: [1], 0.4: [1], 0.41: [1, 3], 0.69: [1, 3], 0.7: [1, 3],   # 0.4 + 0.3 == 0.7 reaches p exactly
             0.71: [1, 2, 3], 0.9: [1, 2, 3], 0.91: [0, 1, 2, 3], 1.0: [0, 1, 2, 3]}
    for p, expect in cases.items():
        out = top_p_filter(logits, p)
        assert sorted(np.flatnonzero(kept(out[0]))) == expect, p
        np.testing.assert_array_equal(out[kept(out)], logits[kept(out)])
    # at least one token, even when the top token alone is above p
    assert kept(top_p_filter(np.log([[0.97, 0.01, 0.01, 0.01]]), 0.5)).sum() == 1
    # dyadic distribution: exact boundaries, and a tie with the last kept token is kept
    dy = np.log([[0.125, 0.5, 0.125, 0.25]])
    assert sorted(np.flatnonzero(kept(top_p_filter(dy, 0.5)[0]))) == [1]
    assert sorted(np.flatnonzero(kept(top_p_filter(dy, 0.75)[0]))) == [1, 3]
    assert sorted(np.flatnonzero(kept(top_p_filter(dy, 0.8)[0]))) == [0, 1, 2, 3]
    # rows are independent; shift-invariant in the logits
    both = np.concatenate([logits + 5.0, np.log(probs[::-1])[None]])
    np.testing.assert_array_equal(kept(top_p_filter(both, 0.7)), [[0, 1, 0, 1], [1, 0, 1, 0]])


def test_processors_check_their_arguments():
    logits = np.zeros((1, 4))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="top_k"):
            top_k_filter(logits, bad)
    for bad in (0, -0.1, 1.01, float("nan")):
        with pytest.raises(ValueError, match="top_p"):
            top_p_filter(logits, bad)
    with pytest.raises(ValueError, match="temperature"):
        sample_next(logits, R(0), temperature=-1)


def test_sample_next_samples_the_filtered_distribution():
    probs = np.array([0.05, 0.5, 0.15, 0.3])
    logits = np.tile(np.log(probs), (40000, 1))
    draws = sample_next(logits, R(0), top_k=2)
    assert set(np.unique(draws)) == {1, 3}
    assert abs(np.mean(draws == 1) - 0.5 / 0.8) < 0.01
    draws = sample_next(logits, R(1), top_p=0.9)            # keeps 0.5, 0.3, 0.15
    assert set(np.unique(draws)) == {1, 2, 3}
    assert abs(np.mean(draws == 2) - 0.15 / 0.95) < 0.01
    draws = sample_next(logits, R(2), temperature=0.5)       # p ∝ probs²
    assert abs(np.mean(draws == 0) - 0.05 ** 2 / np.sum(probs ** 2)) < 0.01
    # a fixed seed repeats the same draws
    np.testing.assert_array_equal(sample_next(logits[:50], R(3)), sample_next(logits[:50], R(3)))


def test_warpers_match_hugging_face():
    torch = pytest.importorskip("torch")
    lp = pytest.importorskip("transformers.generation.logits_process")
    logits = R(2).standard_normal((64, 50)) * 2
    for temperature, top_k, top_p in itertools.product((0.7, 1.0, 1.8), (None, 1, 5, 20, 60),
                                                       (None, 0.05, 0.5, 0.9, 0.99)):
        procs = [lp.TemperatureLogitsWarper(temperature)]
        if top_k is not None:
            procs.append(lp.TopKLogitsWarper(top_k))
        if top_p is not None:
            procs.append(lp.TopPLogitsWarper(top_p))
        ref = lp.LogitsProcessorList(procs)(None, torch.from_numpy(logits.copy())).numpy()
        ours = warp_logits(logits, temperature, top_k, top_p)
        np.testing.assert_array_equal(kept(ours), kept(ref), err_msg=f"{temperature} {top_k} {top_p}")
        np.testing.assert_allclose(ours[kept(ours)], ref[kept(ref)], rtol=1e-12)


# -- GPT generation -----------------------------------------------------------------------
@pytest.mark.parametrize("shift", [None, 1, 3, 8])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_gpt_cached_equals_recomputed_at_every_step(shift, positional):
    model = small_gpt(positional=positional)
    prompt = R(5).integers(0, 11, size=(2, 3))
    n = 21                                      # 3 + 21 tokens: far past block_size 8
    out_c, log_c = generate(model, prompt, n, rng=R(9), shift=shift, return_logits=True)
    out_u, log_u = generate(model, prompt, n, rng=R(9), shift=shift, use_cache=False, return_logits=True)
    np.testing.assert_array_equal(out_c, out_u)
    assert log_c.shape == (2, n, 11)
    np.testing.assert_allclose(log_c, log_u, rtol=0, atol=EXACT)
    np.testing.assert_array_equal(out_c[:, :3], prompt)


def test_gpt_shift_1_is_nanogpt_crop():
    model = small_gpt(seed=1)
    prompt = R(2).integers(0, 11, size=(2, 11))          # longer than block_size: cropped too
    out, trace = generate(model, prompt, 15, greedy=True, shift=1, return_logits=True)
    seq = prompt.copy()
    for step in range(15):                              # nanoGPT: idx_cond = idx[:, -block_size:]
        logits = model(seq[:, -8:])[:, -1]
        np.testing.assert_allclose(trace[:, step], logits, rtol=0, atol=EXACT)
        seq = np.concatenate([seq, logits.argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(out, seq)


def test_gpt_window_schedule():
    model = small_gpt()
    seen = []
    forward = model.forward

    def spy(idx, kv_caches=None, **kw):
        seen.append((idx.shape[1], 0 if kv_caches is None else kv_caches[0].length))
        return forward(idx, kv_caches, **kw)

    model.forward = spy
    generate(model, [1, 2, 3], 12, greedy=True, shift=4, use_cache=False)
    assert [t for t, _ in seen] == [3, 4, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    seen.clear()
    generate(model, [1, 2, 3], 12, greedy=True, shift=4)
    # (tokens fed, positions already cached): a prefill, single steps, a re-prefill of 8 - 4 + 1 tokens ...
    assert seen == [(3, 0), (1, 3), (1, 4), (1, 5), (1, 6), (1, 7), (5, 0), (1, 5), (1, 6), (1, 7), (5, 0), (1, 5)]
    for prompt_length in (9, 10, 12):                    # a prompt over block_size: its last 8 tokens, then shifts
        for use_cache in (True, False):
            seen.clear()
            prompt = np.arange(prompt_length) % 11
            out, trace = generate(model, prompt, 3, greedy=True, shift=4, use_cache=use_cache, return_logits=True)
            assert seen[0][0] == 8, (prompt_length, use_cache, seen)
            model.forward = forward
            np.testing.assert_allclose(trace[0, 0], model(prompt[None, -8:])[0, -1], atol=EXACT)
            model.forward = spy


def test_gpt_fixed_seed_repeats_and_mode_is_restored():
    model = small_gpt(dropout=0.5)
    model.train()
    model.blocks[0].eval()                              # a mixed mode is restored as it was
    a = model.generate([3, 1, 4], 20, rng=R(42), top_k=5, top_p=0.9, temperature=0.8)
    b = model.generate([3, 1, 4], 20, rng=R(42), top_k=5, top_p=0.9, temperature=0.8)
    c = model.generate([3, 1, 4], 20, rng=R(43), top_k=5, top_p=0.9, temperature=0.8)
    np.testing.assert_array_equal(a, b)                 # also: dropout is off while generating
    assert a.shape == (23,) and not np.array_equal(a, c)
    assert model.training and model.blocks[1].training and not model.blocks[0].training
    vocab = "abcdefghijk"
    assert "".join(vocab[i] for i in a) == "".join(vocab[i] for i in b)


def test_gpt_temperature_zero_equals_greedy_and_stream():
    model = small_gpt(seed=3)
    streamed = []
    g = generate(model, [[1, 2], [3, 4]], 10, greedy=True)
    t0 = generate(model, [[1, 2], [3, 4]], 10, temperature=0, stream=streamed.append)
    np.testing.assert_array_equal(g, t0)
    np.testing.assert_array_equal(np.stack(streamed, axis=1), g[:, 2:])
    one = []
    out = model.generate([5], 6, rng=R(0), stream=one.append)
    assert one == out[1:].tolist() and all(type(t) is int for t in one)
    np.testing.assert_array_equal(generate(model, [5, 6], 0), [5, 6])


def test_gpt_stop_tokens_end_rows_as_hugging_face_eos_token_id():
    """A row ends at its first stop token (kept; the row then repeats it); generation ends when every row has
    ended, so the result may be shorter; an int or a list of ids; with and without the cache alike."""
    model = small_gpt(seed=5)
    full, logits = generate(model, [[1, 2], [3, 4]], 12, greedy=True, return_logits=True)
    new = full[:, 2:]
    first = {int(t) for t in new[0, :4]}
    stop = sorted(first - set(new[1].tolist())) or [int(new[0, 0])]
    for use_cache in (True, False):
        out, trace = generate(model, [[1, 2], [3, 4]], 12, greedy=True, stop_tokens=stop, use_cache=use_cache,
                              return_logits=True)
        ends = [next((i for i, t in enumerate(row) if t in stop), None) for row in new]
        n = 12 if None in ends else max(ends) + 1
        assert out.shape == (2, 2 + n) and trace.shape == (2, n, 11)
        for r, end in enumerate(ends):
            if end is None:
                np.testing.assert_array_equal(out[r, 2:], new[r, :n])
            else:
                np.testing.assert_array_equal(out[r, 2:2 + end + 1], new[r, :end + 1])
                assert set(out[r, 2 + end:].tolist()) == {int(new[r, end])}
        np.testing.assert_allclose(trace[0, :ends[0] + 1 if ends[0] is not None else n],
                                   logits[0, :ends[0] + 1 if ends[0] is not None else n], atol=EXACT)
    one = generate(model, [1, 2], 12, greedy=True, stop_tokens=int(new[0, 3]))
    assert one.tolist() == [1, 2] + new[0, :new[0].tolist().index(new[0, 3]) + 1].tolist()
    with pytest.raises(ValueError, match="stop_tokens holds token ids outside"):
        generate(model, [1], 3, stop_tokens=[11])


def test_gpt_stream_returning_true_stops_generation():
    model = small_gpt(seed=5)
    seen = []
    out = generate(model, [1, 2], 10, greedy=True, stream=lambda t: seen.append(t) or len(seen) == 3)
    assert len(seen) == 3 and out.tolist() == [1, 2] + seen
    np.testing.assert_array_equal(out, generate(model, [1, 2], 3, greedy=True))


def test_gpt_bad_input():
    model = small_gpt()
    with pytest.raises(ValueError, match="empty prompt"):
        generate(model, [], 5)
    with pytest.raises(ValueError, match="empty prompt"):
        generate(model, np.zeros((1, 0), dtype=int), 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, [1], -1)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, [1], 3, top_p=0)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, [1], 3, top_p=1.5)
    with pytest.raises(ValueError, match="top_k"):
        generate(model, [1], 3, top_k=0)
    with pytest.raises(ValueError, match="shift"):
        generate(model, [1], 3, shift=9)
    with pytest.raises(ValueError, match="outside"):
        generate(model, [1, 11], 3)


# -- encoder-decoder decoding -----------------------------------------------------------
BOS, EOS = 1, 2
SRC = np.array([[5, 6, 7, 0, 0], [3, 4, 5, 6, 7], [9, 0, 0, 0, 0]])


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_cached_equals_recomputed(norm_first):
    model = small_transformer(norm_first=norm_first, tgt_pad_id=0)
    out_c, log_c = greedy_decode(model, SRC, 12, BOS, EOS, return_logits=True)
    out_u, log_u = greedy_decode(model, SRC, 12, BOS, EOS, use_cache=False, return_logits=True)
    assert out_c == out_u and log_c.shape[0] == 3 and log_c.shape[2] == 7
    np.testing.assert_allclose(log_c, log_u, rtol=0, atol=EXACT)
    s_c, log_c = sample_decode(model, SRC, 12, BOS, EOS, rng=R(4), top_p=0.9, return_logits=True)
    s_u, log_u = sample_decode(model, SRC, 12, BOS, EOS, rng=R(4), top_p=0.9, use_cache=False, return_logits=True)
    assert s_c == s_u
    np.testing.assert_allclose(log_c, log_u, rtol=0, atol=EXACT)
    b_c = beam_search(model, SRC, 3, 12, BOS, EOS, return_scores=True)
    b_u = beam_search(model, SRC, 3, 12, BOS, EOS, use_cache=False, return_scores=True)
    assert b_c[0] == b_u[0]
    np.testing.assert_allclose(b_c[1], b_u[1], rtol=0, atol=EXACT)


def test_padded_batch_decodes_as_single_sentences():
    model = small_transformer(seed=1)
    batch = greedy_decode(model, SRC, 10, BOS, EOS)
    beams = beam_search(model, SRC, 3, 10, BOS, EOS)
    for row, g, b in zip(SRC, batch, beams):
        single = row[row != 0]
        assert greedy_decode(model, single, 10, BOS, EOS) == g
        assert beam_search(model, single, 3, 10, BOS, EOS) == b
    assert all(EOS not in seq for seq in batch)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_size_1_equals_greedy(seed):
    model = small_transformer(seed=seed, flatten=0.2)
    greedy = greedy_decode(model, SRC, 12, BOS, EOS)
    for early_stopping in (False, True):
        for alpha in (0.0, 1.0, 2.0):
            assert beam_search(model, SRC, 1, 12, BOS, EOS, length_penalty=alpha,
                               early_stopping=early_stopping) == greedy


def teacher_forced_score(model, src, tokens, eos_id, alpha, max_length):
    """sum log p(tokens [+ eos]) / length**alpha, by one full forward pass."""
    ended = len(tokens) < max_length
    tgt = [BOS] + list(tokens)
    targets = list(tokens) + ([eos_id] if ended else [])
    logits = model(np.asarray(src)[None], np.asarray(tgt[:len(targets)])[None])[0]
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    total = logp[np.arange(len(targets)), targets].sum()
    return total / len(targets) ** alpha


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_search_scores_and_exhaustive_optimum(alpha):
    model = small_transformer(seed=2, flatten=0.15, tgt_vocab_size=4)
    model.eval()
    src, L = SRC[1], 3
    best, score = beam_search(model, src, 64, L, BOS, EOS, length_penalty=alpha, early_stopping="never",
                              return_scores=True)
    np.testing.assert_allclose(score, teacher_forced_score(model, src, best, EOS, alpha, L), rtol=0, atol=EXACT)
    # with enough beams and exact stopping, beam search is exhaustive: compare with every sequence
    candidates = [list(s) for n in range(L + 1) for s in itertools.product([0, 1, 3], repeat=n)]
    scores = [teacher_forced_score(model, src, s, EOS, alpha, L) for s in candidates]
    assert best == candidates[int(np.argmax(scores))]
    np.testing.assert_allclose(score, max(scores), rtol=0, atol=EXACT)
    # a small beam's reported score is the true score of what it returns
    for seq, sc in zip(*beam_search(model, src, 2, L, BOS, EOS, length_penalty=alpha, n_best=2,
                                    return_scores=True)):
        np.testing.assert_allclose(sc, teacher_forced_score(model, src, seq, EOS, alpha, L), rtol=0, atol=EXACT)


class MarkovDecoder:
    """A decoder whose next-token distribution depends only on the last token (the beam-search protocol)."""

    BOS, EOS, A, B, C = range(5)
    TABLE = {0: {2: 0.55, 3: 0.45}, 2: {1: 0.3, 4: 0.7}, 3: {1: 0.9, 4: 0.1}, 4: {1: 1.0}}

    def __init__(self, n):
        self.last = np.zeros(n, dtype=int)

    def step(self, tokens):
        self.last = np.asarray(tokens)
        out = np.full((len(tokens), 5), -np.inf)
        for i, t in enumerate(self.last):
            for tok, p in self.TABLE.get(int(t), {1: 1.0}).items():
                out[i, tok] = np.log(p)
        return out

    def reorder(self, indices):
        self.last = self.last[indices]


def test_beam_search_beats_greedy_on_a_constructed_case():
    # greedy: A (0.55), C (0.7), eos (1.0)  ->  p = 0.385;  best: B (0.45), eos (0.9)  ->  p = 0.405
    dec = MarkovDecoder(1)
    hyps = _beam_search(dec.step, dec.reorder, 1, 1, 5, MarkovDecoder.BOS, MarkovDecoder.EOS, 0.0, False)
    assert hyps[0][0][1] == [2, 4]
    np.testing.assert_allclose(hyps[0][0][0], np.log(0.385))
    dec = MarkovDecoder(2)
    hyps = _beam_search(dec.step, dec.reorder, 1, 2, 5, MarkovDecoder.BOS, MarkovDecoder.EOS, 0.0, False)
    assert hyps[0][0][1] == [3]
    np.testing.assert_allclose(hyps[0][0][0], np.log(0.405))
    assert [h[1] for h in hyps[0]] == [[3], [2, 4]]


def test_transformer_generate_method():
    model = small_transformer(seed=4)
    a = model.generate(SRC, max_length=10, bos_id=BOS, eos_id=EOS, rng=R(0))
    assert a == model.generate(SRC, max_length=10, bos_id=BOS, eos_id=EOS, rng=R(0))
    assert model.generate(SRC, max_length=10, bos_id=BOS, eos_id=EOS, greedy=True) == \
        greedy_decode(model, SRC, 10, BOS, EOS)
    assert model.generate(SRC[0], max_length=10, bos_id=BOS, eos_id=EOS, beam_size=3) == \
        beam_search(model, SRC[0], 3, 10, BOS, EOS)
    assert model.training                                # restored after generation
    with pytest.raises(ValueError, match="bos_id and eos_id"):
        model.generate(SRC)


def test_transformer_generate_seed_call_with_temperature():
    """The seed README's call, model.generate(src, max_length, temperature), with the model's own bos/eos."""
    model = small_transformer(seed=4, bos_id=BOS, eos_id=EOS)
    assert (model.bos_id, model.eos_id) == (BOS, EOS)
    greedy = greedy_decode(model, SRC, 10, BOS, EOS)
    # positional as in the seed: max_length, temperature; a fixed seed or Generator state repeats
    a = model.generate(SRC, 10, 0.7, rng=0)
    assert a == model.generate(SRC, 10, 0.7, rng=0) == model.generate(SRC, 10, 0.7, rng=R(0))
    assert a == sample_decode(model, SRC, 10, BOS, EOS, temperature=0.7, rng=0)
    assert a != greedy                                   # it samples (flattened outputs: 0.7 is far from argmax)
    assert [model.generate(SRC, 10, 0.7, rng=s) for s in range(5)] != [a] * 5
    # temperature -> 0 is greedy decoding; 0 itself means greedy
    assert model.generate(SRC, max_length=10, temperature=0) == greedy
    for seed in range(5):
        assert model.generate(SRC, max_length=10, temperature=1e-6, rng=seed) == greedy
    assert model.generate(SRC[1], 10, greedy=True) == greedy[1]
    assert model.generate(SRC[1], 10, beam_size=3) == beam_search(model, SRC[1], 3, 10, BOS, EOS)
    # explicit ids still win over the model's own
    assert model.generate(SRC, 10, greedy=True, bos_id=3, eos_id=EOS) == greedy_decode(model, SRC, 10, 3, EOS)
    assert model.training                                # restored after generation
    with pytest.raises(ValueError, match="eos_id must be None or a token id"):
        small_transformer(bos_id=BOS, eos_id=7)          # tgt_vocab_size is 7


def test_seq2seq_bad_input():
    model = small_transformer()
    with pytest.raises(ValueError, match="empty src"):
        greedy_decode(model, [], 5, BOS, EOS)
    with pytest.raises(ValueError, match="max_length"):
        greedy_decode(model, SRC, 17, BOS, EOS)
    with pytest.raises(ValueError, match="max_length"):
        sample_decode(model, SRC, -1, BOS, EOS)
    with pytest.raises(ValueError, match="eos_id"):
        beam_search(model, SRC, 2, 5, BOS, 7)
    with pytest.raises(ValueError, match="n_best"):
        beam_search(model, SRC, 2, 5, BOS, EOS, n_best=3)
    with pytest.raises(ValueError, match="top_k"):
        sample_decode(model, SRC, 5, BOS, EOS, top_k=0)
    assert greedy_decode(model, SRC, 0, BOS, EOS) == [[], [], []]
