"""Reference: ``numformer.ops.embedding`` (x_i = E[t_i, :] and dE[v] = Σ_{p: t_p = v} dy_p).

The speed path of the backward scatter, with no Python loop over tokens: a small vocabulary (V <= 512)
scatters with one matrix product onehot(ids)ᵀ dy; a larger one with a single ``np.add.at`` on the flattened
table (element index id·d + j), several times faster than ``np.add.at`` on rows. ``out`` adds the gradient
into an existing array in place (tied weights). The forward is the reference's.
"""
from __future__ import annotations

import numpy as np

from ..ops.embedding import embedding_forward

# Vocabularies up to this size scatter with a one-hot matrix product.
_ONE_HOT_MAX_VOCAB = 512


def embedding_backward(dy, cache, out=None):
    """dE[v] = Σ over positions p with ids[p] == v of dy[p], as ``ops.embedding_backward``.

    dy: (..., d)  ->  dE: (V, d). If ``out`` is given the gradient is added into it in place and it is
    returned (used for tied weights).
    """
    ids, E_shape = cache
    V, d = E_shape
    flat = ids.reshape(-1)
    dy2 = dy.reshape(-1, d)
    n = flat.size
    if n and V <= _ONE_HOT_MAX_VOCAB:
        onehot = np.zeros((V, n), dtype=dy2.dtype)
        onehot[flat, np.arange(n)] = 1
        if out is None:
            return onehot @ dy2
        out += onehot @ dy2
        return out
    dE = np.zeros(E_shape, dtype=dy.dtype) if out is None else out
    if n and dE.flags.c_contiguous:
        index = (flat[:, None] * d + np.arange(d)).reshape(-1)
        np.add.at(dE.reshape(-1), index, np.ascontiguousarray(dy2, dtype=dE.dtype).reshape(-1))
    elif n:
        np.add.at(dE, flat, dy2)
    return dE


__all__ = ["embedding_forward", "embedding_backward"]
