"""Reference: ``numformer.ops.attention`` (``scaled_dot_product_attention_forward/backward``), with the key/value
heads shared by groups of query heads as ``ops.grouped_query`` (``repeat_kv_forward/backward``) shares them.

The fast version of that reference (without dropout): the same softmax(Q Kᵀ · scale + M) V and the same
gradients, computed for speed on a CPU. This is the kernel ``nn.MultiHeadAttention`` runs when attention
dropout is off, the scores are not soft-capped and the module does not ask for ``attention="flash"``
(outside ``reference_mode()``: ``nn.dispatch.attention_kernel``); tests/test_kernels.py
checks it against the reference (values, gradients by finite differences, any thread split).

What it does differently from the reference, and why (at the sizes a CPU trains, a pass over the scores
costs about as much as a product with them, and a pass that broadcasts along a short axis several times
more than one along contiguous memory, so the kernel makes few passes, along memory):

* The scores are kept transposed, Sᵀ of shape (keys, queries), and every product is a plain BLAS call on the
  layouts at hand.
* Grouped-query attention without repeated keys and values: the ``rep`` query heads that share a key/value
  head are one item, their queries side by side, (keys, rep · queries): one product per item where the
  reference makes ``rep``, and the key/value gradients summed over the group by the products themselves.
* The softmax skips the subtraction of each query's largest score: E = exp(Sᵀ + M), z = Σ_keys E (a
  product with a vector of ones), P = E / z, in place. This is the softmax itself whenever no exp
  overflows or underflows a query away, which the kernel checks on z; a block where z is out of the safe
  range (scores beyond about ±55 in float32) is computed again with each query's largest score subtracted
  first, as the reference does.
* Causal attention over more than ``CAUSAL_BLOCK / rep`` queries is computed block by block: the block of
  queries [q0, q1) only computes its scores against the keys [0, q1), skipping the blocks above the
  diagonal; the mask is added only where a block meets the diagonal, along contiguous memory.
* The backward pass takes r_i = dO_i · O_i from the outputs (as FlashAttention-2), and its subtraction rides
  in a product: ``dSᵀ · scale = Pᵀ ⊙ ([V | 1] [dO · scale ; -r · scale]ᵀ)``.
* NumPy hands a stacked product to the BLAS fast only when its second operand is not a transposed view:
  ``(Q · scale)ᵀ`` and ``[dO · scale ; -r · scale]ᵀ`` are the two transposed copies made for that.
* A cached generation step (fewer than ``FEW_QUERIES`` query columns per item, no mask, too few scores to
  split) skips all of the above but the layouts: ``_decoding_step`` computes the same buffers with a handful
  of NumPy calls and the reference's shifted softmax, about 40% faster than the general path there.
* The first leading axis (batch) is split across numformer's threads (``numformer.set_num_threads``), and
  dq, dk, dv can be written straight into the caller's layout (e.g. the fused QKV gradient).

Same mask convention as the reference: a boolean mask is True where a query **may attend**; a float mask is
added to the scores.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._runtime import parallel_for, products_in_pieces
from ..ops.attention import check_attn_mask, check_qkv

# Causal attention over long sequences is computed in blocks of this many queries (divided by the query heads
# per key/value head): block [q0, q1) only needs the keys [0, q1), so the scores (and their softmax) above the
# diagonal blocks are never computed.
CAUSAL_BLOCK = 64
# The causal masks of the most recent shapes are kept (read-only); past this many, start afresh.
MASK_CACHE_SIZE = 64
# A thread's share of the batch is at least this many scores (smaller pieces cost more to hand out than to do).
SCORES_PER_THREAD = 32768
# Blocks with fewer query columns (rep · queries) per item than this (a cached generation step) sum exp over
# the keys with a reduction rather than a product per item, and skip setting NumPy's error state (a cost of the
# order of the whole step there) when their largest score cannot overflow exp.
FEW_QUERIES = 16
# exp(S) without a shift is trusted when every query's z = Σ exp(S) lies in [tiny · e^MARGIN · Tk,
# max / e^MARGIN]: no score overflowed, and every query's largest term is a normal number far from underflow
# (z ≤ Tk · its largest term), so the terms that matter keep every digit.
MARGIN = 30.0


class FastAttentionCache(NamedTuple):
    """Cache of the fused kernel (no dropout). Items are the leading axes with the head axis split into
    (key/value heads, rep): ``lead[:-1] + (H_kv,)``; per query block (q0, q1, kv) the arrays below."""
    q: np.ndarray              # the queries as given (..., H, Tq, d_k)
    k: np.ndarray              # the keys (..., H_kv, Tk, d_k)
    v: np.ndarray              # the values (..., H_kv, Tk, d_v)
    qs_t: tuple                # per block, (Q · scale)ᵀ of its queries: (items..., d_k, rep, q1 - q0)
    p_blocks: tuple            # per block, Pᵀ: (items..., kv, rep, q1 - q0); keys kv and after are 0
    blocks: tuple              # the (q0, q1, kv) of each block
    out: np.ndarray            # the output O = P V (a view of the returned array)
    scale: float
    squeezed: bool             # the call had no leading axes (q of shape (Tq, d_k))

    @property
    def weights_t(self):
        """The transposed probabilities Pᵀ (lead..., Tk, Tq), per query head; zeros where a causal block
        skipped keys."""
        lead, t_k, t_q = self.q.shape[:-2], self.k.shape[-2], self.q.shape[-2]
        full = np.zeros(lead + (t_k, t_q), self.p_blocks[0].dtype)
        for (q0, q1, kv), p in zip(self.blocks, self.p_blocks):
            n = p.ndim
            heads = p.transpose(tuple(range(n - 3)) + (n - 2, n - 3, n - 1))      # (items, rep, kv, nq)
            full[..., :kv, q0:q1] = heads.reshape(lead + (kv, q1 - q0))
        return full[0] if self.squeezed else full


_MASK_CACHE = {}
_LIMITS = {}


def _causal_diagonal(rows, n_q, rep, dtype):
    """The additive causal mask (0 / -inf) of a block's diagonal part, transposed and flattened: key j' and
    query i' counted from the block's first query, key j' visible to query i' when j' <= i'; (rows · rep ·
    n_q,) read-only, cached, in the layout (key, rep, query) of the scores."""
    key = (rows, n_q, rep, np.dtype(dtype).str)
    m = _MASK_CACHE.get(key)
    if m is None:
        visible = np.arange(rows)[:, None] <= np.arange(n_q)[None, :]
        m = np.repeat(np.where(visible, 0.0, -np.inf).astype(dtype)[:, None, :], rep, axis=1).reshape(-1)
        m.setflags(write=False)
        if len(_MASK_CACHE) > MASK_CACHE_SIZE:
            _MASK_CACHE.clear()
        _MASK_CACHE[key] = m
    return m


def _trusted_range(dtype, t_k):
    """(lowest, highest) z of a query for which exp without a shift is trusted (see MARGIN), and a score below
    which exp cannot overflow."""
    key = (np.dtype(dtype).str, t_k)
    if key not in _LIMITS:
        info = np.finfo(dtype)
        _LIMITS[key] = (float(info.tiny) * math.exp(MARGIN) * max(t_k, 1), float(info.max) * math.exp(-MARGIN),
                        math.log(float(info.max)) - 1.0)
    return _LIMITS[key]


def _grouped_mask_t(attn_mask, lead, t_q, t_k, rep, dtype):
    """A checked functional mask (bool True = may attend, or float added) as an additive float mask in the
    scores' layout (items..., Tk, rep, Tq): broadcast over the leading axes (a view), transposed, heads split."""
    if attn_mask.dtype == bool:
        attn_mask = np.where(attn_mask, 0.0, -np.inf).astype(dtype)
    full = np.broadcast_to(attn_mask.astype(dtype, copy=False), lead + (t_q, t_k))
    split = full.reshape(lead[:-1] + (lead[-1] // rep, rep, t_q, t_k))
    n = split.ndim
    return split.transpose(tuple(range(n - 3)) + (n - 1, n - 3, n - 2))


_ONES = {}


def _ones(n, dtype):
    """A read-only vector of n ones (z = Σ_keys E as a product), cached."""
    key = (n, np.dtype(dtype).str)
    v = _ONES.get(key)
    if v is None:
        v = np.ones(n, dtype)
        v.setflags(write=False)
        if len(_ONES) > MASK_CACHE_SIZE:
            _ONES.clear()
        _ONES[key] = v
    return v


def _split_grain(lead, t_q, t_k):
    """Smallest number of leading-axis-0 items worth one thread: about ``SCORES_PER_THREAD`` scores."""
    per_item = max(1, math.prod(lead[1:]) * t_q * t_k)
    return max(1, -(-SCORES_PER_THREAD // per_item))


def _products_in_pieces(t_q, t_k, d_k, d_v):
    """Whether the per-head products may run inside the pieces of a split (see _runtime.products_in_pieces)."""
    t = max(t_q, t_k)
    return products_in_pieces(t, t, max(d_k, d_v))


def _blocks(t_q, t_k, is_causal, rep=1):
    """(q0, q1, kv): query blocks and the number of keys each one sees (top-left aligned causal mask). A block
    has CAUSAL_BLOCK / rep queries of each of the ``rep`` heads sharing a key/value head: about CAUSAL_BLOCK
    columns of scores per item, whatever the grouping (smaller blocks skip more of the masked half)."""
    size = max(1, CAUSAL_BLOCK // rep)
    if not is_causal or t_q <= size:
        return [(0, t_q, t_k)]
    return [(q0, min(q0 + size, t_q), min(q0 + size, t_q, t_k)) for q0 in range(0, t_q, size)]


_RESHAPE_HAS_COPY = np.lib.NumpyVersion(np.__version__) >= "2.1.0"


def _view(a, shape):
    """``a`` reshaped as a view, a ValueError where that would need a copy (the kernel writes through these
    views): ``np.reshape(copy=False)`` from NumPy 2.1, setting the shape of a view before (deprecated since)."""
    if _RESHAPE_HAS_COPY:
        return np.reshape(a, shape, copy=False)
    view = a.view()
    view.shape = shape
    return view


def _merged(a, axes):
    """``a`` with its last ``axes`` axes merged into one, as a view (see ``_view``)."""
    return _view(a, a.shape[:a.ndim - axes] + ((-1,) if a.size else (0,)))


def _flat(a, width):
    """``a`` seen as (-1, width) rows, a view (see ``_view``)."""
    return _view(a, (-1, width) if a.size else (0, width))


def _heads(a, rep):
    """(..., H, T, d) seen as (..., H / rep, rep, T, d): a view."""
    return a.reshape(a.shape[:-3] + (a.shape[-3] // rep, rep) + a.shape[-2:])


def _to_end(a, k):
    """``a`` with its axis -k moved to the end (a transposed view)."""
    n = a.ndim
    return a.transpose(tuple(range(n - k)) + tuple(range(n - k + 1, n)) + (n - k,))


def _features_first(a):
    """(..., rep, nq, d) seen as (..., d, rep, nq) (a transposed view)."""
    n = a.ndim
    return a.transpose(tuple(range(n - 3)) + (n - 1, n - 3, n - 2))


class _Split(NamedTuple):
    """The work split: items along the first leading axis (n0 of them, at least ``grain`` per thread), run
    either each piece from start to end on its thread (``pieces``) or the products on the whole batch on
    the calling thread (with the BLAS's threads) and the passes over the scores split."""
    n0: int
    grain: int
    pieces: bool

    def run(self, stages):
        """Run ``stages``, a list of (is_product, fn(lo, hi)), over the items."""
        if self.pieces:
            parallel_for(self.n0, lambda lo, hi: [fn(lo, hi) for _, fn in stages], self.grain)
            return
        for is_product, fn in stages:
            if is_product:
                fn(0, self.n0)
            else:
                parallel_for(self.n0, fn, self.grain)


def _grouping(q, k, v):
    """rep, the query heads per key/value head: 1, or H / H_kv when k and v (..., H_kv, T, d) have fewer
    heads than q (..., H, T, d); a ValueError when the shapes do not fit."""
    if q.ndim >= 3 and k.ndim == q.ndim and v.ndim == q.ndim and k.shape[-3] != q.shape[-3] \
            and k.shape[:-2] == v.shape[:-2] and q.shape[:-3] == k.shape[:-3]:
        if k.shape[-3] < 1 or q.shape[-3] % k.shape[-3]:
            raise ValueError(f"q has {q.shape[-3]} heads, k and v {k.shape[-3]}: the query heads must be a "
                             f"multiple of the key/value heads")
        check_qkv(q[..., :k.shape[-3], :, :], k, v)
        return q.shape[-3] // k.shape[-3]
    check_qkv(q, k, v)
    return 1


def fused_attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, out=None):
    """softmax(Q Kᵀ · scale + M) V without dropout: the fast version of
    ``ops.attention.scaled_dot_product_attention_forward``; same conventions (bool mask True = may attend).

    q: (..., Tq, d_k)   k: (..., Tk, d_k)   v: (..., Tk, d_v)   attn_mask: broadcastable to (..., Tq, Tk).
    is_causal: query i attends keys j <= i (top-left aligned, as torch).   scale: defaults to 1/√d_k.
    Grouped-query attention: k and v may have H_kv heads (..., H_kv, Tk, d) where q has H = rep · H_kv; key/value
    head g serves query heads g·rep … g·rep + rep - 1 (``ops.repeat_kv_forward`` then the reference).
    ``out`` (optional, shape (..., Tq, d_v), any strides with a unit last stride)
    receives the result, so a caller can have it written straight into the
    merged-heads layout (B, T, H, d_head). Returns (out, cache).

    The batch is split across threads (``numformer.set_num_threads``): products
    included when numformer owns the BLAS threads or the heads are small, else
    the passes over the scores only (the products then use the BLAS's threads). Each item is
    computed the same way whatever the split.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    rep = _grouping(q, k, v)
    squeezed = q.ndim == 2
    if squeezed:                                  # one head axis of length 1, dropped again at the end
        q, k, v = q[None], k[None], v[None]
        out = None if out is None else out[None]
    dt = np.result_type(q, k, v)
    t_q, t_k = q.shape[-2], k.shape[-2]
    lead = q.shape[:-2]
    if attn_mask is not None:
        attn_mask = check_attn_mask(attn_mask, lead, t_q, t_k)
        wider = np.broadcast_shapes(lead, attn_mask.shape[:-2])
        if wider != lead:                         # a mask with more leading axes than q: broadcast q, k, v
            k, v = (np.repeat(a, rep, axis=-3) for a in (k, v)) if rep > 1 else (k, v)
            q, k, v, rep, lead = (*(np.broadcast_to(a, wider + a.shape[-2:]) for a in (q, k, v)), 1, wider)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if out is None:
        out = np.empty(lead + (t_q, v.shape[-1]), dt)
    if _is_decoding_step(k.shape[:-2], rep * t_q, t_k, attn_mask, is_causal):
        qs_t, p = _decoding_step(_heads(q, rep), k, v, _heads(out, rep), dt.type(scale))
        cache = FastAttentionCache(q, k, v, (qs_t,), (p,), ((0, t_q, t_k),), out, scale, squeezed)
        return (out[0] if squeezed else out), cache
    fw = _Forward(q, k, v, out, rep, dt, scale, _blocks(t_q, t_k, is_causal, rep), is_causal,
                  None if attn_mask is None else _grouped_mask_t(attn_mask, lead, t_q, t_k, rep, dt))
    items = k.shape[:-2]
    _Split(items[0], _split_grain(items, rep * t_q, t_k),
           _products_in_pieces(t_q, t_k, q.shape[-1], v.shape[-1])).run(fw.stages())
    cache = FastAttentionCache(q, k, v, tuple(fw.qs_t), tuple(fw.p), tuple(fw.blocks), out, scale, squeezed)
    return (out[0] if squeezed else out), cache


def _is_decoding_step(items, columns, t_k, attn_mask, is_causal):
    """Whether a call is a cached generation step for ``_decoding_step``: fewer than ``FEW_QUERIES`` query
    columns (rep · Tq) per item, at least one key, no mask, and too few scores to split across threads."""
    return (attn_mask is None and not is_causal and columns < FEW_QUERIES and t_k > 0
            and _split_grain(items, columns, t_k) >= items[0])


def _decoding_step(q5, k, v, out5, scale):
    """The forward pass for a few queries (a cached generation step), as the reference computes it: the same
    buffers as ``_Forward`` (the backward pass reads them), written by a few NumPy calls on this thread. At one
    query per head the general machinery (stages, split, views, the trusted-range check) costs about twice the
    arithmetic, and the shifted softmax (each query's largest score subtracted first) needs no check.

    q5: (items, rep, nq, d_k)   k: (items, Tk, d_k)   v: (items, Tk, d_v)   out5: (items, rep, nq, d_v), written.
    Returns (Q · scale)ᵀ (items, d_k, rep, nq) and Pᵀ (items, Tk, rep, nq)."""
    items, (rep, n_q, d_k), t_k = k.shape[:-2], q5.shape[-3:], k.shape[-2]
    qs_t = np.empty(items + (d_k, rep, n_q), scale.dtype)           # C order, whatever the layout of q
    np.multiply(_features_first(q5), scale, out=qs_t)               # (Q · scale)ᵀ
    p = np.matmul(k, _merged(qs_t, 2))                              # Sᵀ = K (Q · scale)ᵀ: (items, Tk, rep · nq)
    p -= np.maximum.reduce(p, axis=-2, keepdims=True)               # no mask: every query sees a finite score
    np.exp(p, out=p)
    p /= np.add.reduce(p, axis=-2, keepdims=True)
    p_heads = _to_end(p, 2).reshape(items + (rep, n_q, t_k))        # P: (items, rep, nq, Tk)
    np.matmul(p_heads, v[..., None, :, :], out=out5)
    return qs_t, p.reshape(items + (t_k, rep, n_q))


def _shifted_softmax(flat):
    """Pᵀ from Sᵀ + M in place over the key axis (-2) as the reference: each query's largest score subtracted
    before exp (0 for a query that sees no key, whose weights are then all 0)."""
    m = np.max(flat, axis=-2, keepdims=True)
    m[~np.isfinite(m)] = 0
    flat -= m
    np.exp(flat, out=flat)
    z = np.add.reduce(flat, axis=-2, keepdims=True)
    z[z == 0] = 1
    flat /= z


class _Forward:
    """The buffers and stages of one forward call (see ``fused_attention_forward``)."""

    def __init__(self, q, k, v, out, rep, dt, scale, blocks, is_causal, mask_t):
        self.q5, self.k, self.v, self.out5 = _heads(q, rep), k, v, _heads(out, rep)
        self.rep, self.dt, self.sc, self.blocks, self.mask_t = rep, dt, dt.type(scale), blocks, mask_t
        items, d_k = k.shape[:-2], q.shape[-1]
        self.qs_t = [np.empty(items + (d_k, rep, q1 - q0), dt) for q0, q1, _ in blocks]
        self.p = [np.empty(items + (kv, rep, q1 - q0), dt) for q0, q1, kv in blocks]
        self.diag = [_causal_diagonal(kv - q0, q1 - q0, rep, dt) if is_causal and kv > q0 else None
                     for q0, q1, kv in blocks]
        self.ones = [_ones(kv, dt) for _, _, kv in blocks]
        self.trusted = _trusted_range(dt, k.shape[-2])
        self.untrusted = [[] for _ in blocks]         # the (lo, hi) item ranges of each block to compute again

    def stages(self):
        """(is_product, fn(lo, hi)) in order: per block (Q · scale)ᵀ, the scores, their softmax (computed again
        where untrusted), the weighted sum of the values."""
        stages = []
        for b in range(len(self.blocks)):
            stages += [(False, lambda lo, hi, b=b: self.scaled_queries(b, lo, hi)),
                       (True, lambda lo, hi, b=b: self.scores(b, lo, hi)),
                       (False, lambda lo, hi, b=b: self.softmax(b, lo, hi)),
                       (True, lambda lo, hi, b=b: self.redo_untrusted(b, lo, hi)),
                       (True, lambda lo, hi, b=b: self.weighted_sum(b, lo, hi))]
        return stages

    def scaled_queries(self, b, lo, hi):
        """(Q · scale)ᵀ of block b's queries, (items, d_k, rep, nq)."""
        q0, q1, _ = self.blocks[b]
        np.multiply(_features_first(self.q5[lo:hi, ..., q0:q1, :]), self.sc, out=self.qs_t[b][lo:hi])

    def scores(self, b, lo, hi):
        """Sᵀ = K (Q · scale)ᵀ of block b into its P buffer: (items, kv, rep · nq)."""
        kv = self.blocks[b][2]
        np.matmul(self.k[lo:hi, ..., :kv, :], _merged(self.qs_t[b][lo:hi], 2), out=_merged(self.p[b][lo:hi], 2))

    def _masked(self, b, p, lo, hi):
        """Sᵀ + M in place: the causal diagonal (along contiguous memory) and the given mask."""
        q0, q1, kv = self.blocks[b]
        if self.diag[b] is not None:                                        # keys q0 … kv-1 meet the diagonal
            rows = _flat(p[..., q0:kv, :, :], self.diag[b].size)
            rows += self.diag[b]
        if self.mask_t is not None and p.shape[-1] * p.shape[-2] == 1:     # one query (a cached step): along keys
            _merged(p, 3)[...] += self.mask_t[lo:hi, ..., :kv, 0, q0]
        elif self.mask_t is not None:
            p += self.mask_t[lo:hi, ..., :kv, :, q0:q1]

    def softmax(self, b, lo, hi):
        """Pᵀ = exp(Sᵀ + M) / z in place, z = Σ_keys exp(Sᵀ + M), for the items whose every z is in the trusted
        range; the others are left to ``redo_untrusted``."""
        p = self.p[b][lo:hi]
        self._masked(b, p, lo, hi)
        flat = _merged(p, 2)                                                # (items, kv, rep · nq)
        few = flat.shape[-1] < FEW_QUERIES
        if few and flat.size and np.maximum.reduce(flat, axis=None) < self.trusted[2]:
            np.exp(flat, out=flat)                                          # no overflow: no error state to set
        else:
            with np.errstate(over="ignore"):                                # an overflow is caught on z below
                np.exp(flat, out=flat)
        z = np.add.reduce(flat, axis=-2) if few else np.matmul(self.ones[b], flat)      # (items, rep · nq)
        low, high, _ = self.trusted
        if z.size and not (low <= np.minimum.reduce(z, axis=None) and np.maximum.reduce(z, axis=None) <= high):
            rows = _flat(z, z.shape[-1])
            bad = ~((rows.min(axis=1) >= low) & (rows.max(axis=1) <= high))
            first, *rest = np.unravel_index(np.nonzero(bad)[0], z.shape[:-1])
            self.untrusted[b] += zip(first + lo, *rest)
            rows[bad] = 1
        np.reciprocal(z, out=z)
        flat *= z[..., None, :]

    def redo_untrusted(self, b, lo, hi):
        """The softmax of block b's untrusted items among lo:hi computed again as the reference: the scores,
        then each query's largest score subtracted before exp."""
        q0, q1, kv = self.blocks[b]
        for item in [i for i in self.untrusted[b] if lo <= i[0] < hi]:
            p = self.p[b][item]                                             # (kv, rep, nq)
            qs = self.qs_t[b][item]
            np.matmul(self.k[item][:kv], qs.reshape(qs.shape[0], -1), out=p.reshape(kv, -1))
            if self.diag[b] is not None:
                p[q0:kv] += self.diag[b].reshape(p[q0:kv].shape)
            if self.mask_t is not None:
                p += self.mask_t[item][:kv, :, q0:q1]
            _shifted_softmax(p.reshape(kv, -1))

    def weighted_sum(self, b, lo, hi):
        """O = P V for block b's queries, written into ``out``: (items, rep, nq, d_v)."""
        q0, q1, kv = self.blocks[b]
        p = self.p[b][lo:hi]
        p_heads = _to_end(p.reshape(p.shape[:-2] + (-1,)), 2)         # (items, rep · nq, kv)
        p_heads = p_heads.reshape(p_heads.shape[:-2] + (self.rep, q1 - q0, kv))
        np.matmul(p_heads, self.v[lo:hi, ..., None, :kv, :], out=self.out5[lo:hi, ..., q0:q1, :])


def fused_attention_backward(dout, cache, dq=None, dk=None, dv=None):
    """Gradients for ``fused_attention_forward`` (the fast version of
    ``ops.attention.scaled_dot_product_attention_backward``, summed over each group of query heads for the
    shared keys and values as ``ops.repeat_kv_backward``). dq, dk, dv may be given as output arrays (any
    unit-last-stride views, e.g. into a fused (B, T, 3, H, d_head) gradient). dout: (..., Tq, d_v). Returns
    (dq, dk, dv) with the shapes of q, k, v.

    dV = Pᵀ dO     dP = dO Vᵀ     dS = P ⊙ (dP - r),  r_i = Σ_j P_ij dP_ij = dO_i · O_i
    dQ = dS K · scale      dK = dSᵀ Q · scale
    (r from the outputs, as in FlashAttention-2: a dot product per query instead of a pass over the scores.)
    With G = [dO · scale ; -r · scale] per query: dSᵀ · scale = Pᵀ ⊙ ([V | 1] Gᵀ). Causal blocks are
    processed from the last (which sees every key) to the first; dV and dK add up the blocks' contributions.
    """
    dout = np.asarray(dout)
    if cache.squeezed:
        dout = dout[None]
        dq, dk, dv = (None if a is None else a[None] for a in (dq, dk, dv))
    q, k, v, dt = cache.q, cache.k, cache.v, cache.p_blocks[0].dtype
    dq = np.empty(q.shape, dt) if dq is None else dq
    dk = np.empty(k.shape, dt) if dk is None else dk
    dv = np.empty(v.shape, dt) if dv is None else dv
    order = sorted(range(len(cache.blocks)), key=lambda i: -cache.blocks[i][2])     # widest key range first
    top = cache.blocks[order[0]][2]
    if top < k.shape[-2]:                         # keys that no query sees get zero gradients
        dk[..., top:, :] = 0
        dv[..., top:, :] = 0
    rep = q.shape[-3] // k.shape[-3]
    bw = _Backward(dout, cache, _heads(dq, rep), dk, dv, rep, order)
    t_q, t_k = q.shape[-2], k.shape[-2]
    items = k.shape[:-2]
    _Split(items[0], _split_grain(items, rep * t_q, t_k),
           _products_in_pieces(t_q, t_k, q.shape[-1], v.shape[-1])).run(bw.stages())
    return (dq[0], dk[0], dv[0]) if cache.squeezed else (dq, dk, dv)


class _Backward:
    """The buffers and stages of one backward call (see ``fused_attention_backward``)."""

    def __init__(self, dout, cache, dq5, dk, dv, rep, order):
        self.c, self.dq5, self.dk, self.dv, self.rep, self.order = cache, dq5, dk, dv, rep, order
        self.do5, self.o5, self.q5 = _heads(dout, rep), _heads(cache.out, rep), _heads(cache.q, rep)
        dt, items, d_v = cache.p_blocks[0].dtype, cache.k.shape[:-2], dv.shape[-1]
        self.v_aug = np.empty(items + (cache.v.shape[-2], d_v + 1), dt)
        self.g_t = [np.empty(items + (d_v + 1, rep, q1 - q0), dt) for q0, q1, _ in cache.blocks]
        self.ds = [np.empty(items + (kv, rep * (q1 - q0)), dt) for q0, q1, kv in cache.blocks]
        # a group's rows of dO and Q side by side, (items, rep · nq, d): copies, views for one head per group
        self.rows = [(np.empty(items + (rep * (q1 - q0), d_v), dt), np.empty(items + (rep * (q1 - q0),
                      cache.q.shape[-1]), dt)) if rep > 1 else None for q0, q1, _ in cache.blocks]
        self.sc = dt.type(cache.scale)

    def stages(self):
        stages = [(False, self.prepare)]
        for n, b in enumerate(self.order):
            stages += [(True, lambda lo, hi, b=b, n=n: self.value_and_score_grads(b, n == 0, lo, hi)),
                       (False, lambda lo, hi, b=b: self.score_grads(b, lo, hi)),
                       (True, lambda lo, hi, b=b, n=n: self.query_and_key_grads(b, n == 0, lo, hi))]
        return stages

    def prepare(self, lo, hi):
        """[V | 1], and per block G = [(dO · scale)ᵀ ; -r · scale], r = dO · O per query: (items, d_v + 1, rep, nq)
        (and the group's rows of dO and Q side by side)."""
        d_v = self.dv.shape[-1]
        self.v_aug[lo:hi, ..., :d_v] = self.c.v[lo:hi]
        self.v_aug[lo:hi, ..., d_v] = 1
        for b, (q0, q1, _) in enumerate(self.c.blocks):
            do = self.do5[lo:hi, ..., q0:q1, :]                                # (items, rep, nq, d_v)
            g_t = self.g_t[b][lo:hi]
            np.multiply(_features_first(do), self.sc, out=g_t[..., :d_v, :, :])
            r = np.einsum("...i,...i->...", do, self.o5[lo:hi, ..., q0:q1, :])
            r *= -self.sc
            g_t[..., d_v, :, :] = r
            if self.rows[b] is not None:
                do_rows, q_rows = self.rows[b]
                _split_rows(do_rows[lo:hi], self.rep)[...] = do
                _split_rows(q_rows[lo:hi], self.rep)[...] = self.q5[lo:hi, ..., q0:q1, :]

    def _rows(self, b, which, lo, hi):
        """Block b's rows of dO (which 0) or Q (which 1) of items lo:hi, (items, rep · nq, d)."""
        if self.rows[b] is not None:
            return self.rows[b][which][lo:hi]
        q0, q1, _ = self.c.blocks[b]
        return (self.do5, self.q5)[which][lo:hi, ..., 0, q0:q1, :]

    def value_and_score_grads(self, b, first, lo, hi):
        """dV (+)= Pᵀ dO over block b's keys, and [V | 1] Gᵀ into its dS buffer."""
        kv = self.c.blocks[b][2]
        p = _merged(self.c.p_blocks[b][lo:hi], 2)                           # (items, kv, rep · nq)
        target = self.dv[lo:hi, ..., :kv, :]
        if first:
            np.matmul(p, self._rows(b, 0, lo, hi), out=target)
        else:
            target += np.matmul(p, self._rows(b, 0, lo, hi))
        np.matmul(self.v_aug[lo:hi, ..., :kv, :], _merged(self.g_t[b][lo:hi], 2), out=self.ds[b][lo:hi])

    def score_grads(self, b, lo, hi):
        """dSᵀ · scale = Pᵀ ⊙ [V | 1] Gᵀ, in place."""
        ds = self.ds[b][lo:hi]
        np.multiply(ds, _merged(self.c.p_blocks[b][lo:hi], 2), out=ds)

    def query_and_key_grads(self, b, first, lo, hi):
        """dQ = (dS · scale) K for block b's queries, dK (+)= (dSᵀ · scale) Q over its keys."""
        q0, q1, kv = self.c.blocks[b]
        ds = self.ds[b][lo:hi]                                              # (items, kv, rep · nq)
        ds_heads = _to_end(ds, 2).reshape(ds.shape[:-2] + (self.rep, q1 - q0, kv))
        np.matmul(ds_heads, self.c.k[lo:hi, ..., None, :kv, :], out=self.dq5[lo:hi, ..., q0:q1, :])
        target = self.dk[lo:hi, ..., :kv, :]
        if first:
            np.matmul(ds, self._rows(b, 1, lo, hi), out=target)
        else:
            target += np.matmul(ds, self._rows(b, 1, lo, hi))


def _split_rows(a, rep):
    """(items, rep · nq, d) seen as (items, rep, nq, d): a view."""
    return a.reshape(a.shape[:-2] + (rep, a.shape[-2] // rep, a.shape[-1]))


__all__ = ["fused_attention_forward", "fused_attention_backward", "FastAttentionCache", "CAUSAL_BLOCK"]
