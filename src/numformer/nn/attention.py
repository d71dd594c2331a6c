"""Multi-head attention (Vaswani et al. 2017, §3.2.2):

    MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O,   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

All heads are one batched axis (no Python loop over heads). For self-attention
the three input projections are one fused matmul with ``qkv_proj.weight`` =
[W^Q; W^K; W^V] of shape (3·d_model, d_model), the layout of torch's
``in_proj_weight``; cross-attention uses row slices of the same weight.

A forward pass has three steps, each a method: ``_project`` forms the
per-head q, k, v (B, H, T, d_head) from the inputs; a kernel from ``KERNELS``
computes the per-head context softmax(q kᵀ/√d_head + M) v; ``out_proj`` maps
the merged heads back to d_model. Backward runs them in reverse
(``_project_backward`` turns dq, dk, dv into the input gradients).

Mask convention (as ``torch.nn.MultiheadAttention``): a boolean mask is True
where attention is **not allowed**; a float mask is added to the scores.

The Llama-family options: ``n_kv_heads`` < ``n_heads`` shares each key/value
head among n_heads / n_kv_heads query heads (grouped-query attention,
``ops.grouped_query``; ``qkv_proj`` and the KV cache hold n_kv_heads key/value
heads, repeated for the kernel). In self-attention, ``positional="rope"``
rotates queries and keys by their positions (``ops.rotary``) after the
projection, and ``positional="alibi"`` adds per-head linear distance biases to
the scores inside every kernel (``ops.alibi``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import ops
from ..kernels.flash_attention import (DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, flash_attention_backward,
                                       flash_attention_forward)
from ..kernels.fused_attention import fused_attention_backward, fused_attention_forward
from . import dispatch, init
from .dispatch import F
from .layers import Linear
from .module import Module


class KVCache:
    """Keys and values of the positions already processed by one attention layer.

    Used for incremental decoding: each call appends the new positions' keys
    and values, so a step costs O(T) instead of recomputing O(T²).
    ``static=True`` (cross-attention) computes them once from the memory.
    Arrays: (batch, heads, capacity, d_head); the first ``stored`` rows are valid, the keys and values of the
    last ``stored`` of the ``length`` positions processed so far.

    ``window=W`` (sliding-window attention: a query attends to the W most recent positions, itself included)
    keeps only what the next queries can attend to: before new positions are appended into a full array, all
    but the last W - 1 stored positions are dropped, so the arrays stay at most about 2·(W + new positions)
    long however long the generation (memory flat beyond W).
    """

    def __init__(self, static=False, window=None):
        self.static, self.window = static, window
        self.k = self.v = None
        self.length = self.stored = 0

    def _drop_outside_window(self):
        keep = self.window - 1
        if self.stored > keep:
            drop = self.stored - keep
            self.k[:, :, :keep] = self.k[:, :, drop:self.stored].copy()
            self.v[:, :, :keep] = self.v[:, :, drop:self.stored].copy()
            self.stored = keep

    def append(self, k, v):
        B, H, T, dh = k.shape
        if self.window is not None and self.k is not None and self.stored + T > self.k.shape[2]:
            self._drop_outside_window()
        need = self.stored + T
        if self.k is None or need > self.k.shape[2]:
            cap = max(need, 2 * (0 if self.k is None else self.k.shape[2]), 16)
            if self.window is not None:
                cap = max(need, min(cap, 2 * (self.window + T)))
            new_k = np.empty((B, H, cap, dh), dtype=k.dtype)
            new_v = np.empty((B, H, cap, dh), dtype=v.dtype)
            if self.stored:
                new_k[:, :, :self.stored] = self.k[:, :, :self.stored]
                new_v[:, :, :self.stored] = self.v[:, :, :self.stored]
            self.k, self.v = new_k, new_v
        self.k[:, :, self.stored:need] = k
        self.v[:, :, self.stored:need] = v
        self.stored, self.length = need, self.length + T
        return self.k[:, :, :need], self.v[:, :, :need]

    def view(self):
        return self.k[:, :, :self.stored], self.v[:, :, :self.stored]

    def reset(self):
        self.k = self.v = None
        self.length = self.stored = 0

    def reorder(self, indices):
        """Row i continues old row ``indices[i]`` (batch axis; beam search reorders its beams this way)."""
        if self.k is not None:
            self.k = np.take(self.k, indices, axis=0)
            self.v = np.take(self.v, indices, axis=0)


def _split_heads(x, n, n_heads):
    """(B, T, n·E) -> n arrays of shape (B, H, T, d_head) (views, no copy)."""
    B, T, _ = x.shape
    x = x.reshape(B, T, n, n_heads, -1).transpose(2, 0, 3, 1, 4)
    return tuple(x[i] for i in range(n))


def _split_groups(x, counts):
    """(B, T, Σcounts·d_head) -> one (B, h, T, d_head) view per entry h of ``counts`` (e.g. (H, H_kv, H_kv))."""
    B, T, _ = x.shape
    x = x.reshape(B, T, sum(counts), -1).transpose(0, 2, 1, 3)
    bounds = np.cumsum((0,) + tuple(counts))
    return tuple(x[:, a:b] for a, b in zip(bounds[:-1], bounds[1:]))


def _as_heads(rows):
    """A (B, T, H, d_head) array seen as (B, H, T, d_head) (a view)."""
    return rows.transpose(0, 2, 1, 3)


def check_module_masks(t_q, t_k, attn_mask=None, key_padding_mask=None, batch=None, n_heads=None):
    """Validate the module-level masks (torch.nn convention); return them as arrays, a 3-D attn_mask
    (B·H, Tq, Tk) reshaped to (B, H, Tq, Tk). Shared by every kernel of ``MultiHeadAttention``.

    attn_mask: (Tq, Tk), (B·H, Tq, Tk) or (B, H, Tq, Tk).   key_padding_mask: (B, Tk).
    """
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.ndim == 3:
            if batch is None or m.shape[0] != batch * n_heads:
                raise ValueError(f"a 3-D attn_mask must have shape (batch*heads, {t_q}, {t_k}), got {m.shape}")
            m = m.reshape(batch, n_heads, *m.shape[1:])
        if m.ndim not in (2, 4) or m.shape[-2:] != (t_q, t_k):
            raise ValueError(f"attn_mask must have shape ({t_q}, {t_k}), (batch*heads, {t_q}, {t_k}) or "
                             f"(batch, heads, {t_q}, {t_k}); got {np.shape(attn_mask)}")
        attn_mask = m
    if key_padding_mask is not None:
        m = np.asarray(key_padding_mask)
        if m.ndim != 2 or m.shape[1] != t_k or (batch is not None and m.shape[0] != batch):
            raise ValueError(f"key_padding_mask must have shape (batch, {t_k}), got {m.shape}")
        key_padding_mask = m
    return attn_mask, key_padding_mask


def _additive(m, dtype):
    """A module mask (bool True = blocked, or float) as an additive float mask (0 / -inf)."""
    return np.where(m, -np.inf, 0.0).astype(dtype) if m.dtype == bool else m.astype(dtype)


def sliding_window_mask(t_q, t_k, window, offset=0):
    """(Tq, Tk) bool, True = blocked: query i (at key index i + offset) may attend key j only if
    i + offset - j < window, i.e. to the ``window`` most recent keys, itself included (Mistral's window)."""
    return (offset + np.arange(t_q))[:, None] - np.arange(t_k)[None, :] >= window


def _with_window(attn_mask, t_q, t_k, window, offset):
    """A checked module attn_mask (None, 2-D or 4-D; bool or float) with the window's blocked keys added."""
    blocked = sliding_window_mask(t_q, t_k, window, offset)
    if attn_mask is None:
        return blocked
    if attn_mask.dtype == bool:
        return attn_mask | blocked
    return attn_mask + np.where(blocked, -np.inf, 0.0).astype(attn_mask.dtype)


def build_attention_mask(t_q, t_k, dtype, attn_mask=None, key_padding_mask=None, is_causal=False,
                         batch=None, n_heads=None, causal_offset=0):
    """Combine the module-level masks into one additive float mask, or None.

    attn_mask: (Tq, Tk), (B·H, Tq, Tk) or (B, H, Tq, Tk); bool True = blocked, float added.
    key_padding_mask: (B, Tk); bool True = padding (blocked), float added.
    is_causal: query i may attend key j only if j <= i + causal_offset
    (causal_offset = number of cached positions, for incremental decoding).
    Returns an array broadcastable to (B, H, Tq, Tk) with 0 / -inf (plus float masks).
    """
    attn_mask, key_padding_mask = check_module_masks(t_q, t_k, attn_mask, key_padding_mask, batch, n_heads)
    return _combine_masks(t_q, t_k, dtype, attn_mask, key_padding_mask, is_causal, causal_offset)


def _combine_masks(t_q, t_k, dtype, attn_mask, key_padding_mask, is_causal, causal_offset):
    """``build_attention_mask`` on masks already checked (attn_mask 2-D or 4-D)."""
    parts = []
    if is_causal:
        blocked = ~np.tril(np.ones((t_q, t_k), dtype=bool), k=causal_offset)
        parts.append(np.where(blocked, -np.inf, 0.0).astype(dtype))
    if attn_mask is not None:
        parts.append(_additive(attn_mask, dtype))
    if key_padding_mask is not None:
        parts.append(_additive(key_padding_mask[:, None, None, :], dtype))
    mask = None
    for m in parts:
        mask = m if mask is None else mask + m
    return mask


class Masks(NamedTuple):
    """The masks of one attention call, validated (``check_module_masks``), in the module convention.

    ``causal_offset``: the number of cached positions before the queries (incremental decoding).
    ``shortcut_causal``: the kernel may apply a plain causal mask by itself (no (Tq, Tk) mask built).
    """
    attn_mask: np.ndarray | None
    key_padding_mask: np.ndarray | None
    is_causal: bool
    causal_offset: int = 0
    shortcut_causal: bool = False
    alibi_slopes: np.ndarray | None = None

    def additive(self, q, k):
        """(mask, is_causal) for the kernels that take one additive mask: the combined float mask (with the
        ALiBi bias (H, Tq, Tk) if any), or (None, True) when a plain causal mask is all there is and the
        kernel may apply it itself."""
        if self.shortcut_causal:
            return None, True
        t_q, t_k = q.shape[2], k.shape[2]
        mask = _combine_masks(t_q, t_k, q.dtype, self.attn_mask, self.key_padding_mask, self.is_causal,
                              self.causal_offset)
        if self.alibi_slopes is not None:
            bias = ops.alibi_bias(self.alibi_slopes, t_q, t_k, self.causal_offset, q.dtype)
            mask = bias if mask is None else mask + bias
        return mask, False


# -- the kernels ------------------------------------------------------------------------------------------
# Each kernel is a pair. forward(layer, q, k, v, masks, p_drop, out) writes the context (B, H, Tq, d_head)
# into ``out`` and returns (weights or None, cache); backward(dctx, cache, dq, dk, dv) writes the gradients
# into the given (B, H, T, d_head) arrays.

def _reference_forward(layer, q, k, v, masks, p_drop, out):
    """ops.attention: the reference kernel, the only one with attention dropout."""
    mask, causal = masks.additive(q, k)
    ctx, weights, cache = F.scaled_dot_product_attention_forward(
        q, k, v, attn_mask=mask, is_causal=causal, dropout_p=p_drop, rng=layer.rng,
        need_weights=layer.record_weights)
    out[...] = ctx
    return weights, cache


def _fused_forward(layer, q, k, v, masks, p_drop, out):
    """kernels.fused_attention: the fast version of the reference (no dropout)."""
    mask, causal = masks.additive(q, k)
    _, cache = fused_attention_forward(q, k, v, mask, causal, out=out)
    return (np.swapaxes(cache.weights_t, -1, -2) if layer.record_weights else None), cache


def _flash_forward(layer, q, k, v, masks, p_drop, out):
    """kernels.flash_attention: memory linear in the sequence length (no dropout, no weights). The module masks
    (bool True = blocked) become functional ones (True = may attend) without building a (Tq, Tk) mask."""
    if p_drop > 0.0:
        raise ValueError(f"attention='flash' has no attention dropout (dropout={p_drop}); set dropout = 0 "
                         f"(a model's dropout also drops attention weights), call .eval() for inference, "
                         f"or use attention='plain'")
    mask, key_mask = masks.attn_mask, masks.key_padding_mask
    mask = ~mask if mask is not None and mask.dtype == bool else mask
    key_mask = ~key_mask if key_mask is not None and key_mask.dtype == bool else key_mask
    ctx, cache = flash_attention_forward(q, k, v, attn_mask=mask, is_causal=masks.is_causal, key_mask=key_mask,
                                         causal_offset=masks.causal_offset, block_q=layer.flash_block_q,
                                         block_k=layer.flash_block_k, alibi_slopes=masks.alibi_slopes)
    out[...] = ctx
    return None, cache


def _writing(backward):
    """A kernel backward that returns (dq, dk, dv), as one that writes them into the given arrays."""
    def write(dctx, cache, dq, dk, dv):
        for target, g in zip((dq, dk, dv), backward(dctx, cache)):
            target[...] = g
    return write


KERNELS = {
    "reference": (_reference_forward, _writing(lambda dctx, c: F.scaled_dot_product_attention_backward(dctx, c))),
    "fused": (_fused_forward, fused_attention_backward),
    "flash": (_flash_forward, _writing(flash_attention_backward)),
}


class MultiHeadAttention(Module):
    """Multi-head attention with a fused QKV projection; self- or cross-attention.

    d_model: model width E;  n_heads: h (E must divide by h);  d_head = E / h.
    forward(query (B, Tq, E), key=None, value=None, ...) -> (B, Tq, E).
    key defaults to query (self-attention), value to key (cross-attention on a memory).

    backward(dout (B, Tq, E)) returns one gradient per distinct input, in the
    order query, key, value: dquery for self-attention (key and value are the
    query), (dquery, dkey) when value is key (cross-attention on a memory),
    (dquery, dkey, dvalue) otherwise.

    Set ``record_weights = True`` to keep the last attention weights (B, h, Tq, Tk)
    in ``last_weights``; set ``head_mask`` (h,) to scale each head's output
    (0 ablates a head).

    ``attention="flash"`` computes the attention with the memory-efficient kernel
    (``kernels.flash_attention``: block-wise online softmax, recomputation in backward,
    memory linear in the sequence length) instead of the plain one (``"plain"``).
    Results and gradients are the same. The flash kernel has no attention
    dropout: in training mode with ``dropout > 0`` forward raises a ValueError.
    With ``record_weights`` the plain kernel is used (the weights must be built).
    ``flash_block_q`` / ``flash_block_k`` set its block sizes.

    Which kernel of ``KERNELS`` runs (``kernel_name``): "flash" as just said;
    with ``attention="plain"``, "fused" (``kernels.fused_attention``, the fast
    version of the reference) unless attention dropout is active, then
    "reference" (``ops.attention``); always "reference" inside
    ``numformer.reference_mode()``.

    Llama-family options: ``n_kv_heads`` (a divisor of n_heads, default n_heads)
    key/value heads, so ``qkv_proj.weight`` is [W^Q; W^K; W^V] of shape
    ((n_heads + 2·n_kv_heads)·d_head, d_model); ``positional`` (self-attention
    only): None, "rope" (rotary embeddings with base ``rope_theta``; d_head must
    be even) or "alibi" (linear biases with slopes ``alibi_slopes``). Positions
    count from 0, or continue after a KVCache's cached ones. ``qkv_bias`` (default
    ``bias``): biases on the q/k/v projection alone (Qwen2 has no output-projection bias).

    ``sliding_window=W`` (self-attention): query i attends only keys j with
    i - W < j (Mistral's window; with ``is_causal`` also j <= i). The window enters every
    kernel as part of its attention mask (``sliding_window_mask``), so the reference, fused
    and flash kernels and their backward passes need nothing else; a cached step keeps only
    the keys the window reaches (``KVCache(window=W)``).
    """

    ATTENTION_KINDS = ("plain", "flash")
    POSITIONAL_KINDS = (None, "rope", "alibi")

    def __init__(self, d_model, n_heads, dropout=0.0, bias=True, rng=None, dtype=np.float32, attention="plain",
                 n_kv_heads=None, positional=None, rope_theta=10000.0, qkv_bias=None, sliding_window=None):
        super().__init__()
        if attention not in self.ATTENTION_KINDS:
            raise ValueError(f"unknown attention kernel {attention!r}; choose one of {list(self.ATTENTION_KINDS)}")
        self.attention = attention
        self.flash_block_q, self.flash_block_k = DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K
        if n_heads <= 0 or d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads} "
                             f"(each head gets d_model / n_heads features)")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        ops.check_kv_heads(n_heads, n_kv_heads)
        if positional not in self.POSITIONAL_KINDS:
            raise ValueError(f"unknown attention positional option {positional!r}; choose None, 'rope' or 'alibi'")
        if positional == "rope" and (d_model // n_heads) % 2:
            raise ValueError(f"positional='rope' needs an even head size, but d_model / n_heads = {d_model} / "
                             f"{n_heads} = {d_model // n_heads}; change d_model or n_heads")
        if sliding_window is not None and (type(sliding_window) is not int or sliding_window < 1):
            raise ValueError(f"sliding_window must be a positive integer (keys attended per query) or None, "
                             f"got {sliding_window!r}")
        rng = init.default_rng(rng)
        self.sliding_window = sliding_window
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.n_kv_heads, self.positional, self.rope_theta = int(n_kv_heads), positional, float(rope_theta)
        self.alibi_slopes = ops.alibi_slopes(n_heads) if positional == "alibi" else None
        self.dropout_p = dropout
        self.rng = rng
        d_qkv = d_model + 2 * self.n_kv_heads * self.d_head
        qkv_bias = bias if qkv_bias is None else qkv_bias
        self.qkv_proj = Linear(d_model, d_qkv, qkv_bias, rng, dtype)
        self.qkv_proj.weight.data[...] = init.xavier_uniform(rng, (d_qkv, d_model), dtype)
        if qkv_bias:
            self.qkv_proj.bias.data[...] = 0
        self.out_proj = Linear(d_model, d_model, bias, rng, dtype)
        if bias:
            self.out_proj.bias.data[...] = 0
        self.record_weights = False
        self.last_weights = None
        self.head_mask = None
        self._cache = None

    def extra_repr(self):
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, dropout={self.dropout_p}"
                + (f", n_kv_heads={self.n_kv_heads}" if self.n_kv_heads != self.n_heads else "")
                + (f", positional={self.positional!r}" if self.positional else "")
                + (f", sliding_window={self.sliding_window}" if self.sliding_window else "")
                + (f", attention={self.attention!r}" if self.attention != "plain" else ""))

    def kernel_name(self, p_drop):
        """The entry of ``KERNELS`` used for attention dropout ``p_drop``."""
        if dispatch.using_reference():
            return "reference"
        if self.attention == "flash" and not self.record_weights:
            return "flash"
        return "fused" if p_drop == 0.0 else "reference"

    # -- projections -------------------------------------------------------------
    def _project(self, query, key, value):
        """The per-head queries, keys and values, each (B, H, T, d_head), and the caches of the projections.

        Each distinct input is projected by its rows of ``qkv_proj``: self-attention is one matmul with all
        (H + 2·H_kv)·d_head rows; cross-attention projects the query with W^Q and the memory with [W^K; W^V]
        (or each separately when value is not key). Each cache entry is (linear cache, (B, T, head counts)).
        """
        H, Hkv, dh = self.n_heads, self.n_kv_heads, self.d_head
        W = self.qkv_proj.weight.data
        b = None if self.qkv_proj.bias is None else self.qkv_proj.bias.data
        if key is query and value is query:
            groups = ((query, (H, Hkv, Hkv)),)
        elif value is key:
            groups = ((query, (H,)), (key, (Hkv, Hkv)))
        else:
            groups = ((query, (H,)), (key, (Hkv,)), (value, (Hkv,)))
        heads, caches, start = (), [], 0
        for x, counts in groups:
            rows = slice(start, start + sum(counts) * dh)
            start = rows.stop
            y, c = F.linear_forward(x, W[rows], None if b is None else b[rows])
            heads += _split_groups(y, counts)
            caches.append((c, x.shape[:2] + (counts,)))
        return heads, caches

    def _project_backward(self, grad_rows, caches):
        """Input gradients from the (B, T, heads, d_head) gradients of each projection; accumulates dW, db."""
        results = [F.linear_backward(g.reshape(g.shape[:2] + (-1,)), c) for g, (c, _) in zip(grad_rows, caches)]
        if len(results) == 1:
            _, dW, db = results[0]
        else:
            dW = np.concatenate([r[1] for r in results])
            db = None if results[0][2] is None else np.concatenate([r[2] for r in results])
        self.qkv_proj.weight.accumulate(dW)
        if self.qkv_proj.bias is not None:
            self.qkv_proj.bias.accumulate(db)
        dxs = tuple(r[0] for r in results)
        return dxs[0] if len(dxs) == 1 else dxs

    # -- positions inside attention and shared key/value heads ----------------------
    @property
    def _plain_heads(self):
        """True for the 2017 attention: no positions inside, as many key/value heads as query heads."""
        return self.positional is None and self.n_kv_heads == self.n_heads

    def _positions(self, q, k, offset, positions=None):
        """RoPE on q and k: the queries and new keys are at positions offset, offset+1, …, or at ``positions``
        (B, T) (a left-padded row counts its real tokens); identity otherwise. ALiBi needs no positions here:
        its bias -m·|i - j| depends on the distance only, the same for a left-padded row's real tokens."""
        if self.positional != "rope":
            return q, k, None
        q, cq = F.rope_forward(q, offset, self.rope_theta, positions)
        k, ck = F.rope_forward(k, offset, self.rope_theta, positions)
        return q, k, (cq, ck)

    def _share_kv(self, k, v):
        """Repeat each key/value head for its n_heads / n_kv_heads query heads: (B, H_kv, T, d) -> (B, H, T, d).
        Returns (k, v, caches of the two repeats)."""
        rep = self.n_heads // self.n_kv_heads
        (k, ck), (v, cv) = F.repeat_kv_forward(k, rep), F.repeat_kv_forward(v, rep)
        return k, v, (ck, cv)

    def _undo_positions(self, dq, dk, dv, pos_cache, share_cache):
        """Backward of _share_kv and _positions: sum the shared heads' gradients, rotate back."""
        dk, dv = F.repeat_kv_backward(dk, share_cache[0]), F.repeat_kv_backward(dv, share_cache[1])
        if pos_cache is not None:
            dq, dk = F.rope_backward(dq, pos_cache[0]), F.rope_backward(dk, pos_cache[1])
        return dq, dk, dv

    def _check_inputs(self, query, key, value):
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.ndim != 3 or x.shape[-1] != self.d_model:
                raise ValueError(f"{name} must have shape (batch, seq, {self.d_model}), got {x.shape}")
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(f"query {query.shape}, key {key.shape} and value {value.shape} must share the batch "
                             f"size, and key/value the sequence length")
        if self.positional is not None and not (key is query and value is query):
            raise ValueError(f"positional={self.positional!r} is an option of self-attention; cross-attention "
                             f"(key or value not the query) needs positional=None")

    # -- attention ---------------------------------------------------------------
    def _masks(self, q, k, attn_mask, key_padding_mask, is_causal, causal_offset=0, cached=False, window=False):
        """``window``: apply ``sliding_window`` (self-attention; query i is at key index i + causal_offset)."""
        B, H, t_q, _ = q.shape
        t_k = k.shape[2]
        attn_mask, key_padding_mask = check_module_masks(t_q, t_k, attn_mask, key_padding_mask, B, H)
        if window and self.sliding_window is not None:
            attn_mask = _with_window(attn_mask, t_q, t_k, self.sliding_window, causal_offset)
        shortcut = (is_causal and attn_mask is None and key_padding_mask is None and t_q == t_k and not cached
                    and self.alibi_slopes is None)
        return Masks(attn_mask, key_padding_mask, is_causal, causal_offset, shortcut, self.alibi_slopes)

    def _attend(self, name, q, k, v, masks, p_drop):
        """The kernel ``name`` on the per-head q, k, v: the context in the merged-heads layout (B, Tq, H, d_head)
        and the kernel's cache. Records the weights and applies the head mask."""
        B, H, t_q, dh = q.shape
        merged = np.empty((B, t_q, H, dh), dtype=q.dtype)
        weights, cache = KERNELS[name][0](self, q, k, v, masks, p_drop, _as_heads(merged))
        if self.record_weights:
            self.last_weights = weights
        if self.head_mask is not None:          # a new array: the fused kernel's cache holds ``merged``
            merged = merged * np.asarray(self.head_mask, dtype=merged.dtype)[None, None, :, None]
        return merged, cache

    # -- forward / backward -------------------------------------------------------
    def forward(self, query, key=None, value=None, attn_mask=None, key_padding_mask=None, is_causal=False,
                kv_cache=None, positions=None):
        """``positions`` (B, Tq): the tokens' positions for positional='rope' (default 0 … Tq-1, after the
        cached ones with a KVCache)."""
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        if kv_cache is not None:
            return self._forward_cached(query, key, value, attn_mask, key_padding_mask, is_causal, kv_cache,
                                        positions)
        (q, k, v), proj_cache = self._project(query, key, value)        # q: (B, H, T, d_head), k, v: H_kv heads
        q, k, pos_cache = self._positions(q, k, 0, positions)
        k, v, share_cache = self._share_kv(k, v)
        masks = self._masks(q, k, attn_mask, key_padding_mask, is_causal, window=key is query)
        p_drop = self.dropout_p if self.training else 0.0
        name = self.kernel_name(p_drop)
        ctx, attn_cache = self._attend(name, q, k, v, masks, p_drop)   # (B, Tq, H, d_head)
        self._cache = (name, proj_cache, attn_cache, pos_cache, share_cache)
        return self.out_proj(ctx.reshape(query.shape))

    def backward(self, dout):
        """Gradients of the inputs (see the class docstring for what is returned); accumulates the parameters'."""
        name, proj_cache, attn_cache, pos_cache, share_cache = self._cache
        self._cache = None
        B, Tq, E = dout.shape
        H, dh = self.n_heads, self.d_head
        dctx = _as_heads(self.out_proj.backward(dout).reshape(B, Tq, H, dh))
        if self.head_mask is not None:
            dctx = dctx * np.asarray(self.head_mask, dtype=dctx.dtype)[None, :, None, None]
        grad_rows = [np.empty((b, t, sum(counts), dh), dtype=dctx.dtype) for _, (b, t, counts) in proj_cache]
        views = tuple(v for g, (_, (_, _, counts)) in zip(grad_rows, proj_cache)
                      for v in _split_groups(g.reshape(g.shape[:2] + (-1,)), counts))     # dq, dk, dv
        if self._plain_heads:
            KERNELS[name][1](dctx, attn_cache, *views)                # writes into grad_rows
        else:
            Tk = views[1].shape[2]
            grads = (np.empty(dctx.shape, dctx.dtype),) + tuple(np.empty((B, H, Tk, dh), dctx.dtype) for _ in "kv")
            KERNELS[name][1](dctx, attn_cache, *grads)
            for view, g in zip(views, self._undo_positions(*grads, pos_cache, share_cache)):
                view[...] = g
        return self._project_backward(grad_rows, proj_cache)

    def _forward_cached(self, query, key, value, attn_mask, key_padding_mask, is_causal, cache, positions=None):
        """Inference step with a KVCache: no backward. Self-attention appends the new keys/values;
        a static cache (cross-attention) projects the memory once and reuses it."""
        E, H, Hkv = self.d_model, self.n_heads, self.n_kv_heads
        W = self.qkv_proj.weight.data
        b = None if self.qkv_proj.bias is None else self.qkv_proj.bias.data
        offset = cache.length
        if cache.static:
            q, _ = F.linear_forward(query, W[:E], None if b is None else b[:E])
            (q,) = _split_heads(q, 1, H)
            if cache.length == 0:
                kv, _ = F.linear_forward(key, W[E:], None if b is None else b[E:])
                cache.append(*_split_groups(kv, (Hkv, Hkv)))
            k, v, _ = self._share_kv(*cache.view())
            offset = 0
        else:
            if not (key is query and value is query):
                raise ValueError("a growing KVCache is for self-attention; use KVCache(static=True) for a memory")
            qkv, _ = F.linear_forward(query, W, b)
            q, k_new, v_new = _split_groups(qkv, (H, Hkv, Hkv))
            q, k_new, _ = self._positions(q, k_new, offset, positions)       # the cache keeps rotated keys, n_kv_heads heads
            k, v, _ = self._share_kv(*cache.append(k_new, v_new))
        causal = is_causal and not cache.static and query.shape[1] > 1
        if not cache.static:
            offset = k.shape[2] - query.shape[1]        # stored keys before the queries (a window drops old ones)
            if key_padding_mask is not None:           # given for every position processed: keep the stored ones
                key_padding_mask = np.asarray(key_padding_mask)[:, -k.shape[2]:]
        masks = self._masks(q, k, attn_mask, key_padding_mask, causal, offset, cached=True, window=not cache.static)
        ctx, _ = self._attend(self.kernel_name(0.0), q, k, v, masks, 0.0)
        out, _ = F.linear_forward(ctx.reshape(query.shape), self.out_proj.weight.data,
                                    None if self.out_proj.bias is None else self.out_proj.bias.data)
        return out
