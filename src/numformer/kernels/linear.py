"""Reference: ``numformer.ops.linear`` (y = x Wᵀ + b and its gradients).

The speed path: the products are split by rows across numformer's threads when numformer owns the BLAS
threads (``_runtime.matmul``), dx and dW are computed concurrently (``_runtime.matmul_pair``), and the bias
gradient is a BLAS vector-matrix product instead of a reduction over rows. The cache is its own, (x as
(N, d_in), W, has_bias, x's shape): pass it to this module's ``linear_backward``, not the reference's.
"""
from __future__ import annotations

import numpy as np

from .._runtime import matmul, matmul_pair
from ..ops._checks import with_features


def linear_forward(x, W, b=None):
    """y = x Wᵀ + b, as ``ops.linear_forward``.

    x: (..., d_in)   W: (d_out, d_in)   b: (d_out,) or None   ->   y: (..., d_out)

    The leading axes are flattened so that BLAS sees one large 2-D product
    (split by rows across threads when numformer owns the BLAS threads, see
    ``numformer.set_fast_runtime``).
    """
    x = with_features(x, "linear_forward", "(..., d_in)")
    x2 = x.reshape(-1, x.shape[-1])
    y = matmul(x2, W.T)
    if b is not None:
        y += b
    return y.reshape(*x.shape[:-1], W.shape[0]), (x2, W, b is not None, x.shape)


def linear_backward(dy, cache, weight_grad=True):
    """Gradients of y = x Wᵀ + b, as ``ops.linear_backward``.

    dx = dy W      dW = dyᵀ x (summed over all leading axes)      db = Σ dy

    dy: (..., d_out)   ->   dx: (..., d_in)   dW: (d_out, d_in)   db: (d_out,)

    Returns (dx, dW, db); db is None when the forward had no bias, dW None with ``weight_grad=False``.
    """
    x2, W, has_bias, x_shape = cache
    dy2 = dy.reshape(-1, W.shape[0])
    if weight_grad:
        dx, dW = matmul_pair(dy2, W, dy2.T, x2)     # concurrently when numformer owns the BLAS threads
    else:
        dx, dW = matmul(dy2, W), None
    dx = dx.reshape(x_shape)
    # Σ over rows as a BLAS vector-matrix product: much faster than a reduction over axis 0
    db = np.matmul(np.ones(dy2.shape[0], dy2.dtype), dy2) if has_bias else None
    return dx, dW, db
