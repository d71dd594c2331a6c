"""Token embedding lookup  x_i = E[t_i, :]."""
from __future__ import annotations

import numpy as np


def embedding_forward(ids, E):
    """ids: integer array (...), E: (V, d)   ->   y: (..., d) with y[...] = E[ids[...]]."""
    return E[ids], (ids, E.shape)


def embedding_backward(dy, cache, out=None):
    """dE[v] = Σ over positions p with ids[p] == v of dy[p].

    dy: (..., d)  ->  dE: (V, d), with no Python loop over tokens. A small
    vocabulary (V <= 512) scatters with one matrix product onehot(ids)ᵀ dy; a
    larger one with a single ``np.add.at`` on the flattened table (element
    index id·d + j), several times faster than ``np.add.at`` on rows. If
    ``out`` is given the gradient is added into it in place and it is returned
    (used for tied weights).
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


_ONE_HOT_MAX_VOCAB = 512
