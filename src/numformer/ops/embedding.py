"""Token embedding lookup  x_i = E[t_i, :]."""
from __future__ import annotations

import numpy as np


def embedding_forward(ids, E):
    """ids: integer array (...), E: (V, d)   ->   y: (..., d) with y[...] = E[ids[...]]."""
    return E[ids], (ids, E.shape)


def embedding_backward(dy, cache, out=None):
    """dE[v] = Σ over positions p with ids[p] == v of dy[p].

    dy: (..., d)  ->  dE: (V, d), with no Python loop over tokens. A small
    vocabulary (V <= 1024) scatters with one matrix product onehot(ids)ᵀ dy;
    a large one sorts the ids and sums each run of equal ids with
    ``np.add.reduceat`` (both far faster than ``np.add.at``). If ``out`` is
    given the gradient is added into it in place and it is returned (used for
    tied weights).
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
    if n:
        order = np.argsort(flat, kind="stable")
        sorted_ids = flat[order]
        starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
        dE[sorted_ids[starts]] += np.add.reduceat(dy2[order], starts, axis=0)
    return dE


_ONE_HOT_MAX_VOCAB = 1024
