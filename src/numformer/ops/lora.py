"""The low-rank update of LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

A frozen linear layer h = x W₀ᵀ gets a trainable update of rank r ≪ min(d_in, d_out):

    h = x W₀ᵀ + s · (x Aᵀ) Bᵀ         A: (r, d_in)   B: (d_out, r)   s = α / r  (α / √r with rsLoRA)

This op computes the update Δh = s · (x Aᵀ) Bᵀ alone; the adapted layer adds it to the frozen layer's output
(``numformer.lora.LoRALinear``). Computing x Aᵀ first costs r·(d_in + d_out) per position, never the full
d_out × d_in product B A. With u = x Aᵀ (..., r) the gradients are

    dB = s · Σ dΔhᵀ u        du = s · dΔh B        dA = Σ duᵀ x        dx = du A

(Σ over every leading position). Stored as PEFT stores them: A (r, d_in) and B (d_out, r), the scaling kept
apart, never folded into A or B.
"""
from __future__ import annotations

from ._checks import with_features


def lora_forward(x, A, B, scaling):
    """Δh = s · (x Aᵀ) Bᵀ.

    x: (..., d_in)   A: (r, d_in)   B: (d_out, r)   scaling s: float   ->   Δh: (..., d_out)
    """
    x = with_features(x, "lora", "(..., d_in)")
    u = x @ A.T                                        # (..., r) the input in the rank-r subspace
    return scaling * (u @ B.T), (x, u, A, B, scaling)


def lora_backward(dy, cache):
    """Gradients of Δh = s · (x Aᵀ) Bᵀ: returns (dx, dA, dB).

    du = s · dΔh B      dB = s · dΔhᵀ u      dA = duᵀ x      dx = du A    (dB, dA summed over leading axes)

    dy: (..., d_out)   ->   dx: (..., d_in)   dA: (r, d_in)   dB: (d_out, r)
    """
    x, u, A, B, s = cache
    dy2 = dy.reshape(-1, B.shape[0])                   # (N, d_out), N = all leading positions
    u2 = u.reshape(-1, A.shape[0])                     # (N, r)
    du2 = s * (dy2 @ B)                                # (N, r)
    dB = s * (dy2.T @ u2)                              # (d_out, r)
    dA = du2.T @ x.reshape(-1, A.shape[1])             # (r, d_in)
    dx = (du2 @ A).reshape(x.shape)                    # (..., d_in)
    return dx, dA, dB
