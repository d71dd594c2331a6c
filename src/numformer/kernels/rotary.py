"""Reference: ``numformer.ops.rotary`` (``rope_forward/backward``, rotary position embeddings, half-split layout).

The speed path: cos(p θ_i) and sin(p θ_i) are computed once per (head size, base, dtype, scaling) for
positions 0 … L-1 (the reference's ``rope_angles``, so the same values; the table grows when a longer sequence or a
larger offset comes) and each call slices its rows, a view. The sign of rotate_half is folded into the sine
tables, and the halves are swapped as two blocks of bytes rather than element by element. With x, y, dy
(..., T, d), cos = a·cos(pθ_i) and sin = a·sin(pθ_i) (T, d/2) for i = 0 … d/2-1 (a: the attention factor, YaRN's;
1 otherwise), each pair (x₁[i], x₂[i]) as a column is multiplied by a·R(pθ_i), R(φ) = [[cos φ, -sin φ],
[sin φ, cos φ]], and the backward multiplies dy's pair by its transpose a·R(pθ_i)ᵀ, as the reference does:

    y = x ⊙ [cos, cos] + [x₂, x₁] ⊙ [-sin, sin]
    dx = dy ⊙ [cos, cos] + [dy₂, dy₁] ⊙ [sin, -sin]         (the rotation back times the same a)

three full-width passes and the swap, in place in two buffers. Queries or keys of several heads stored with the
heads side by side, (..., T, H, d) in memory and seen as (..., H, T, d) (the heads of a fused q/k/v projection),
are rotated in that memory order against tables repeated for the H heads, so that each pass runs along H · d
contiguous numbers instead of d at a time. Explicit ``positions`` (left-padded prompts)
take their rows from the tables by index. A scaled RoPE (``scaling``) has tables of its own; "dynamic"
scaling past its context (frequencies that change with the sequence length) is computed for the call.
"""
from __future__ import annotations

import numpy as np

from ..ops.rotary import rope_angles

_TABLES = {}
_TILED = {}


def _signed(cos, sin):
    """(cos, [-sin₁, sin₂], [sin₁, -sin₂]) from the reference's tables (both halves equal)."""
    h = cos.shape[-1] // 2
    forward = sin.copy()
    forward[..., :h] *= -1
    return cos, forward, -forward


def _tables(length, head_dim, theta, dtype, scaling=None, heads=1):
    """Read-only (cos, forward sine, backward sine), each (≥ length, heads · head_dim), for positions 0, 1, …,
    repeated for ``heads`` heads side by side; cached. ``scaling`` must not depend on the sequence length
    (see ``_fixed_scaling``)."""
    key = (int(head_dim), float(theta), np.dtype(dtype).str, scaling)
    tables = _TABLES.get(key)
    if tables is None or tables[0].shape[0] < length:
        n = max(length, 256, 0 if tables is None else 2 * tables[0].shape[0])
        tables = _signed(*rope_angles(np.arange(n), head_dim, theta, dtype, scaling))
        for t in tables:
            t.setflags(write=False)
        if len(_TABLES) >= 16:
            _TABLES.clear()
        _TABLES[key] = tables
    if heads == 1:
        return tables
    tiled = _TILED.get((key, heads))
    if tiled is None or tiled[0].shape[0] != tables[0].shape[0]:
        tiled = tuple(np.tile(t, (1, heads)) for t in tables)
        for t in tiled:
            t.setflags(write=False)
        if len(_TILED) >= 32:
            _TILED.clear()
        _TILED[(key, heads)] = tiled
    return tiled


def _heads_side_by_side(x):
    """H when x (..., H, T, d), H > 1, is stored as (..., T, H, d) with each position's heads contiguous (a view
    of a fused projection's output), else None."""
    if x.ndim < 3 or x.shape[-3] < 2 or x.strides[-1] != x.itemsize or x.strides[-3] != x.shape[-1] * x.itemsize:
        return None
    return x.shape[-3]


def _fixed_scaling(scaling, seq_len):
    """The scaling whose tables serve a call over ``seq_len`` positions: ``scaling`` itself, None for "dynamic"
    within its context (plain RoPE there), or False for "dynamic" beyond it (no table: computed per call)."""
    if scaling is None or scaling.rope_type != "dynamic":
        return scaling
    return None if seq_len <= scaling.max_position_embeddings else False


