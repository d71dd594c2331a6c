"""The worked numbers of the exercise solutions (seed 002)."""
from __future__ import annotations

import numpy as np

from numformer import nn, ops


def test_attention_basics_solution_1_1():
    """q = [1,0,1] over three keys with equal scores: weights 1/3 each, output [1, 1]."""
    q = np.array([[1.0, 0.0, 1.0]])
    K = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    V = np.array([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    out, w, _ = ops.scaled_dot_product_attention_forward(q, K, V, scale=1.0, need_weights=True)
    np.testing.assert_allclose(w, [[1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_allclose(out, [[1.0, 1.0]])


def test_self_attention_cat_solution_1_3():
    """"The cat sat": "cat" = [0,1] has scores [0, 1, 1] (unscaled dot products, as in the solution).

    The solution prints softmax([0, 1, 1]) as [0.12, 0.44, 0.44]; the exact value is
    [1, e, e] / (1 + 2e) = [0.155, 0.422, 0.422]. The ranking it draws (itself and "sat"
    equally, "The" least) holds; the printed digits are a slip, so we test the exact ones.
    """
    X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    scores = X @ X.T
    np.testing.assert_array_equal(scores[1], [0, 1, 1])
    _, w, _ = ops.scaled_dot_product_attention_forward(X, X, X, scale=1.0, need_weights=True)
    e = np.e
    np.testing.assert_allclose(w[1], [1 / (1 + 2 * e), e / (1 + 2 * e), e / (1 + 2 * e)], rtol=1e-15)
    np.testing.assert_allclose(w[1].round(3), [0.155, 0.422, 0.422])
    assert w[1, 1] == w[1, 2] > w[1, 0]


def test_causal_mask_solution_2_3():
    _, w, _ = ops.scaled_dot_product_attention_forward(np.ones((4, 2)), np.ones((4, 2)), np.eye(4), is_causal=True,
                                                       need_weights=True)
    assert np.all(np.triu(w, k=1) == 0)
    np.testing.assert_allclose(w.sum(-1), 1)


def test_sinusoidal_encoding_solution_4_2():
    pe = nn.sinusoidal_table(3, 4)
    np.testing.assert_allclose(pe[0], [0, 1, 0, 1])
    np.testing.assert_allclose(pe[1], [np.sin(1), np.cos(1), np.sin(0.01), np.cos(0.01)])
    np.testing.assert_allclose(pe[2], [np.sin(2), np.cos(2), np.sin(0.02), np.cos(0.02)])
    np.testing.assert_allclose(pe.round(3), [[0, 1, 0, 1], [0.841, 0.540, 0.010, 1.0], [0.909, -0.416, 0.020, 1.0]])


def test_layer_norm_statistics_solution_5_2():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert x.mean() == 2.5 and x.var() == 1.25
    y, (xhat, rstd, _) = ops.layer_norm_forward(x, np.ones(4), np.zeros(4), eps=0.0)
    np.testing.assert_allclose(rstd, 1 / np.sqrt(1.25))
    np.testing.assert_allclose(y, (x - 2.5) / np.sqrt(1.25))
    np.testing.assert_allclose([y.mean(), y.var()], [0.0, 1.0], atol=1e-12)


def test_multi_head_shapes_solution_3_2():
    m = nn.MultiHeadAttention(8, 2, rng=np.random.default_rng(0))
    assert m.d_head == 4
    x = np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32)
    assert m(x).shape == (1, 4, 8)
    assert m.num_parameters() == 4 * 8 * 8 + 4 * 8
