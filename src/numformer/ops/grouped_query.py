"""Grouped-query attention helpers (Ainslie et al. 2023, "GQA"; multi-query attention, Shazeer 2019).

With n_heads query heads and n_kv_heads key/value heads (n_kv_heads divides
n_heads; n_kv_heads = 1 is multi-query attention), query head h reads the
key/value head h // r, r = n_heads / n_kv_heads. The key/value projections and
the KV cache hold only n_kv_heads heads; before the attention kernel each one
is repeated r times (Hugging Face's ``repeat_kv``):

    forward:   K'[b, g·r + t] = K[b, g]              t = 0 … r-1
    backward:  dK[b, g] = Σ_t dK'[b, g·r + t]       (a shared head sums its users' gradients)
"""
from __future__ import annotations

import numpy as np


def check_kv_heads(n_heads, n_kv_heads):
    """Raise one clear ValueError unless n_kv_heads is a positive divisor of n_heads."""
    if int(n_kv_heads) != n_kv_heads or n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads!r} must divide n_heads={n_heads} (each key/value head serves "
                         f"n_heads / n_kv_heads query heads); choose a divisor such as 1 or {n_heads}")


def repeat_kv_forward(x, n_rep):
    """(B, H_kv, T, d) -> (B, H_kv·n_rep, T, d), each head repeated n_rep times in place; returns (y, cache).

    n_rep = 1 returns x itself (no copy).
    """
    x = np.asarray(x)
    if x.ndim != 4:
        raise ValueError(f"repeat_kv expects (batch, kv_heads, seq, head_dim), got shape {x.shape}")
    if n_rep == 1:
        return x, (1, x.shape)
    B, H, T, d = x.shape
    y = np.broadcast_to(x[:, :, None], (B, H, n_rep, T, d)).reshape(B, H * n_rep, T, d)
    return y, (n_rep, x.shape)


def repeat_kv_backward(dy, cache):
    """dx[b, g] = Σ_t dy[b, g·n_rep + t]: shape (B, H_kv, T, d)."""
    n_rep, shape = cache
    if n_rep == 1:
        return dy
    B, H, T, d = shape
    return dy.reshape(B, H, n_rep, T, d).sum(axis=2)
