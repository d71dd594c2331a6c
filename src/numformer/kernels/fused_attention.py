"""Reference: ``numformer.ops.attention`` (``scaled_dot_product_attention_forward/backward``).

The fast version of that reference (without dropout): the same softmax(Q Kᵀ · scale + M) V and the same
gradients, computed for speed on a CPU. This is the kernel ``nn.MultiHeadAttention`` runs whenever attention
dropout is off (and the reference ops are not switched on); tests/test_kernels.py
checks it against the reference (values, gradients by finite differences, any thread split).

What it does differently from the reference, and why:

* The scores are kept transposed, Sᵀ of shape (..., Tk, Tq): the softmax then reduces over the second-last
  axis, which NumPy vectorizes across queries (a max along the last axis of short rows is several times
  slower), and every product is a plain BLAS call on the layouts at hand.
* The softmax runs in place on the scores buffer (no temporaries the size of the scores).
* Causal attention over more than ``CAUSAL_BLOCK`` queries is computed block by block: the block of
  queries [q0, q1) only computes its scores against the keys [0, q1), skipping the blocks above the diagonal.
* The first leading axis (batch) is split across numformer's threads (``numformer.set_num_threads``).
* Backward takes rᵢ = dOᵢ · Oᵢ from the outputs (as FlashAttention-2) instead of a pass over the scores, and
  can write dq, dk, dv straight into the caller's layout (e.g. the fused QKV gradient).

Same mask convention as the reference: a boolean mask is True where a query **may attend**; a float mask is
added to the scores.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._runtime import parallel_for, products_in_pieces
from ..ops.attention import causal_mask, check_attn_mask, check_qkv

# Causal attention over long sequences is computed in blocks of this many queries: block [q0, q1) only
# needs the keys [0, q1), so the scores (and their softmax) above the diagonal blocks are never computed.
CAUSAL_BLOCK = 64
# The transposed causal masks of the most recent shapes are kept (read-only); past this many, start afresh.
MASK_CACHE_SIZE = 64
# A thread's share of the batch is at least this many scores (smaller pieces cost more to hand out than to do).
SCORES_PER_THREAD = 32768


class FastAttentionCache(NamedTuple):
    """Cache of the fused kernel (no dropout). The probabilities are stored transposed, Pᵀ (..., Tk, Tq), as
    one array per block of queries (one block unless causal over more than ``CAUSAL_BLOCK`` queries)."""
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
        if len(_MASK_CACHE) > MASK_CACHE_SIZE:
            _MASK_CACHE.clear()
        _MASK_CACHE[key] = m
    return m


def _additive_mask_t(attn_mask, lead, t_q, t_k, dtype):
    """A functional mask (bool True = may attend, or float added) as a transposed additive float mask."""
    attn_mask = check_attn_mask(attn_mask, lead, t_q, t_k)
    if attn_mask.dtype == bool:
        attn_mask = np.where(attn_mask, 0.0, -np.inf).astype(dtype)
    return np.swapaxes(attn_mask.astype(dtype, copy=False), -1, -2)


def _split_grain(lead, t_q, t_k):
    """Smallest number of leading-axis-0 items worth one thread: about ``SCORES_PER_THREAD`` scores."""
    per_item = max(1, math.prod(lead[1:]) * t_q * t_k)
    return max(1, -(-SCORES_PER_THREAD // per_item))


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


def _blocks(t_q, t_k, is_causal):
    """(q0, q1, kv): query blocks and the number of keys each one sees (top-left aligned causal mask)."""
    if not is_causal or t_q <= CAUSAL_BLOCK:
        return [(0, t_q, t_k)]
    return [(q0, min(q0 + CAUSAL_BLOCK, t_q), min(q0 + CAUSAL_BLOCK, t_q, t_k))
            for q0 in range(0, t_q, CAUSAL_BLOCK)]


def _mask_block(m, kv, q0, q1):
    """The (keys :kv, queries q0:q1) block of a transposed mask, broadcast axes left whole."""
    if m is None:
        return None
    rows = slice(None) if m.shape[-2] == 1 else slice(0, kv)
    cols = slice(None) if m.shape[-1] == 1 else slice(q0, q1)
    return m[..., rows, cols]


class _Batch(NamedTuple):
    """The split of the first leading axis (n0 items, at least ``grain`` per thread); no split without one."""
    lead: tuple
    n0: int
    grain: int

    @classmethod
    def of(cls, lead, t_q, t_k):
        return cls(lead, lead[0] if lead else 1, _split_grain(lead, t_q, t_k))

    def part(self, a, lo, hi):
        """Items lo:hi of an array with the full leading axes."""
        return a[lo:hi] if self.lead else a

    def mask_part(self, m, lo, hi):
        """Items lo:hi of a mask, which may broadcast along the first axis."""
        return _take(m, lo, hi, self.n0) if self.lead else m

    def run(self, fn):
        """fn(lo, hi) over the batch, across threads."""
        parallel_for(self.n0, fn, self.grain) if self.lead else fn(0, 1)


def fused_attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, out=None):
    """softmax(Q Kᵀ · scale + M) V without dropout: the fast version of
    ``ops.attention.scaled_dot_product_attention_forward``; same conventions (bool mask True = may attend).

    q: (..., Tq, d_k)   k: (..., Tk, d_k)   v: (..., Tk, d_v)   attn_mask: broadcastable to (..., Tq, Tk).
    ``out`` (optional, shape (..., Tq, d_v), any strides with a unit last stride)
    receives the result, so a caller can have it written straight into the
    merged-heads layout (B, T, H, d_head). Returns (out, cache).

    The batch is split across threads (``numformer.set_num_threads``): products
    included when numformer owns the BLAS threads or the heads are small, else
    the softmax only (the products then use the BLAS's threads). Each item is
    computed the same way whatever the split.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    check_qkv(q, k, v)
    t_q, t_k = q.shape[-2], k.shape[-2]
    dt = np.result_type(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    mask_t = None if attn_mask is None else _additive_mask_t(attn_mask, q.shape[:-2], t_q, t_k, dt)
    causal = _causal_additive_t(t_q, t_k, dt) if is_causal else None
    lead = q.shape[:-2] if mask_t is None else np.broadcast_shapes(q.shape[:-2], mask_t.shape[:-2])
    if lead != q.shape[:-2]:                      # a mask with more leading axes than q: broadcast q, k, v
        q, k, v = (np.broadcast_to(a, lead + a.shape[-2:]) for a in (q, k, v))
    if out is None:
        out = np.empty(lead + (t_q, v.shape[-1]), dt)
    blocks = _blocks(t_q, t_k, is_causal)
    p_blocks = [np.empty(lead + (kv, q1 - q0), dt) for q0, q1, kv in blocks]    # Sᵀ, then Pᵀ, per block
    masks = [(_mask_block(causal, kv, q0, q1), _mask_block(mask_t, kv, q0, q1)) for q0, q1, kv in blocks]
    pieces = _products_in_pieces(t_q, t_k, q.shape[-1], v.shape[-1])
    forward = _forward_in_pieces if pieces else _forward_whole
    forward(q, k, v, out, blocks, p_blocks, masks, dt.type(scale), _Batch.of(lead, t_q, t_k))
    return out, FastAttentionCache(q, k, v, tuple(p_blocks), tuple(blocks), out, scale)


def _forward_in_pieces(q, k, v, out, blocks, p_blocks, masks, sc, batch):
    """Each thread computes its items from start to end: products, softmax, products."""
    def piece(lo, hi):
        kp, vp, op = batch.part(k, lo, hi), batch.part(v, lo, hi), batch.part(out, lo, hi)
        qs_t = np.multiply(np.swapaxes(batch.part(q, lo, hi), -1, -2), sc, dtype=sc.dtype, order="C")  # (Q·scale)ᵀ
        for (q0, q1, kv), pb, (cb, mb) in zip(blocks, p_blocks, masks):
            sb = batch.part(pb, lo, hi)
            np.matmul(kp[..., :kv, :], qs_t[..., q0:q1], out=sb)                          # Sᵀ = K (Q·scale)ᵀ
            _softmax_t_inplace(sb, cb, batch.mask_part(mb, lo, hi))                       # Pᵀ
            np.matmul(np.swapaxes(sb, -1, -2), vp[..., :kv, :], out=op[..., q0:q1, :])     # O = P V

    batch.run(piece)


def _forward_whole(q, k, v, out, blocks, p_blocks, masks, sc, batch):
    """The products on the whole batch (with the BLAS's threads), the softmax split across numformer's."""
    qs_t = np.multiply(np.swapaxes(q, -1, -2), sc, dtype=sc.dtype, order="C")            # (Q·scale)ᵀ
    for (q0, q1, kv), pb, (cb, mb) in zip(blocks, p_blocks, masks):
        np.matmul(k[..., :kv, :], qs_t[..., q0:q1], out=pb)
        batch.run(lambda lo, hi: _softmax_t_inplace(batch.part(pb, lo, hi), cb, batch.mask_part(mb, lo, hi)))
        np.matmul(np.swapaxes(pb, -1, -2), v[..., :kv, :], out=out[..., q0:q1, :])


def _accumulate(product, target, first):
    """target = product (first block) or target += product."""
    if first:
        target[...] = product
    else:
        target += product


def fused_attention_backward(dout, cache, dq=None, dk=None, dv=None):
    """Gradients for ``fused_attention_forward`` (the fast version of
    ``ops.attention.scaled_dot_product_attention_backward``). dq, dk, dv may be given as output arrays (any
    unit-last-stride views, e.g. into a fused (B, T, 3, H, d_head) gradient). Returns (dq, dk, dv).

    dV = Pᵀ dO     dP = dO Vᵀ     dS = P ⊙ (dP - r),  r_i = Σ_j P_ij dP_ij = dO_i · O_i
    dQ = dS K · scale      dK = dSᵀ Q · scale
    (r from the outputs, as in FlashAttention-2: a dot product per query instead of a pass over the scores.)
    Causal blocks are processed from the last (which sees every key) to the first; dV and dK add up the
    blocks' contributions. The scale is folded into the contiguous copy of dOᵀ (and r), so dSᵀ comes out
    scaled: no extra pass.
    """
    q, k, v, p_blocks, blocks, out, scale = cache
    dt = p_blocks[0].dtype
    lead = p_blocks[0].shape[:-2]
    t_q, t_k = q.shape[-2], k.shape[-2]
    dq = np.empty(q.shape, dt) if dq is None else dq
    dk = np.empty(k.shape, dt) if dk is None else dk
    dv = np.empty(v.shape, dt) if dv is None else dv
    order = sorted(range(len(blocks)), key=lambda i: -blocks[i][2])     # widest key range first
    top = blocks[order[0]][2]
    if top < t_k:                                 # keys that no query sees get zero gradients
        dk[..., top:, :] = 0
        dv[..., top:, :] = 0
    pieces = _products_in_pieces(t_q, t_k, q.shape[-1], v.shape[-1])
    backward = _backward_in_pieces if pieces else _backward_whole
    backward(dout, cache, (dq, dk, dv), [(blocks[i], p_blocks[i]) for i in order], dt.type(scale),
             _Batch.of(lead, t_q, t_k))
    return dq, dk, dv


def _rowdot(a, b):
    """Σ over the last axis of a ⊙ b, without the product's temporary: (..., T, d) -> (..., T)."""
    return np.einsum("...i,...i->...", a, b)


def _backward_in_pieces(dout, cache, grads, ordered, sc, batch):
    """Each thread computes its items' gradients from start to end."""
    def piece(lo, hi):
        qp, kp, vp, op, gp = (batch.part(a, lo, hi) for a in (cache.q, cache.k, cache.v, cache.out, dout))
        dqp, dkp, dvp = (batch.part(g, lo, hi) for g in grads)
        g_t = np.multiply(np.swapaxes(gp, -1, -2), sc, dtype=sc.dtype, order="C")          # (dO·scale)ᵀ
        r = _rowdot(gp, op)                                                                # r = dO · O per query
        r *= sc
        for n, ((q0, q1, kv), p_block) in enumerate(ordered):
            pb = batch.part(p_block, lo, hi)
            _accumulate(np.matmul(pb, gp[..., q0:q1, :]), dvp[..., :kv, :], n == 0)        # dV = Pᵀ dO
            db = np.matmul(vp[..., :kv, :], g_t[..., q0:q1])                               # dPᵀ · scale
            db -= r[..., None, q0:q1]
            db *= pb                                                                      # dSᵀ · scale
            np.matmul(np.swapaxes(db, -1, -2), kp[..., :kv, :], out=dqp[..., q0:q1, :])    # dQ = dS K
            _accumulate(np.matmul(db, qp[..., q0:q1, :]), dkp[..., :kv, :], n == 0)        # dK = dSᵀ Q

    batch.run(piece)


def _backward_whole(dout, cache, grads, ordered, sc, batch):
    """The products on the whole batch (with the BLAS's threads), the elementwise dS split across numformer's."""
    q, k, v, out = cache.q, cache.k, cache.v, cache.out
    dq, dk, dv = grads
    g_t = np.multiply(np.swapaxes(dout, -1, -2), sc, dtype=sc.dtype, order="C")            # (dO·scale)ᵀ
    r = _rowdot(dout, out)
    r *= sc
    for n, ((q0, q1, kv), pb) in enumerate(ordered):
        _accumulate(np.matmul(pb, dout[..., q0:q1, :]), dv[..., :kv, :], n == 0)
        db = np.matmul(v[..., :kv, :], g_t[..., q0:q1])                                 # dPᵀ · scale

        def scores(lo, hi, db=db, pb=pb, q0=q0, q1=q1):
            dsp = batch.part(db, lo, hi)
            dsp -= batch.part(r, lo, hi)[..., None, q0:q1]
            dsp *= batch.part(pb, lo, hi)

        batch.run(scores)
        np.matmul(np.swapaxes(db, -1, -2), k[..., :kv, :], out=dq[..., q0:q1, :])
        _accumulate(np.matmul(db, q[..., q0:q1, :]), dk[..., :kv, :], n == 0)


__all__ = ["fused_attention_forward", "fused_attention_backward", "FastAttentionCache", "CAUSAL_BLOCK"]
