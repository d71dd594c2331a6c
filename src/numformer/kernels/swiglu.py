"""Reference: ``numformer.ops.swiglu`` (the SwiGLU feed-forward, Llama's MLP).

The speed path: the same computation with the three projections on the linear kernel
(``kernels.linear``: products split across threads, dx and dW concurrently) and the two input gradients
summed in place. SiLU is the reference's.
"""
from __future__ import annotations

from ..ops.swiglu import silu_backward, silu_forward
from .linear import linear_backward, linear_forward


def swiglu_forward(x, w_gate, w_up, w_down, b_gate=None, b_up=None, b_down=None):
    """(SiLU(x W_gateᵀ) ⊙ (x W_upᵀ)) W_downᵀ, as ``ops.swiglu_forward``: (..., d_model) -> (..., d_model)."""
    a, c_gate = linear_forward(x, w_gate, b_gate)
    b, c_up = linear_forward(x, w_up, b_up)
    g, c_silu = silu_forward(a)
    h = g * b
    y, c_down = linear_forward(h, w_down, b_down)
    return y, (c_gate, c_up, c_down, c_silu, g, b)


def swiglu_backward(dy, cache):
    """As ``ops.swiglu_backward``: (dx, dW_gate, dW_up, dW_down, db_gate, db_up, db_down)."""
    c_gate, c_up, c_down, c_silu, g, b = cache
    dh, dw_down, db_down = linear_backward(dy, c_down)
    da = silu_backward(dh * b, c_silu)
    dbv = dh * g
    dx, dw_gate, db_gate = linear_backward(da, c_gate)
    dx_up, dw_up, db_up = linear_backward(dbv, c_up)
    dx += dx_up
    return dx, dw_gate, dw_up, dw_down, db_gate, db_up, db_down


__all__ = ["swiglu_forward", "swiglu_backward", "silu_forward", "silu_backward"]
