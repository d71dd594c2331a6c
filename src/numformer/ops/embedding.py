"""Token embedding lookup  x_i = E[t_i, :]."""
from __future__ import annotations

import numpy as np


def embedding_forward(ids, E):
    """ids: integer array (...), E: (V, d)   ->   y: (..., d) with y[...] = E[ids[...]]."""
    return E[ids], (ids, E.shape)


def embedding_backward(dy, cache, out=None):
    """dE[v] = Σ over positions p with ids[p] == v of dy[p].

    dy: (..., d)  ->  dE: (V, d). Rows are scattered with one ``np.add.at`` call
    (no Python loop over tokens). If ``out`` is given the gradient is added
    into it in place and it is returned (used for tied weights).
    """
    ids, E_shape = cache
    dE = np.zeros(E_shape, dtype=dy.dtype) if out is None else out
    np.add.at(dE, ids.reshape(-1), dy.reshape(-1, E_shape[1]))
    return dE
