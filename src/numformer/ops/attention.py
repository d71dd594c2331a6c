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

from .._runtime import parallel_for, products_in_pieces
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
    """Cache of the fused kernel (no dropout). The probabilities are stored transposed, Pᵀ (..., Tk, Tq), as
    one array per block of queries (one block unless causal over more than ``_CAUSAL_BLOCK`` queries)."""
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    p_blocks: tuple            # Pᵀ of each query block (q0, q1, kv): (..., kv, q1 - q0), keys kv and after are 0
    blocks: tuple              # the (q0, q1, kv) of each block
    out: np.ndarray            # the output O = P V (a view of the returned array)
    scale: float

    @property
    def weights_t(self):
        """The full transposed probabilities Pᵀ (..., Tk, Tq), zeros where a causal block skipped keys."""
        if len(self.blocks) == 1:
            return self.p_blocks[0]
        lead, t_k, t_q = self.p_blocks[0].shape[:-2], self.k.shape[-2], self.q.shape[-2]
        full = np.zeros(lead + (t_k, t_q), self.p_blocks[0].dtype)
        for (q0, q1, kv), pb in zip(self.blocks, self.p_blocks):
            full[..., :kv, q0:q1] = pb
        return full


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
    """Whether the per-head products may run inside the pieces of a split (see _runtime.products_in_pieces)."""
    t = max(t_q, t_k)
    return products_in_pieces(t, t, max(d_k, d_v))


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


# Causal attention over long sequences is computed in blocks of this many queries: block [q0, q1) only
# needs the keys [0, q1), so the scores (and their softmax) above the diagonal blocks are never computed.
_CAUSAL_BLOCK = 64


def _blocks(t_q, t_k, is_causal):
    """(q0, q1, kv): query blocks and the number of keys each one sees (top-left aligned causal mask)."""
    if not is_causal or t_q <= _CAUSAL_BLOCK:
        return [(0, t_q, t_k)]
    return [(q0, min(q0 + _CAUSAL_BLOCK, t_q), min(q0 + _CAUSAL_BLOCK, t_q, t_k))
            for q0 in range(0, t_q, _CAUSAL_BLOCK)]


def _mask_block(m, kv, q0, q1):
    """The (keys :kv, queries q0:q1) block of a transposed mask, broadcast axes left whole."""
    if m is None:
        return None
    rows = slice(None) if m.shape[-2] == 1 else slice(0, kv)
    cols = slice(None) if m.shape[-1] == 1 else slice(q0, q1)
    return m[..., rows, cols]


