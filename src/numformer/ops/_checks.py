"""The input an op takes: an array-like made an array, and an op that needs a feature axis refusing a 0-d one.

Elementwise ops (ReLU, GELU, SiLU, dropout, erf, softmax over a 0-d array) take any shape, a 0-d array and
a Python number included, as NumPy's ufuncs and torch's elementwise functions do. An op that reads its
input as (..., d) -- a linear map, a normalization, cross-entropy over classes -- needs that last axis:
a 0-d input is one ValueError naming the op, as torch refuses it (``torch.nn.functional.linear`` and
``layer_norm`` need at least one dimension).
"""
from __future__ import annotations

import numpy as np


def with_features(x, op, layout="(..., d)"):
    """``x`` as an array of shape ``layout`` (at least one axis); a 0-d input is a ValueError naming ``op``."""
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError(f"{op} expects an input of shape {layout} with at least one axis, got a 0-d array "
                         f"(a single number); give it as an array of shape (1,) for one feature")
    return x
