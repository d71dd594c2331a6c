"""Token embedding lookup  x_i = E[t_i, :]  (the reference; the speed path of the backward scatter is
``numformer.kernels.embedding``)."""
from __future__ import annotations

import numpy as np


def embedding_forward(ids, E):
    """ids: integer array (...), E: (V, d)   ->   y: (..., d) with y[...] = E[ids[...]]; returns (y, cache).

    The ids are not checked: one >= V is NumPy's IndexError, a negative one counts from the end of E
    (``nn.Embedding`` refuses both with a ValueError).
    """
    ids = np.asarray(ids)
    return E[ids], (ids, E.shape)


def embedding_backward(dy, cache):
    """dE[v] = Σ over positions p with ids[p] == v of dy[p].

    dy: (..., d)  ->  dE: (V, d); a token seen twice receives both gradients (``np.add.at`` accumulates).
    """
    ids, (V, d) = cache
    dE = np.zeros((V, d), dtype=dy.dtype)
    np.add.at(dE, ids.reshape(-1), dy.reshape(-1, d))
    return dE