def fused_attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, out=None):
    """softmax(Q Kᵀ · scale + M) V without dropout, the fast kernel behind
    ``scaled_dot_product_attention_forward``; same conventions (bool mask True = may attend).

    ``out`` (optional, shape (..., Tq, d_v), any strides with a unit last stride)
    receives the result, so a caller can have it written straight into the
    merged-heads layout (B, T, H, d_head). Returns (out, cache).

    The scores are kept transposed, Sᵀ of shape (..., Tk, Tq): the softmax then
    reduces over the second-last axis, which NumPy vectorizes across queries
    (a max along the last axis of short rows is several times slower), and
    every product is a plain BLAS call on the layouts at hand. A causal mask
    over more than ``_CAUSAL_BLOCK`` queries is applied block by block: the
    block of queries [q0, q1) only computes its scores against keys [0, q1),
    skipping the blocks above the diagonal. The first leading axis (batch) is
    split across threads (``numformer.set_num_threads``): products included
    when numformer owns the BLAS threads or the heads are small, else the
    softmax only (the products then use the BLAS's threads). Each item is
    computed the same way whatever the split.
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
    blocks = _blocks(t_q, t_k, is_causal)
    p_blocks = [np.empty(lead + (kv, q1 - q0), dt) for q0, q1, kv in blocks]    # Sᵀ, then Pᵀ, per block
    masks = [(_mask_block(causal, kv, q0, q1), _mask_block(mask_t, kv, q0, q1)) for q0, q1, kv in blocks]

    def sl(a, lo, hi):
        return _take(a, lo, hi, n0) if lead else a

    def split(fn):                                # fn(lo, hi) over the batch, across threads
        parallel_for(n0, fn, grain) if lead else fn(0, 1)

    if _products_in_pieces(t_q, t_k, q.shape[-1], v.shape[-1]):
        def piece(lo, hi):
            kp, vp, op = sl(k, lo, hi), sl(v, lo, hi), sl(out, lo, hi)
            qs_t = np.multiply(np.swapaxes(sl(q, lo, hi), -1, -2), sc, dtype=dt, order="C")   # (Q·scale)ᵀ
            for (q0, q1, kv), pb, (cb, mb) in zip(blocks, p_blocks, masks):
                sb = pb[lo:hi] if lead else pb
                np.matmul(kp[..., :kv, :], qs_t[..., q0:q1], out=sb)
                _softmax_t_inplace(sb, cb, sl(mb, lo, hi))
                np.matmul(np.swapaxes(sb, -1, -2), vp[..., :kv, :], out=op[..., q0:q1, :])

        split(piece)
    else:
        qs_t = np.multiply(np.swapaxes(q, -1, -2), sc, dtype=dt, order="C")             # (Q·scale)ᵀ
        for (q0, q1, kv), pb, (cb, mb) in zip(blocks, p_blocks, masks):
            np.matmul(k[..., :kv, :], qs_t[..., q0:q1], out=pb)                          # BLAS threads
            split(lambda lo, hi: _softmax_t_inplace(sl(pb, lo, hi), cb, sl(mb, lo, hi)))
            np.matmul(np.swapaxes(pb, -1, -2), v[..., :kv, :], out=out[..., q0:q1, :])
    return out, FastAttentionCache(q, k, v, tuple(p_blocks), tuple(blocks), out, scale)


def _accumulate(product, target, first):
    """target = product (first block) or target += product."""
    if first:
        target[...] = product
    else:
        target += product


def fused_attention_backward(dout, cache, dq=None, dk=None, dv=None):
    """Gradients for ``fused_attention_forward``; dq, dk, dv may be given as output arrays (any unit-last-stride
    views, e.g. into a fused (B, T, 3, H, d_head) gradient). Returns (dq, dk, dv).

    dV = Pᵀ dO     dP = dO Vᵀ     dS = P ⊙ (dP - r),  r_i = Σ_j P_ij dP_ij = dO_i · O_i
    dQ = dS K · scale      dK = dSᵀ Q · scale
    (r from the outputs, as in FlashAttention-2: a dot product per query instead of a pass over the scores.)
    Causal blocks are processed from the last (which sees every key) to the first; dV and dK add up the
    blocks' contributions.
    """
    q, k, v, p_blocks, blocks, out, scale = cache
    dt = p_blocks[0].dtype
    lead = p_blocks[0].shape[:-2]
    t_q, t_k = q.shape[-2], k.shape[-2]
    dq = np.empty(q.shape, dt) if dq is None else dq
    dk = np.empty(k.shape, dt) if dk is None else dk
    dv = np.empty(v.shape, dt) if dv is None else dv
    sc = dt.type(scale)
    n0 = lead[0] if lead else 1
    grain = _split_grain(lead, t_q, t_k)
    order = sorted(range(len(blocks)), key=lambda i: -blocks[i][2])     # widest key range first
    top = blocks[order[0]][2]
    if top < t_k:                                 # keys that no query sees get zero gradients
        dk[..., top:, :] = 0
        dv[..., top:, :] = 0

    def sl(a, lo, hi):
        return a[lo:hi] if lead else a

    def split(fn):
        parallel_for(n0, fn, grain) if lead else fn(0, 1)

    # The scale is folded into the contiguous copy of dOᵀ (and r), so dSᵀ comes out scaled: no extra pass.
    if _products_in_pieces(t_q, t_k, q.shape[-1], v.shape[-1]):
        def piece(lo, hi):
            qp, kp, vp, op, gp = (sl(a, lo, hi) for a in (q, k, v, out, dout))
            dqp, dkp, dvp = sl(dq, lo, hi), sl(dk, lo, hi), sl(dv, lo, hi)
            g_t = np.multiply(np.swapaxes(gp, -1, -2), sc, dtype=dt, order="C")       # (dO·scale)ᵀ
            r = np.vecdot(gp, op)                                                     # r = dO · O per query
            r *= sc
            for n, i in enumerate(order):
                (q0, q1, kv), pb = blocks[i], sl(p_blocks[i], lo, hi)
                _accumulate(np.matmul(pb, gp[..., q0:q1, :]), dvp[..., :kv, :], n == 0)
                db = np.matmul(vp[..., :kv, :], g_t[..., q0:q1])                       # dPᵀ · scale
                db -= r[..., None, q0:q1]
                db *= pb                                                              # dSᵀ · scale
                np.matmul(np.swapaxes(db, -1, -2), kp[..., :kv, :], out=dqp[..., q0:q1, :])
                _accumulate(np.matmul(db, qp[..., q0:q1, :]), dkp[..., :kv, :], n == 0)

        split(piece)
        return dq, dk, dv
    g_t = np.multiply(np.swapaxes(dout, -1, -2), sc, dtype=dt, order="C")              # (dO·scale)ᵀ
    r = np.vecdot(dout, out)
    r *= sc
    for n, i in enumerate(order):
        (q0, q1, kv), pb = blocks[i], p_blocks[i]
        _accumulate(np.matmul(pb, dout[..., q0:q1, :]), dv[..., :kv, :], n == 0)
        db = np.matmul(v[..., :kv, :], g_t[..., q0:q1])                                 # dPᵀ · scale

        def scores(lo, hi, db=db, pb=pb, q0=q0, q1=q1):
            dsp = sl(db, lo, hi)
            dsp -= sl(r, lo, hi)[..., None, q0:q1]
            dsp *= sl(pb, lo, hi)

        split(scores)
        np.matmul(np.swapaxes(db, -1, -2), k[..., :kv, :], out=dq[..., q0:q1, :])
        _accumulate(np.matmul(db, q[..., q0:q1, :]), dk[..., :kv, :], n == 0)
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
