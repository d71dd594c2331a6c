"""ALiBi, attention with linear biases (Press, Smith & Lewis 2022, "Train Short, Test Long").

No position is added to the tokens; instead each head h adds to its scores a
penalty proportional to the query-key distance:

    S_hij ← S_hij - m_h · |(i + offset) - j|

(for causal attention j <= i + offset, so this is the paper's m_h · (j - i)).
``offset`` is the number of cached positions before the queries. The head
slopes m_h form a geometric sequence; for h heads, h a power of 2,

    m_k = 2^(-8k/h),  k = 1 … h          (h = 8: 1/2, 1/4, …, 1/256)

and otherwise the slopes of the nearest lower power of 2, p, followed by every
other slope of 2p (the paper's code and Hugging Face's BLOOM/MPT).
The bias has no parameters, but its backward pass also returns the gradient
of the slopes, so learned slopes are possible:

    dS = dY        dm_h = -Σ_{b,i,j} dY_bhij · |(i + offset) - j|
"""
from __future__ import annotations

import math

import numpy as np

from ._checks import with_features


def alibi_slopes(n_heads):
    """The n_heads slopes m_h (float64, shape (n_heads,)); any positive head count.

    Largest first for a power of 2; otherwise the p slopes of the lower power of 2 come first, largest first,
    then the extra slopes taken from 2p (6 heads: 1/4, 1/16, 1/64, 1/256, 1/2, 1/8).
    """
    if int(n_heads) != n_heads or n_heads < 1:
        raise ValueError(f"ALiBi needs a positive number of heads, got {n_heads!r}")
    n_heads = int(n_heads)

    def power_of_2(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (k + 1) for k in range(n)]

    p = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = power_of_2(p)
    if p != n_heads:
        slopes += list(alibi_slopes(2 * p)[0::2][:n_heads - p])
    return np.asarray(slopes, dtype=np.float64)


def alibi_distance(t_q, t_k, offset=0, dtype=np.float64, q0=0, k0=0):
    """|(i + offset) - j| for queries i = q0 … q0+t_q-1 and keys j = k0 … k0+t_k-1: shape (t_q, t_k).

    (q0, k0 select a block, as the memory-efficient kernel needs.)
    """
    i = np.arange(q0, q0 + t_q)[:, None] + offset
    j = np.arange(k0, k0 + t_k)[None, :]
    return np.abs(i - j).astype(dtype)


def alibi_bias(slopes, t_q, t_k, offset=0, dtype=np.float64):
    """The additive bias -m_h · |(i + offset) - j|: shape (H, t_q, t_k)."""
    slopes = with_features(slopes, "alibi_bias", "(heads,)").astype(dtype, copy=False)
    return -slopes[:, None, None] * alibi_distance(t_q, t_k, offset, dtype)


def alibi_forward(scores, slopes, offset=0):
    """scores: (..., H, Tq, Tk), slopes: (H,) -> (scores + bias, cache); masks are applied afterwards.

    offset: the number of cached positions before the queries (query i sits at position i + offset).
    """
    scores = np.asarray(scores)
    if scores.ndim < 3 or scores.shape[-3] != np.shape(slopes)[0]:
        raise ValueError(f"ALiBi scores must have shape (..., heads={np.shape(slopes)[0]}, Tq, Tk), "
                         f"got {scores.shape}")
    t_q, t_k = scores.shape[-2:]
    y = scores + alibi_bias(slopes, t_q, t_k, offset, scores.dtype)
    return y, (t_q, t_k, offset, scores.shape)


def alibi_backward(dy, cache):
    """(dscores, dslopes): dscores = dy (..., H, Tq, Tk), dslopes_h = -Σ dy_…hij · |(i + offset) - j| (H,)."""
    t_q, t_k, offset, shape = cache
    dist = alibi_distance(t_q, t_k, offset, dy.dtype)
    per_head = dy.reshape(-1, shape[-3], t_q, t_k).sum(axis=0)
    return dy, -np.einsum("hij,ij->h", per_head, dist)
