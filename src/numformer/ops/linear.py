"""Affine map  y = x Wᵀ + b  (the reference; the speed path is ``numformer.kernels.linear``).

W is stored as (d_out, d_in), the layout of ``torch.nn.Linear``; the paper's
projection matrices (x W^Q with W^Q of shape d_model x d_k) are our ``W.T``.
"""
from __future__ import annotations

import numpy as np

from ._checks import with_features


def linear_forward(x, W, b=None):
    """y = x Wᵀ + b.

    x: (..., d_in)   W: (d_out, d_in)   b: (d_out,) or None   ->   y: (..., d_out)
    """
    x = with_features(x, "linear_forward", "(..., d_in)")
    y = x @ W.T                                   # (..., d_out)
    if b is not None:
        y = y + b
    return y, (x, W, b is not None)


def linear_backward(dy, cache, weight_grad=True):
    """Gradients of y = x Wᵀ + b.

    dx = dy W      dW = dyᵀ x (summed over all leading axes)      db = Σ dy

    dy: (..., d_out)   ->   dx: (..., d_in)   dW: (d_out, d_in)   db: (d_out,)
    Returns (dx, dW, db); db is None when the forward had no bias, dW None with ``weight_grad=False``
    (a frozen W: the product is skipped).
    """
    x, W, has_bias = cache
    x2 = x.reshape(-1, W.shape[1])                # (N, d_in), N = all leading positions
    dy2 = dy.reshape(-1, W.shape[0])              # (N, d_out)
    dx = (dy2 @ W).reshape(x.shape)               # (..., d_in)
    dW = dy2.T @ x2 if weight_grad else None      # (d_out, d_in)
    db = dy2.sum(axis=0) if has_bias else None    # (d_out,)
    return dx, dW, db
