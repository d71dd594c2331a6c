"""Scaled dot-product attention (Vaswani et al. 2017, eq. 1):

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V

Mask convention of this *functional* op follows ``torch.nn.functional.
scaled_dot_product_attention``: a boolean mask is True where a query **may
attend** to a key; a float mask is added to the scores (use -inf to block).
The modules in ``numformer.nn`` use the ``torch.nn`` convention instead
(boolean True = masked out) and convert before calling this op.

A query row whose keys are all masked gets all-zero weights, hence a zero
output and zero gradients, never NaN.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._runtime import BLAS_SINGLE_THREAD_MNK, parallel_for
from .activations import softmax_forward


class AttentionCache(NamedTuple):
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    weights: np.ndarray        # softmax probabilities, before dropout: (..., Tq, Tk)
    dropout_mask: np.ndarray | None
    scale: float


def causal_mask(t_q, t_k=None):
    """Boolean (t_q, t_k) mask, True where query i may attend key j (j <= i), aligned top-left as in torch."""
    t_k = t_q if t_k is None else t_k
    return np.tril(np.ones((t_q, t_k), dtype=bool))


def _check_qkv(q, k, v):
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(
            f"q, k, v must have the same number of dimensions (>= 2), got shapes {q.shape}, {k.shape}, {v.shape}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"q, k, v must share their leading (batch, head) axes, got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"queries and keys need the same feature size d_k, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"keys and values need the same length, got {k.shape[-2]} and {v.shape[-2]}")


def apply_mask(scores, attn_mask=None, is_causal=False):
    """Return scores with the masks applied (functional convention: bool True = may attend)."""
    t_q, t_k = scores.shape[-2:]
    if is_causal:
        scores = np.where(causal_mask(t_q, t_k), scores, -np.inf).astype(scores.dtype, copy=False)
    if attn_mask is not None:
        attn_mask = np.asarray(attn_mask)
        if attn_mask.shape[-2:] != (t_q, t_k) and attn_mask.shape[-2:] != (1, t_k):
            raise ValueError(
                f"attn_mask of shape {attn_mask.shape} does not broadcast to the scores (..., {t_q}, {t_k})")
        if attn_mask.dtype == bool:
            scores = np.where(attn_mask, scores, -np.inf).astype(scores.dtype, copy=False)
        else:
            scores = scores + attn_mask.astype(scores.dtype, copy=False)
    return scores


class FastAttentionCache(NamedTuple):
    """Cache of the fused kernel (no dropout): probabilities stored transposed, P^T of shape (..., Tk, Tq)."""
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    weights_t: np.ndarray      # softmax probabilities, transposed: (..., Tk, Tq)
    out: np.ndarray            # the output O = P V (a view of the returned array)
    scale: float


_MASK_CACHE = {}


def _causal_additive_t(t_q, t_k, dtype):
    """Transposed additive causal mask (t_k, t_q): 0 where key j <= query i, -inf elsewhere (read-only, cached)."""
    key = (t_q, t_k, np.dtype(dtype).str)
    m = _MASK_CACHE.get(key)
    if m is None:
        m = np.where(causal_mask(t_q, t_k).T, 0.0, -np.inf).astype(dtype)
        m.setflags(write=False)
        if len(_MASK_CACHE) > 64:
            _MASK_CACHE.clear()
        _MASK_CACHE[key] = m
    return m


def _additive_mask_t(attn_mask, t_q, t_k, dtype):
    """A functional mask (bool True = may attend, or float added) as a transposed additive float mask."""
    attn_mask = np.asarray(attn_mask)
    if attn_mask.shape[-2:] != (t_q, t_k) and attn_mask.shape[-2:] != (1, t_k):
        raise ValueError(
            f"attn_mask of shape {attn_mask.shape} does not broadcast to the scores (..., {t_q}, {t_k})")
    if attn_mask.dtype == bool:
        attn_mask = np.where(attn_mask, 0.0, -np.inf).astype(dtype)
    return np.swapaxes(attn_mask.astype(dtype, copy=False), -1, -2)


def _split_grain(lead, t_q, t_k):
    """Smallest number of leading-axis-0 items worth one thread: about 32K scores."""
    per_item = max(1, math.prod(lead[1:]) * t_q * t_k)
    return max(1, -(-32768 // per_item))


def _take(a, lo, hi, n0):
    """a[lo:hi] along axis 0 when ``a`` has that axis (of length n0) in its leading dims, else ``a`` (broadcast)."""
    return a[lo:hi] if a is not None and a.ndim >= 3 and a.shape[0] == n0 else a


def _products_in_pieces(t_q, t_k, d_k, d_v):
    """Whether the per-head products are small enough for the BLAS to run them on the calling thread, so that
    the pieces of a split may compute them concurrently (see _runtime.BLAS_SINGLE_THREAD_MNK)."""
    return max(t_q, t_k) ** 2 * max(d_k, d_v) <= BLAS_SINGLE_THREAD_MNK


def _softmax_t_inplace(sp, causal, mp):
    """Sᵀ -> Pᵀ in place over the key axis (-2): add the masks, subtract the max, exp, normalize."""
    if causal is not None:
        sp += causal
    if mp is not None:
        sp += mp
    m = np.max(sp, axis=-2, keepdims=True)
    if not np.isfinite(m).all():                  # a query with every key masked: exp(-inf) = 0, no NaN
        m[~np.isfinite(m)] = 0.0
    sp -= m
    np.exp(sp, out=sp)
    z = np.add.reduce(sp, axis=-2)                # Σ over keys, (..., Tq)
    z[z == 0] = 1.0
    np.reciprocal(z, out=z)
    sp *= z[..., None, :]


def fused_attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, out=None):
    """softmax(Q Kᵀ · scale + M) V without dropout, the fast kernel behind
    ``scaled_dot_product_attention_forward``; same conventions (bool mask True = may attend).

    ``out`` (optional, shape (..., Tq, d_v), any strides with a unit last stride)
    receives the result, so a caller can have it written straight into the
    merged-heads layout (B, T, H, d_head). Returns (out, cache).

    The scores are kept transposed, Sᵀ of shape (..., Tk, Tq): the softmax then
    reduces over the second-last axis, which NumPy vectorizes across queries
    (a max along the last axis of short rows is several times slower), and
    every product is a plain BLAS call on the layouts at hand. The first
    leading axis (batch) is split across threads (``numformer.set_num_threads``):
    small heads entirely, larger ones for the softmax only (their products use
    the BLAS's threads). Each item is computed the same way whatever the split.
    """
    _check_qkv(q, k, v)
    t_q, t_k = q.shape[-2], k.shape[-2]
    dt = np.result_type(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    mask_t = None if attn_mask is None else _additive_mask_t(attn_mask, t_q, t_k, dt)
    causal = _causal_additive_t(t_q, t_k, dt) if is_causal else None
    lead = q.shape[:-2] if mask_t is None else np.broadcast_shapes(q.shape[:-2], mask_t.shape[:-2])
    if lead != q.shape[:-2]:                      # a mask with more leading axes than q: broadcast q, k, v
        q, k, v = (np.broadcast_to(a, lead + a.shape[-2:]) for a in (q, k, v))
    if out is None:
        out = np.empty(lead + (t_q, v.shape[-1]), dt)
    sc = dt.type(scale)
    n0 = lead[0] if lead else 1
    grain = _split_grain(lead, t_q, t_k)

    def sl(a, lo, hi):
        return _take(a, lo, hi, n0) if lead else a

    if _products_in_pieces(t_q, t_k, q.shape[-1], v.shape[-1]):
        s = np.empty(lead + (t_k, t_q), dt)       # Sᵀ, then Pᵀ

        def piece(lo, hi):
            sp = sl(s, lo, hi)
            qs_t = np.multiply(np.swapaxes(sl(q, lo, hi), -1, -2), sc, dtype=dt, order="C")   # (Q·scale)ᵀ
            np.matmul(sl(k, lo, hi), qs_t, out=sp)
            _softmax_t_inplace(sp, causal, sl(mask_t, lo, hi))
            np.matmul(np.swapaxes(sp, -1, -2), sl(v, lo, hi), out=sl(out, lo, hi))

        parallel_for(n0, piece, grain) if lead else piece(0, 1)
    else:
        s = np.matmul(k, np.multiply(np.swapaxes(q, -1, -2), sc, dtype=dt, order="C"))   # K (Q·scale)ᵀ = Sᵀ
        if lead:
            parallel_for(n0, lambda lo, hi: _softmax_t_inplace(sl(s, lo, hi), causal, sl(mask_t, lo, hi)), grain)
        else:
            _softmax_t_inplace(s, causal, mask_t)
        np.matmul(np.swapaxes(s, -1, -2), v, out=out)
    return out, FastAttentionCache(q, k, v, s, out, scale)


def fused_attention_backward(dout, cache, dq=None, dk=None, dv=None):
    """Gradients for ``fused_attention_forward``; dq, dk, dv may be given as output arrays (any unit-last-stride
    views, e.g. into a fused (B, T, 3, H, d_head) gradient). Returns (dq, dk, dv).

    dV = Pᵀ dO     dP = dO Vᵀ     dS = P ⊙ (dP - r),  r_i = Σ_j P_ij dP_ij = dO_i · O_i
    dQ = dS K · scale      dK = dSᵀ Q · scale
    (r from the outputs, as in FlashAttention-2: a dot product per query instead of a pass over the scores.)
    """
    q, k, v, p_t, out, scale = cache
    dt = p_t.dtype
    lead = p_t.shape[:-2]
    t_k, t_q = p_t.shape[-2:]
    dq = np.empty(q.shape, dt) if dq is None else dq
    dk = np.empty(k.shape, dt) if dk is None else dk
    dv = np.empty(v.shape, dt) if dv is None else dv
    sc = dt.type(scale)
    n0 = lead[0] if lead else 1
    grain = _split_grain(lead, t_q, t_k)

    def sl(a, lo, hi):
        return a[lo:hi] if lead else a

    # The scale is folded into the contiguous copy of dOᵀ (and r), so dSᵀ comes out scaled: no extra pass.
    if _products_in_pieces(t_q, t_k, q.shape[-1], v.shape[-1]):
        def piece(lo, hi):
            qp, kp, vp, pp, op, gp = (sl(a, lo, hi) for a in (q, k, v, p_t, out, dout))
            np.matmul(pp, gp, out=sl(dv, lo, hi))
            ds_t = np.matmul(vp, np.multiply(np.swapaxes(gp, -1, -2), sc, dtype=dt, order="C"))  # dPᵀ·scale
            r = np.vecdot(gp, op)                                                      # r = dO · O per query
            r *= sc
            ds_t -= r[..., None, :]
            ds_t *= pp                                                                 # dSᵀ · scale
            np.matmul(np.swapaxes(ds_t, -1, -2), kp, out=sl(dq, lo, hi))
            np.matmul(ds_t, qp, out=sl(dk, lo, hi))

        parallel_for(n0, piece, grain) if lead else piece(0, 1)
        return dq, dk, dv
    np.matmul(p_t, dout, out=dv)
    ds_t = np.matmul(v, np.multiply(np.swapaxes(dout, -1, -2), sc, dtype=dt, order="C"))   # dPᵀ · scale
    r = np.vecdot(dout, out)
    r *= sc

    def scores(lo, hi):
        dsp = sl(ds_t, lo, hi)
        dsp -= sl(r, lo, hi)[..., None, :]
        dsp *= sl(p_t, lo, hi)

    parallel_for(n0, scores, grain) if lead else scores(0, 1)
    np.matmul(np.swapaxes(ds_t, -1, -2), k, out=dq)
    np.matmul(ds_t, q, out=dk)
    return dq, dk, dv


def scaled_dot_product_attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None,
                                         dropout_p=0.0, rng=None, need_weights=False):
    """softmax(Q Kᵀ · scale + M) V, batched over all leading axes (batch, heads).

    q: (..., Tq, d_k)   k: (..., Tk, d_k)   v: (..., Tk, d_v)
    attn_mask: broadcastable to (..., Tq, Tk); bool (True = may attend) or float (added).
    is_causal: query i attends keys j <= i (top-left aligned, as torch).
    scale: defaults to 1/√d_k.  dropout_p > 0 drops attention weights (needs ``rng``).

    Returns (out, weights, cache): out (..., Tq, d_v); weights (..., Tq, Tk) if
    need_weights else None (after dropout, as torch returns them).
    """
    if dropout_p == 0.0:
        out, cache = fused_attention_forward(q, k, v, attn_mask, is_causal, scale)
        return out, (np.swapaxes(cache.weights_t, -1, -2) if need_weights else None), cache
    _check_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = q @ np.swapaxes(k, -1, -2)
    scores *= scale
    scores = apply_mask(scores, attn_mask, is_causal)
    weights, _ = softmax_forward(scores, axis=-1)
    drop = None
    if dropout_p > 0.0:
        if rng is None:
            raise ValueError("attention dropout needs a random generator (rng)")
        keep = 1.0 - dropout_p
        drop = ((rng.random(weights.shape, dtype=np.float32) < keep) / keep).astype(weights.dtype)
        used = weights * drop
    else:
        used = weights
    out = used @ v
    cache = AttentionCache(q, k, v, weights, drop, scale)
    return out, (used if need_weights else None), cache


def scaled_dot_product_attention_backward(dout, cache):
    """Gradients of out = P V with P = softmax(S), S = Q Kᵀ · scale.

    dV = Pᵀ dout      dP = dout Vᵀ      dS = P ⊙ (dP - rowsum(dP ⊙ P))
    dQ = dS K · scale      dK = dSᵀ Q · scale

    Returns (dq, dk, dv) with the shapes of q, k, v.
    """
    if isinstance(cache, FastAttentionCache):
        return fused_attention_backward(dout, cache)
    q, k, v, p, drop, scale = cache
    used = p if drop is None else p * drop
    dv = np.swapaxes(used, -1, -2) @ dout
    dp = dout @ np.swapaxes(v, -1, -2)
    if drop is not None:
        dp *= drop
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    ds *= scale
    dq = ds @ k
    dk = np.swapaxes(ds, -1, -2) @ q
    return dq, dk, dv
