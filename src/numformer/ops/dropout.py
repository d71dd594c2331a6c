"""Inverted dropout: zero each element with probability p and scale the rest by 1/(1-p)."""
from __future__ import annotations

import numpy as np


def dropout_forward(x, p, rng, training=True):
    """y = x ⊙ m / (1 - p), m_i ~ Bernoulli(1 - p) drawn from ``rng`` (a ``np.random.Generator``), 0 <= p < 1.

    x: any shape   ->   y: shaped as x; returns (y, cache), the cache m / (1 - p) in x's dtype.
    In evaluation (training=False) or with p == 0 this is the identity: (x itself, None).
    """
    x = np.asarray(x)
    if not training or p == 0.0:
        return x, None
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    scale = np.asarray(1.0 / (1.0 - p), dtype=x.dtype)
    mask = (rng.random(x.shape, dtype=np.float32) >= p) * scale
    mask = mask.astype(x.dtype, copy=False)
    return x * mask, mask


def dropout_backward(dy, cache):
    """dx = dy ⊙ m / (1 - p) (dy itself when the cache is None); dx shaped as dy."""
    return dy if cache is None else dy * cache
