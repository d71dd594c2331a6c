"""Splitting the model width into attention heads and merging the heads back.

Multi-head attention works on the h heads of width d_h = E / h as one batch axis:

    split:  x (..., T, E)  ->  y (..., h, T, d_h)      y[..., j, t, i] = x[..., t, j·d_h + i]
    merge:  x (..., h, T, d_h)  ->  y (..., T, h·d_h)  the inverse map

Both are a reshape (which only reads the last axis as (h, d_h)) followed by a transpose: each output entry is
one input entry, moved. The map is a permutation P of the entries, y = P x, so L depends on x only through
y and dL/dx_k = dL/dy_(P k): the backward pass moves every gradient entry back to where its input came from,
which is the inverse permutation. The backward of the split is the merge of dy, and the other way round.
"""
from __future__ import annotations

import numpy as np


def split_heads_forward(x, n_heads):
    """x: (..., T, E) -> y: (..., n_heads, T, E / n_heads); returns (y, cache), y a view of x (no copy)."""
    x = np.asarray(x)
    if x.ndim < 2 or n_heads < 1 or x.shape[-1] % n_heads:
        raise ValueError(f"split_heads needs x of shape (..., T, E) with E divisible by n_heads={n_heads}, "
                         f"got shape {x.shape}")
    *lead, t, e = x.shape
    y = x.reshape(*lead, t, n_heads, e // n_heads)              # (..., T, h, d_h): the last axis read as (h, d_h)
    return np.swapaxes(y, -2, -3), n_heads                      # (..., h, T, d_h)


def split_heads_backward(dy, cache):
    """dx = merge(dy): (..., h, T, d_h) -> (..., T, h·d_h)."""
    return _merge(dy)


def merge_heads_forward(x):
    """x: (..., h, T, d_h) -> y: (..., T, h·d_h), the heads side by side; returns (y, cache)."""
    x = np.asarray(x)
    if x.ndim < 3:
        raise ValueError(f"merge_heads needs x of shape (..., heads, T, head_dim), got shape {x.shape}")
    return _merge(x), x.shape[-3]


def merge_heads_backward(dy, cache):
    """dx = split(dy, h): (..., T, h·d_h) -> (..., h, T, d_h)."""
    return split_heads_forward(dy, cache)[0]


def _merge(x):
    *lead, h, t, d = x.shape
    return np.swapaxes(x, -2, -3).reshape(*lead, t, h * d)
