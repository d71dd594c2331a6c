"""Argument checks shared by the model constructors."""
from __future__ import annotations

import numpy as np


def check_sizes(model, **sizes):
    """Each size (None skipped) must be a positive integer; one ValueError naming the first that is not."""
    for name, value in sizes.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{model}: {name} must be a positive integer, got {value!r}")
