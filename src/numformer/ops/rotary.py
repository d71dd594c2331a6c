"""Rotary position embeddings, RoPE (Su et al. 2021, "RoFormer"), in Llama's half-split layout.

Each head vector x ∈ ℝ^d (d even) is split into halves x = [x₁, x₂] and the
pair (x₁[i], x₂[i]) is rotated by the angle p·θ_i, p the token's position:

    θ_i = base^(-2i/d),  i = 0 … d/2-1          (base = ``rope_theta``, 10000 in Llama)
    RoPE(x, p) = x ⊙ cos(p θ) + rotate_half(x) ⊙ sin(p θ),   rotate_half([x₁, x₂]) = [-x₂, x₁]

with cos/sin repeated over both halves, as Hugging Face's ``apply_rotary_pos_emb``
(GPT-NeoX and Llama; the original RoFormer interleaves the pairs instead).
Applied to queries and keys, the score q_pᵀ k_s then depends on p - s only.
With a key/value cache the new tokens' positions start after the cached ones
(``offset``).

Shapes: x, y and dy (..., T, d); cos and sin (T, d), or (B, T, d) for positions (B, T)
((B, 1, T, d) against x (B, H, T, d)), each times the attention factor a below. As a
column, each pair is multiplied by a 2 × 2 matrix, and the backward pass multiplies dy's
pair by its transpose:

    [y₁[i], y₂[i]]ᵀ = a·R(pθ_i) [x₁[i], x₂[i]]ᵀ,     R(φ) = [[cos φ, -sin φ], [sin φ, cos φ]]
    [dx₁[i], dx₂[i]]ᵀ = a·R(pθ_i)ᵀ [dy₁[i], dy₂[i]]ᵀ,  that is
    dx = dy ⊙ cos + rotate_halfᵀ(dy ⊙ sin),          rotate_halfᵀ = -rotate_half

Plain RoPE has a = 1, and R is orthogonal: Rᵀ = R⁻¹ = R(-pθ_i), the backward rotates dy
back. Scaled RoPE (``scaling``, a ``RopeScaling`` of ``ops.rope_scaling``: linear, dynamic,
llama3, yarn) replaces θ by the scaled θ' and multiplies cos and sin by its attention factor
a (YaRN; 1 for the others). a·R is then a rotation times a constant, and the backward a·Rᵀ
is the rotation back times the same a (not the inverse of a·R). "dynamic" depends on the
sequence length, taken as the largest position + 1 of the call, as transformers takes it.
"""
from __future__ import annotations

import numpy as np

from ._checks import with_features
from .rope_scaling import rope_inverse_frequencies


def rope_angles(positions, head_dim, theta=10000.0, dtype=np.float64, scaling=None):
    """cos and sin of p·θ_i for each position, repeated over both halves: each (*positions.shape, head_dim).

    positions: integer array (T,) or (B, T) (or any shape); computed in float64, then cast to ``dtype``.
    head_dim: d, even.  theta: the base (``rope_theta``).
    scaling: a ``RopeScaling`` (θ → θ', cos and sin times the attention factor), or None for plain RoPE.
    """
    positions = np.asarray(positions)
    seq_len = int(positions.max()) + 1 if scaling is not None and positions.size else None
    inv_freq, attention_factor = rope_inverse_frequencies(head_dim, theta, scaling, seq_len)   # (d/2,)
    angles = positions.astype(np.float64)[..., None] * inv_freq                               # (..., d/2)
    angles = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(angles), np.sin(angles)
    if attention_factor != 1.0:
        cos *= attention_factor
        sin *= attention_factor
    return cos.astype(dtype), sin.astype(dtype)


def rotate_half(x):
    """[x₁, x₂] -> [-x₂, x₁] over the last axis (Hugging Face's ``rotate_half``)."""
    x = with_features(x, "rotate_half")
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _rotate_half_t(x):
    """The transpose of rotate_half: [g₁, g₂] -> [g₂, -g₁]."""
    h = x.shape[-1] // 2
    return np.concatenate([x[..., h:], -x[..., :h]], axis=-1)


def rope_forward(x, offset=0, theta=10000.0, positions=None, scaling=None):
    """Rotate queries or keys x: (..., T, d) by their positions; returns (y, cache), y shaped as x.

    The positions are offset … offset+T-1 (``offset`` = number of cached
    positions), or ``positions`` given explicitly: (T,) or (B, T) for x of shape
    (B, H, T, d) (e.g. per-sequence positions of left-padded prompts).
    y = x ⊙ cos + rotate_half(x) ⊙ sin, each pair times a·R(pθ_i) (the module docstring); the cache is
    (cos, sin): a·cos(pθ) and a·sin(pθ) (a ≠ 1 only under YaRN scaling).
    theta: the base (``rope_theta``).  scaling: a ``RopeScaling`` (scaled RoPE, see the module docstring), or None.
    """
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"rope_forward expects (..., T, head_dim), got shape {x.shape}")
    t = x.shape[-2]
    if positions is None:
        positions = np.arange(offset, offset + t)
    positions = np.asarray(positions)
    if positions.shape[-1] != t:
        raise ValueError(f"positions of shape {positions.shape} do not match the sequence length {t}")
    dtype = x.dtype if x.dtype.kind == "f" else np.float64
    cos, sin = rope_angles(positions, x.shape[-1], theta, dtype, scaling)
    if positions.ndim == 2 and x.ndim == 4:                    # (B, T, d) -> (B, 1, T, d) for the head axis
        cos, sin = cos[:, None], sin[:, None]
    y = x * cos
    y += rotate_half(x) * sin
    return y, (cos, sin)


def rope_backward(dy, cache):
    """dx = dy ⊙ cos + rotate_halfᵀ(dy ⊙ sin): each pair of dy times a·R(pθ_i)ᵀ, the transpose of the
    forward's matrix (the rotation back, times the attention factor a; see the module docstring).

    dy: (..., T, d), as the forward's y; cache: the forward's (cos, sin), a included   ->   dx: shaped as dy.
    """
    cos, sin = cache
    dx = dy * cos
    dx += _rotate_half_t(dy * sin)
    return dx
