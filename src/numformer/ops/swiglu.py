"""SiLU and the gated feed-forwards (Shazeer 2020, "GLU Variants Improve Transformer"): SwiGLU (Llama's MLP)
and GeGLU (Gemma's MLP).

    SiLU(a) = a σ(a)                                  (also called Swish-1)
    FFN_SwiGLU(x) = (SiLU(x W_gateᵀ) ⊙ (x W_upᵀ)) W_downᵀ
    FFN_GeGLU(x)  = (GELU_tanh(x W_gateᵀ) ⊙ (x W_upᵀ)) W_downᵀ

Weights use the torch.nn.Linear layout (out_features, in_features):
W_gate, W_up: (d_ff, d_model), W_down: (d_model, d_ff). With a = x W_gateᵀ,
b = x W_upᵀ, s = σ(a), g = a s and h = g ⊙ b, the backward pass is

    dh = dy W_down      dW_down = dyᵀ h
    dg = dh ⊙ b         db = dh ⊙ g          da = dg ⊙ (s + a s (1 - s))
    dx = da W_gate + db W_up      dW_gate = daᵀ x      dW_up = dbᵀ x

The gated product h = SiLU(a) ⊙ b and its backward are one op pair (``silu_gate_forward/backward``),
the part of the feed-forward between its three linear maps; GeGLU's h = GELU_tanh(a) ⊙ b is the pair
``gelu_gate_forward/backward`` (the same backward with GELU's derivative in place of SiLU's). These are
the references; the speed path of SiLU and of the SiLU gate is ``numformer.kernels.swiglu``.
"""
from __future__ import annotations

import numpy as np

from ._checks import with_features
from .activations import gelu_tanh
from .linear import linear_backward, linear_forward


def _sigmoid(a):
    """σ(a) = 1 / (1 + exp(-a)), without overflow warnings for large |a|."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-a))


def silu_forward(x):
    """SiLU(x) = x σ(x), elementwise: x any shape, y shaped as x; returns (y, cache), the cache the derivative
    σ(x) (1 + x (1 - σ(x)))."""
    x = np.asarray(x)
    s = _sigmoid(x)
    y = x * s
    return y, s * (1.0 + x * (1.0 - s))


def silu_backward(dy, cache):
    """dx = dy ⊙ SiLU'(x)."""
    return dy * cache


def silu_gate_forward(a, b):
    """h = SiLU(a) ⊙ b, the gated hidden layer of SwiGLU (a = x W_gateᵀ, b = x W_upᵀ); returns (h, cache).

    a, b: (..., d_ff)   ->   h: (..., d_ff); the cache is (g, SiLU'(a), b) with g = SiLU(a).
    """
    g, dsilu = silu_forward(a)
    return g * b, (g, dsilu, b)


def silu_gate_backward(dh, cache):
    """da = dh ⊙ b ⊙ SiLU'(a), db = dh ⊙ SiLU(a). Returns (da, db)."""
    g, dsilu, b = cache
    return silu_backward(dh * b, dsilu), dh * g


def gelu_gate_forward(a, b):
    """h = GELU_tanh(a) ⊙ b, the gated hidden layer of GeGLU (a = x W_gateᵀ, b = x W_upᵀ); returns (h, cache).

    a, b: (..., d_ff)   ->   h: (..., d_ff); the cache is (g, GELU_tanh'(a), b) with g = GELU_tanh(a)
    (the tanh approximation, as Gemma's ``gelu_pytorch_tanh``).
    """
    g, dgelu = gelu_tanh(a)
    return g * b, (g, dgelu, b)


def gelu_gate_backward(dh, cache):
    """da = dh ⊙ b ⊙ GELU_tanh'(a), db = dh ⊙ GELU_tanh(a). Returns (da, db)."""
    g, dgelu, b = cache
    return dh * b * dgelu, dh * g


def swiglu_forward(x, w_gate, w_up, w_down, b_gate=None, b_up=None, b_down=None):
    """x: (..., d_model) -> (..., d_model) through the gated hidden layer of size d_ff; returns (y, cache).

    w_gate, w_up: (d_ff, d_model)   w_down: (d_model, d_ff)   (torch.nn.Linear layout)
    Optional biases b_gate, b_up: (d_ff,), b_down: (d_model,) (Llama has none).
    """
    x = with_features(x, "swiglu_forward", "(..., d_model)")
    a, c_gate = linear_forward(x, w_gate, b_gate)
    b, c_up = linear_forward(x, w_up, b_up)
    h, c_h = silu_gate_forward(a, b)
    y, c_down = linear_forward(h, w_down, b_down)
    return y, (c_gate, c_up, c_down, c_h)


def swiglu_backward(dy, cache):
    """Returns (dx, dW_gate, dW_up, dW_down, db_gate, db_up, db_down), shaped as x and the weights and biases
    (the equations of the module docstring); the bias gradients are None without biases."""
    c_gate, c_up, c_down, c_h = cache
    dh, dw_down, db_down = linear_backward(dy, c_down)
    da, dbv = silu_gate_backward(dh, c_h)
    dx_gate, dw_gate, db_gate = linear_backward(da, c_gate)
    dx_up, dw_up, db_up = linear_backward(dbv, c_up)
    return dx_gate + dx_up, dw_gate, dw_up, dw_down, db_gate, db_up, db_down
