"""Symmetric absmax weight quantization, the reference: quantize, dequantize, then an ordinary matmul.

A weight matrix W: (N, K) (a linear layer's (out_features, in_features)) is cut into groups of ``g``
consecutive inputs of one output row (``group_size=None``: the whole row, one group per output channel;
when g does not divide K, the last group of each row is shorter). Each group gets one scale, its largest
magnitude mapped to the largest integer:

    s = max |W_group| / q_max        q_max = 2^(bits-1) - 1   (127 for 8 bits)
    q = round(W / s)                 an integer in [-q_max, q_max], stored as int8
    Ŵ = s · q                        the dequantized weight; |W - Ŵ| <= s / 2 elementwise

and a quantized linear layer computes y = x Ŵᵀ + b. "Symmetric": zero maps to zero and there is no
offset; -128 is never used, so +w and -w quantize to ±q. The speed path (``numformer.quantize.kernel``)
computes the same product without ever holding Ŵ whole: it dequantizes a block of rows at a time.
"""
from __future__ import annotations

import numpy as np

__all__ = ["quantize", "dequantize", "quantized_linear_forward", "group_width", "qmax"]


def qmax(bits):
    """The largest integer of a symmetric ``bits``-bit grid: 2^(bits-1) - 1 (bits from 2 to 8)."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an integer from 2 to 8 (the values are stored as int8), got {bits!r}")
    return 2 ** (int(bits) - 1) - 1


def group_width(group_size, in_features):
    """Inputs per scale: ``group_size`` (at most ``in_features``), or ``in_features`` for None (one group per
    output channel); one clear error for anything but a positive integer or None."""
    if group_size is None:
        return int(in_features)
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer or None (one scale per output channel), "
                         f"got {group_size!r}")
    return int(min(group_size, in_features))


def quantize(W, bits=8, group_size=None):
    """Quantize a weight matrix per output channel (``group_size=None``) or per group of inputs.

    W: (N, K) float   ->   q: (N, K) int8,  scales: (N, G) of W's dtype, G = ceil(K / g)

        s[n, j] = max_{k in group j} |W[n, k]| / q_max       q[n, k] = round(W[n, k] / s[n, k // g])

    A group of zeros gets the scale 0 (its q are 0). Rounding is to the nearest integer, ties to even.
    """
    W = np.asarray(W)
    if W.ndim != 2 or not np.issubdtype(W.dtype, np.floating):
        raise ValueError(f"quantize expects a 2-D float weight (out_features, in_features), got {W.dtype} "
                         f"of shape {W.shape}")
    top = qmax(bits)
    K = W.shape[1]
    g = group_width(group_size, K)
    scales = np.maximum.reduceat(np.abs(W), np.arange(0, K, g), axis=1) / top      # (N, G)
    per_weight = np.repeat(scales, g, axis=1)[:, :K]                                  # s[n, k // g]
    q = np.rint(W / np.where(per_weight == 0, 1, per_weight))
    return np.clip(q, -top, top).astype(np.int8), scales.astype(W.dtype)


def dequantize(q, scales, group_size=None):
    """Ŵ[n, k] = s[n, k // g] · q[n, k].

    q: (N, K) int8   scales: (N, G)   ->   Ŵ: (N, K) of the scales' dtype
    """
    g = group_width(group_size, q.shape[1])
    return q * np.repeat(scales, g, axis=1)[:, :q.shape[1]]


def quantized_linear_forward(x, q, scales, group_size=None, b=None):
    """y = x Ŵᵀ + b with Ŵ = dequantize(q, scales, group_size): the reference quantized linear layer.

    x: (..., K)   q: (N, K) int8   scales: (N, G)   b: (N,) or None   ->   y: (..., N)
    """
    y = x @ dequantize(q, scales, group_size).T
    if b is not None:
        y = y + b
    return y