def _swap_halves(x):
    """[x₁, x₂] -> [x₂, x₁] over the last axis, a new array: each half moved as one block (a void item of
    its bytes), not element by element."""
    if x.strides[-1] != x.itemsize:
        x = np.ascontiguousarray(x)
    block = np.dtype((np.void, x.shape[-1] // 2 * x.itemsize))
    return np.ascontiguousarray(x.view(block)[..., ::-1]).view(x.dtype)


def _rotate(x, cos, sin, heads=None):
    """x ⊙ cos + swap_halves(x) ⊙ sin, with the sign of the rotation in ``sin``. ``heads``: x's heads are side by
    side in memory (``_heads_side_by_side``) and the tables (T, heads · d) repeated for them."""
    if heads:
        rows = x.swapaxes(-3, -2)                                   # (..., T, H, d) in memory order
        y = np.multiply(rows.reshape(rows.shape[:-2] + (-1,)), cos)   # (..., T, H · d)
        t = _swap_halves(rows).reshape(y.shape)
        t *= sin
        y += t
        return y.reshape(rows.shape).swapaxes(-3, -2)
    y = np.multiply(x, cos)
    t = _swap_halves(x)
    if t.dtype == y.dtype:
        t *= sin
    else:
        t = t * sin
    y += t
    return y


def rope_forward(x, offset=0, theta=10000.0, positions=None, scaling=None):
    """Rotate queries or keys x: (..., T, d) by their positions (``ops.rope_forward``); returns (y, cache).

    Positions offset … offset+T-1, or ``positions`` (T,) or (B, T) for x of shape (B, H, T, d);
    ``theta``: the base (``rope_theta``); ``scaling``: a ``RopeScaling`` or None. y is shaped as x.
    The cache is (cos, backward sine, heads) of the rows used, views of the cached tables (repeated for
    ``heads`` heads side by side, or None).
    """
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"rope_forward expects (..., T, head_dim), got shape {x.shape}")
    t, d = x.shape[-2], x.shape[-1]
    dtype = x.dtype if x.dtype.kind == "f" else np.float64
    fixed = _fixed_scaling(scaling, offset + t)
    if positions is None and offset >= 0 and fixed is not False:
        heads = _heads_side_by_side(x) if x.dtype == dtype else None
        cos, sin, sin_back = (table[offset:offset + t] for table in _tables(offset + t, d, theta, dtype, fixed,
                                                                             heads or 1))
        return _rotate(x, cos, sin, heads), (cos, sin_back, heads)
    positions = np.arange(offset, offset + t) if positions is None else np.asarray(positions)
    if positions.shape[-1] != t:
        raise ValueError(f"positions of shape {positions.shape} do not match the sequence length {t}")
    n = int(positions.max()) + 1 if positions.size else 0
    fixed = _fixed_scaling(scaling, n)
    if positions.size and positions.min() >= 0 and fixed is not False:
        cos, sin, sin_back = (table[positions] for table in _tables(n, d, theta, dtype, fixed))
    else:                                   # negative positions, or dynamic scaling past its context
        cos, sin, sin_back = _signed(*rope_angles(positions, d, theta, dtype, scaling))
    if positions.ndim == 2 and x.ndim == 4:                    # (B, T, d) -> (B, 1, T, d) for the head axis
        cos, sin, sin_back = cos[:, None], sin[:, None], sin_back[:, None]
    return _rotate(x, cos, sin), (cos, sin_back, None)


def rope_backward(dy, cache):
    """dx = dy ⊙ [cos, cos] + [dy₂, dy₁] ⊙ [sin, -sin] (``ops.rope_backward``): each pair of dy times
    a·R(pθ_i)ᵀ, the transpose of the forward's matrix (see the module docstring). dy: (..., T, d); dx shaped as
    dy."""
    cos, sin_back, heads = cache
    dy = np.asarray(dy)
    if heads and _heads_side_by_side(dy) == heads and dy.dtype == cos.dtype:
        return _rotate(dy, cos, sin_back, heads)
    if heads:                                                       # the tables of one head
        cos, sin_back = cos[..., :dy.shape[-1]], sin_back[..., :dy.shape[-1]]
    return _rotate(dy, cos, sin_back)
