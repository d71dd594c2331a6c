"""Bad input to the library (sampling, model constructors, backward, softmax) is one clear error, never a
wrong answer or an unrelated exception."""
from __future__ import annotations

import numpy as np
import pytest

from numformer import GPT, Transformer, nn, ops
from numformer.models import EncoderClassifier
from numformer.sampling import sample_next


@pytest.mark.parametrize("greedy", [False, True])
def test_sample_next_rejects_nan_and_all_minus_inf_logits(greedy):
    with pytest.raises(ValueError, match="logits hold NaN"):
        sample_next(np.array([[np.nan, 1.0, 2.0]]), rng=0, greedy=greedy)
    with pytest.raises(ValueError, match="entirely -inf"):
        sample_next(np.array([[0.0, 1.0], [-np.inf, -np.inf]]), rng=0, greedy=greedy)
    assert sample_next(np.array([[-np.inf, 0.0, -np.inf]]), rng=0, greedy=greedy).tolist() == [1]


@pytest.mark.parametrize("build,name", [
    (lambda: GPT(0, 8), "vocab_size"), (lambda: GPT(10, 0), "block_size"), (lambda: GPT(10, 8, d_model=0), "d_model"),
    (lambda: GPT(10, 8, n_layers=-1), "n_layers"), (lambda: GPT(10, 8, n_heads=0), "n_heads"),
    (lambda: GPT(10, 8, d_ff=0), "d_ff"), (lambda: GPT(10.5, 8), "vocab_size"),
    (lambda: EncoderClassifier(10, 0), "n_classes"), (lambda: EncoderClassifier(10, 2, max_len=0), "max_len"),
    (lambda: Transformer(0, 10), "src_vocab_size"), (lambda: Transformer(10, 10, n_decoder_layers=0), "n_decoder_layers"),
])
def test_model_sizes_must_be_positive(build, name):
    with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
        build()


@pytest.mark.parametrize("make", [
    lambda rng: GPT(10, 8, n_layers=1, n_heads=2, d_model=8, rng=rng),
    lambda rng: EncoderClassifier(10, 2, d_model=8, n_heads=2, rng=rng),
    lambda rng: Transformer(10, 10, d_model=8, n_heads=2, n_layers=1, d_ff=16, rng=rng),
])
def test_every_constructor_takes_a_seed_or_a_generator(make):
    a, b = make(0), make(np.random.default_rng(0))
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert np.array_equal(p.data, q.data), n
    with pytest.raises(ValueError, match="rng must be a numpy.random.Generator, an integer seed or None"):
        make("seed")


def test_backward_before_forward_and_with_a_wrong_shape():
    m = GPT(10, 8, n_layers=1, n_heads=2, d_model=8, rng=0)
    with pytest.raises(RuntimeError, match="backward called without a forward pass"):
        m.backward(np.zeros((1, 3, 10), np.float32))
    m(np.zeros((2, 3), dtype=int))
    with pytest.raises(ValueError, match=r"the gradient must have the shape of the forward output \(2, 3, 10\), "
                                         r"got \(2, 3, 9\)"):
        m.backward(np.zeros((2, 3, 9), np.float32))
    m.backward(np.zeros((2, 3, 10), np.float32))              # the pass is still there after a wrong shape
    with pytest.raises(RuntimeError, match="each forward allows one backward"):
        m.backward(np.zeros((2, 3, 10), np.float32))
    m(np.zeros((2, 3), dtype=int), logits_to_keep=1)
    with pytest.raises(RuntimeError, match="backward after a forward with logits_to_keep=1"):
        m.backward(np.zeros((2, 1, 10), np.float32))
    m(np.zeros((2, 3), dtype=int), kv_caches=m.new_kv_caches())
    with pytest.raises(RuntimeError, match="backward after a forward with kv_caches"):
        m.backward(np.zeros((2, 3, 10), np.float32))
    for layer, dy in ((nn.Embedding(10, 4, rng=0), np.ones((1, 2, 4), np.float32)),
                      (nn.MultiHeadAttention(8, 2, rng=0), np.ones((1, 3, 8), np.float32))):
        with pytest.raises(RuntimeError, match="backward called without a forward pass"):
            layer.backward(dy)
    c = EncoderClassifier(10, 2, d_model=8, n_heads=2, rng=0)
    with pytest.raises(RuntimeError, match="backward called without a forward pass"):
        c.backward(np.zeros((1, 2), np.float32))


def test_log_softmax_of_an_all_minus_inf_row_is_minus_inf_not_nan():
    x = np.array([[0.0, 1.0, 2.0], [-np.inf, -np.inf, -np.inf]])
    y, cache = ops.log_softmax_forward(x)
    s, _ = ops.softmax_forward(x)
    assert not np.isnan(y).any() and np.all(y[1] == -np.inf)
    assert np.allclose(np.exp(y), s, rtol=1e-12, atol=0)      # consistent with softmax: exp(log 0) = 0
    dx = ops.log_softmax_backward(np.ones_like(x), cache)
    assert not np.isnan(dx).any()
