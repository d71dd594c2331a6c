"""Multi-head attention (Vaswani et al. 2017, §3.2.2):

    MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O,   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

All heads are one batched axis (no Python loop over heads). For self-attention
the three input projections are one fused matmul with ``qkv_proj.weight`` =
[W^Q; W^K; W^V] of shape (3·d_model, d_model), the layout of torch's
``in_proj_weight``; cross-attention uses row slices of the same weight.

Mask convention (as ``torch.nn.MultiheadAttention``): a boolean mask is True
where attention is **not allowed**; a float mask is added to the scores.

The Llama-family options act on self-attention inside this module:
``positional="rope"`` rotates queries and keys by their positions
(``ops.rotary``), ``positional="alibi"`` adds per-head linear distance biases to
the scores (``ops.alibi``), and ``n_kv_heads`` < ``n_heads`` shares each key/value
head among n_heads / n_kv_heads query heads (grouped-query attention,
``ops.grouped_query``; the projection and the KV cache hold n_kv_heads heads).
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ops.attention import (FastAttentionCache, fused_attention_backward, fused_attention_forward,
                             scaled_dot_product_attention_backward, scaled_dot_product_attention_forward)
from ..ops.flash_attention import FlashAttentionCache, flash_attention_backward, flash_attention_forward
from . import init
from .layers import Linear
from .module import Module, Parameter


class KVCache:
    """Keys and values of the positions already processed by one attention layer.

    Used for incremental decoding: each call appends the new positions' keys
    and values, so a step costs O(T) instead of recomputing O(T²).
    ``static=True`` (cross-attention) computes them once from the memory.
    Arrays: (batch, heads, capacity, d_head); ``length`` positions are valid.
    """

    def __init__(self, static=False):
        self.static = static
        self.k = self.v = None
        self.length = 0

    def append(self, k, v):
        B, H, T, dh = k.shape
        need = self.length + T
        if self.k is None or need > self.k.shape[2]:
            cap = max(need, 2 * (0 if self.k is None else self.k.shape[2]), 16)
            new_k = np.empty((B, H, cap, dh), dtype=k.dtype)
            new_v = np.empty((B, H, cap, dh), dtype=v.dtype)
            if self.length:
                new_k[:, :, :self.length] = self.k[:, :, :self.length]
                new_v[:, :, :self.length] = self.v[:, :, :self.length]
            self.k, self.v = new_k, new_v
        self.k[:, :, self.length:need] = k
        self.v[:, :, self.length:need] = v
        self.length = need
        return self.k[:, :, :need], self.v[:, :, :need]

    def view(self):
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def reset(self):
        self.k = self.v = None
        self.length = 0

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


def _split_qkv(x, n_heads, n_kv_heads):
    """(B, T, (H + 2·H_kv)·d_head) -> q (B, H, T, d_head), k and v (B, H_kv, T, d_head) (views, no copy)."""
    B, T, _ = x.shape
    x = x.reshape(B, T, n_heads + 2 * n_kv_heads, -1).transpose(0, 2, 1, 3)
    return x[:, :n_heads], x[:, n_heads:n_heads + n_kv_heads], x[:, n_heads + n_kv_heads:]


def _merge_heads(x):
    """(B, H, T, d_head) -> (B, T, H·d_head)."""
    B, H, T, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * dh)


def _heads_to_rows(dx, out):
    """Write a (B, H, T, d_head) gradient into ``out`` of shape (B, T, H, d_head)."""
    out[...] = dx.transpose(0, 2, 1, 3)


def build_attention_mask(t_q, t_k, dtype, attn_mask=None, key_padding_mask=None, is_causal=False,
                         batch=None, n_heads=None, causal_offset=0):
    """Combine the module-level masks into one additive float mask, or None.

    attn_mask: (Tq, Tk), (B·H, Tq, Tk) or (B, H, Tq, Tk); bool True = blocked, float added.
    key_padding_mask: (B, Tk); bool True = padding (blocked), float added.
    is_causal: query i may attend key j only if j <= i + causal_offset
    (causal_offset = number of cached positions, for incremental decoding).
    Returns an array broadcastable to (B, H, Tq, Tk) with 0 / -inf (plus float masks).
    """
    mask = None

    def add(m):
        nonlocal mask
        mask = m if mask is None else mask + m

    if is_causal:
        blocked = ~np.tril(np.ones((t_q, t_k), dtype=bool), k=causal_offset)
        add(np.where(blocked, -np.inf, 0.0).astype(dtype))
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.ndim == 3:
            if batch is None or m.shape[0] != batch * n_heads:
                raise ValueError(f"a 3-D attn_mask must have shape (batch*heads, {t_q}, {t_k}), got {m.shape}")
            m = m.reshape(batch, n_heads, *m.shape[1:])
        if m.ndim not in (2, 4) or m.shape[-2:] != (t_q, t_k):
            raise ValueError(f"attn_mask must have shape ({t_q}, {t_k}), (batch*heads, {t_q}, {t_k}) or "
                             f"(batch, heads, {t_q}, {t_k}); got {np.shape(attn_mask)}")
        add(np.where(m, -np.inf, 0.0).astype(dtype) if m.dtype == bool else m.astype(dtype))
    if key_padding_mask is not None:
        m = np.asarray(key_padding_mask)
        if m.ndim != 2 or m.shape[1] != t_k or (batch is not None and m.shape[0] != batch):
            raise ValueError(f"key_padding_mask must have shape (batch, {t_k}), got {m.shape}")
        m = m[:, None, None, :]
        add(np.where(m, -np.inf, 0.0).astype(dtype) if m.dtype == bool else m.astype(dtype))
    return mask


class MultiHeadAttention(Module):
    """Multi-head attention with a fused QKV projection; self- or cross-attention.

    d_model: model width E;  n_heads: h (E must divide by h);  d_head = E / h.
    forward(query (B, Tq, E), key=None, value=None, ...) -> (B, Tq, E).
    key defaults to query (self-attention), value to key (cross-attention on a memory).

    Set ``record_weights = True`` to keep the last attention weights (B, h, Tq, Tk)
    in ``last_weights``; set ``head_mask`` (h,) to scale each head's output
    (0 ablates a head).

    ``attention="flash"`` computes the attention with the memory-efficient kernel
    (``ops.flash_attention``: block-wise online softmax, recomputation in backward,
    memory linear in the sequence length) instead of the plain one (``"plain"``).
    Results and gradients are the same. The flash kernel has no attention
    dropout: in training mode with ``dropout > 0`` forward raises a ValueError.
    With ``record_weights`` the plain kernel is used (the weights must be built).
    ``flash_block_q`` / ``flash_block_k`` set its block sizes.

    Self-attention options (Llama family): ``n_kv_heads`` (a divisor of n_heads,
    default n_heads) key/value heads, so ``qkv_proj.weight`` is
    [W^Q; W^K; W^V] of shape ((n_heads + 2·n_kv_heads)·d_head, d_model);
    ``positional``: None, "rope" (rotary embeddings with base ``rope_theta``;
    d_head must be even) or "alibi" (linear biases, slopes ``alibi_slopes``).
    Positions count from 0, or continue after a KVCache's cached ones.
    """

    ATTENTION_KINDS = ("plain", "flash")
    POSITIONAL_KINDS = (None, "rope", "alibi")

    def __init__(self, d_model, n_heads, dropout=0.0, bias=True, rng=None, dtype=np.float32, attention="plain",
                 n_kv_heads=None, positional=None, rope_theta=10000.0):
        super().__init__()
        if attention not in self.ATTENTION_KINDS:
            raise ValueError(f"unknown attention kernel {attention!r}; choose one of {list(self.ATTENTION_KINDS)}")
        self.attention = attention
        self.flash_block_q = self.flash_block_k = 256
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
        rng = init.default_rng(rng)
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.n_kv_heads, self.positional, self.rope_theta = int(n_kv_heads), positional, float(rope_theta)
        self.alibi_slopes = ops.alibi_slopes(n_heads) if positional == "alibi" else None
        self.dropout_p = dropout
        self.rng = rng
        d_qkv = d_model + 2 * self.n_kv_heads * self.d_head
        self.qkv_proj = Linear(d_model, d_qkv, bias, rng, dtype)
        self.qkv_proj.weight.data[...] = init.xavier_uniform(rng, (d_qkv, d_model), dtype)
        if bias:
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
                + (f", attention={self.attention!r}" if self.attention != "plain" else ""))

    @property
    def _plain_heads(self):
        """True for the 2017 attention: no position inside, as many key/value heads as query heads."""
        return self.positional is None and self.n_kv_heads == self.n_heads

    def _positions(self, q, k, offset):
        """RoPE on q and k (queries and new keys at positions offset, offset+1, …); identity otherwise."""
        if self.positional != "rope":
            return q, k, None
        q, cq = ops.rope_forward(q, offset, self.rope_theta)
        k, ck = ops.rope_forward(k, offset, self.rope_theta)
        return q, k, (cq, ck)

    def _share_kv(self, k, v):
        """Repeat each key/value head for its n_heads / n_kv_heads query heads: (B, H_kv, T, d) -> (B, H, T, d)."""
        rep = self.n_heads // self.n_kv_heads
        return ops.repeat_kv_forward(k, rep)[0], ops.repeat_kv_forward(v, rep)[0]

    def _alibi_mask(self, mask, t_q, t_k, offset, dtype):
        """mask (broadcastable to (B, H, Tq, Tk), or None) plus the ALiBi bias (H, Tq, Tk); mask unchanged without ALiBi."""
        if self.positional != "alibi":
            return mask
        bias = ops.alibi_bias(self.alibi_slopes, t_q, t_k, offset, dtype)
        return bias if mask is None else mask + bias

    def _undo_positions(self, dq, dk, dv, pos_cache):
        """Backward of _share_kv and _positions: sum the shared heads' gradients, rotate back."""
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:
            B, _, T, dh = dk.shape
            dk = ops.repeat_kv_backward(dk, (rep, (B, self.n_kv_heads, T, dh)))
            dv = ops.repeat_kv_backward(dv, (rep, (B, self.n_kv_heads, T, dh)))
        if pos_cache is not None:
            dq, dk = ops.rope_backward(dq, pos_cache[0]), ops.rope_backward(dk, pos_cache[1])
        return dq, dk, dv

    # -- projections -------------------------------------------------------------
    def _project(self, query, key, value):
        """Q, K, V per head, each (B, H, T, d_head), and what backward needs to undo the projection."""
        E, H = self.d_model, self.n_heads
        W = self.qkv_proj.weight.data
        b = None if self.qkv_proj.bias is None else self.qkv_proj.bias.data
        bs = (lambda s: None) if b is None else (lambda s: b[s])
        if key is query and value is query:
            qkv, c = ops.linear_forward(query, W, b)
            return _split_qkv(qkv, H, self.n_kv_heads), ("self", c)
        if not self._plain_heads:
            raise ValueError("n_kv_heads and positional='rope'/'alibi' are options of self-attention; "
                             "cross-attention (key or value not the query) needs a plain MultiHeadAttention")
        q, cq = ops.linear_forward(query, W[:E], bs(slice(0, E)))
        if value is key:
            kv, ckv = ops.linear_forward(key, W[E:], bs(slice(E, None)))
            return _split_heads(q, 1, H) + _split_heads(kv, 2, H), ("kv", cq, ckv)
        k, ck = ops.linear_forward(key, W[E:2 * E], bs(slice(E, 2 * E)))
        v, cv = ops.linear_forward(value, W[2 * E:], bs(slice(2 * E, None)))
        return (_split_heads(q, 1, H) + _split_heads(k, 1, H) + _split_heads(v, 1, H)), ("qkv", cq, ck, cv)

    def _check_inputs(self, query, key, value):
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.ndim != 3 or x.shape[-1] != self.d_model:
                raise ValueError(f"{name} must have shape (batch, seq, {self.d_model}), got {x.shape}")
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(f"query {query.shape}, key {key.shape} and value {value.shape} must share the batch "
                             f"size, and key/value the sequence length")

    # -- forward / backward -------------------------------------------------------
    def forward(self, query, key=None, value=None, attn_mask=None, key_padding_mask=None, is_causal=False,
                kv_cache=None):
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        if kv_cache is not None:
            return self._forward_cached(query, key, value, attn_mask, key_padding_mask, is_causal, kv_cache)
        B, Tq, _ = query.shape
        Tk = key.shape[1]
        (q, k, v), proj_cache = self._project(query, key, value)
        q, k, pos_cache = self._positions(q, k, 0)
        k, v = self._share_kv(k, v)
        only_causal = (is_causal and attn_mask is None and key_padding_mask is None and Tq == Tk
                       and self.positional != "alibi")
        p_drop = self.dropout_p if self.training else 0.0
        merged = None
        if self.attention == "flash" and not self.record_weights:
            ctx, attn_cache = self._flash(q, k, v, attn_mask, key_padding_mask, is_causal, p_drop)
            weights = None
        else:
            mask = None if only_causal else self._alibi_mask(build_attention_mask(
                Tq, Tk, q.dtype, attn_mask, key_padding_mask, is_causal, B, self.n_heads), Tq, Tk, 0, q.dtype)
            if p_drop == 0.0 and self.head_mask is None:
                # fast path: the kernel writes the context straight into the merged-heads layout (B, Tq, H, dh)
                merged = np.empty((B, Tq, self.n_heads, self.d_head), dtype=q.dtype)
                ctx, attn_cache = fused_attention_forward(q, k, v, mask, only_causal,
                                                          out=merged.transpose(0, 2, 1, 3))
                weights = np.swapaxes(attn_cache.weights_t, -1, -2) if self.record_weights else None
            else:
                ctx, weights, attn_cache = scaled_dot_product_attention_forward(
                    q, k, v, attn_mask=mask, is_causal=only_causal, dropout_p=p_drop, rng=self.rng,
                    need_weights=self.record_weights)
        if self.record_weights:
            self.last_weights = weights
        if self.head_mask is not None:
            ctx = ctx * np.asarray(self.head_mask, dtype=ctx.dtype)[None, :, None, None]
        if merged is not None:
            out = self.out_proj(merged.reshape(B, Tq, self.d_model))
        else:
            out = self.out_proj(_merge_heads(ctx))
        self._cache = (proj_cache, attn_cache, pos_cache, query.shape, key.shape)
        return out

    def backward(self, dout):
        """Returns dquery for self-attention, (dquery, dkey) when value is key, else (dquery, dkey, dvalue)."""
        proj_cache, attn_cache, pos_cache, q_shape, k_shape = self._cache
        B, Tq, E = q_shape
        Tk = k_shape[1]
        H, dh = self.n_heads, self.d_head
        dctx = self.out_proj.backward(dout).reshape(B, Tq, H, dh).transpose(0, 2, 1, 3)
        if self.head_mask is not None:
            dctx = dctx * np.asarray(self.head_mask, dtype=dctx.dtype)[None, :, None, None]
        kind = proj_cache[0]
        dqkv = views = None
        if kind == "self":       # the fused QKV gradient (B, Tq, H + 2·H_kv, dh) and its q, k, v parts (B, h, Tq, dh)
            dqkv = np.empty((B, Tq, H + 2 * self.n_kv_heads, dh), dtype=dctx.dtype)
            views = _split_qkv(dqkv.reshape(B, Tq, -1), H, self.n_kv_heads)
        if isinstance(attn_cache, FlashAttentionCache):
            dq, dk, dv = flash_attention_backward(dctx, attn_cache)
        elif isinstance(attn_cache, FastAttentionCache) and kind == "self" and self.n_kv_heads == H:
            dq, dk, dv = fused_attention_backward(dctx, attn_cache, *views)    # written straight into dqkv
        else:
            dq, dk, dv = scaled_dot_product_attention_backward(dctx, attn_cache)
        dq, dk, dv = self._undo_positions(dq, dk, dv, pos_cache)
        W = self.qkv_proj.weight
        bias = self.qkv_proj.bias
        self._cache = None
        if kind == "self":
            for view, d in zip(views, (dq, dk, dv)):
                if d is not view:
                    view[...] = d
            dx, dW, db = ops.linear_backward(dqkv.reshape(B, Tq, -1), proj_cache[1])
            W.accumulate(dW)
            if bias is not None:
                bias.accumulate(db)
            return dx
        dW = np.empty_like(W.data)
        db = None if bias is None else np.empty_like(bias.data)
        dq_rows = np.empty((B, Tq, H, dh), dtype=dq.dtype)
        _heads_to_rows(dq, dq_rows)
        dquery, dW[:E], dbq = ops.linear_backward(dq_rows.reshape(B, Tq, E), proj_cache[1])
        if kind == "kv":
            dkv = np.empty((B, Tk, 2, H, dh), dtype=dk.dtype)
            _heads_to_rows(dk, dkv[:, :, 0])
            _heads_to_rows(dv, dkv[:, :, 1])
            dkey, dW[E:], dbkv = ops.linear_backward(dkv.reshape(B, Tk, 2 * E), proj_cache[2])
            grads = (dquery, dkey)
            if db is not None:
                db[:E], db[E:] = dbq, dbkv
        else:
            rows = np.empty((B, Tk, H, dh), dtype=dk.dtype)
            _heads_to_rows(dk, rows)
            dkey, dW[E:2 * E], dbk = ops.linear_backward(rows.reshape(B, Tk, E), proj_cache[2])
            rows = np.empty((B, Tk, H, dh), dtype=dv.dtype)
            _heads_to_rows(dv, rows)
            dvalue, dW[2 * E:], dbv = ops.linear_backward(rows.reshape(B, Tk, E), proj_cache[3])
            grads = (dquery, dkey, dvalue)
            if db is not None:
                db[:E], db[E:2 * E], db[2 * E:] = dbq, dbk, dbv
        W.accumulate(dW)
        if bias is not None:
            bias.accumulate(db)
        return grads

    def _flash(self, q, k, v, attn_mask, key_padding_mask, is_causal, p_drop, causal_offset=0):
        """The memory-efficient kernel; module masks (bool True = blocked) become functional ones
        (True = may attend) without building a (Tq, Tk) mask per batch element."""
        if p_drop > 0.0:
            raise ValueError(f"attention='flash' has no attention dropout (dropout={p_drop}); set dropout = 0 "
                             f"(a model's dropout also drops attention weights), call .eval() for inference, "
                             f"or use attention='plain'")
        B, H, Tq, _ = q.shape
        Tk = k.shape[2]
        mask = key_mask = None
        if attn_mask is not None:
            mask = np.asarray(attn_mask)
            if mask.ndim == 3:
                if mask.shape != (B * H, Tq, Tk):
                    raise ValueError(f"a 3-D attn_mask must have shape (batch*heads, {Tq}, {Tk}), got {mask.shape}")
                mask = mask.reshape(B, H, Tq, Tk)
            if mask.ndim not in (2, 4) or mask.shape[-2:] != (Tq, Tk):
                raise ValueError(f"attn_mask must have shape ({Tq}, {Tk}), (batch*heads, {Tq}, {Tk}) or "
                                 f"(batch, heads, {Tq}, {Tk}); got {np.shape(attn_mask)}")
            mask = ~mask if mask.dtype == bool else mask
        if key_padding_mask is not None:
            key_mask = np.asarray(key_padding_mask)
            if key_mask.shape != (B, Tk):
                raise ValueError(f"key_padding_mask must have shape (batch, {Tk}), got {key_mask.shape}")
            key_mask = ~key_mask if key_mask.dtype == bool else key_mask
        return flash_attention_forward(q, k, v, attn_mask=mask, is_causal=is_causal, key_mask=key_mask,
                                       causal_offset=causal_offset, block_q=self.flash_block_q,
                                       block_k=self.flash_block_k, alibi_slopes=self.alibi_slopes)

    def _forward_cached(self, query, key, value, attn_mask, key_padding_mask, is_causal, cache):
        """Inference step with a KVCache: no backward. Self-attention appends the new keys/values;
        a static cache (cross-attention) projects the memory once and reuses it."""
        E, H = self.d_model, self.n_heads
        W = self.qkv_proj.weight.data
        b = None if self.qkv_proj.bias is None else self.qkv_proj.bias.data
        B, Tq, _ = query.shape
        offset = cache.length
        if cache.static:
            if not self._plain_heads:
                raise ValueError("n_kv_heads and positional='rope'/'alibi' are options of self-attention; "
                                 "a static (cross-attention) KVCache needs a plain MultiHeadAttention")
            q, _ = ops.linear_forward(query, W[:E], None if b is None else b[:E])
            (q,) = _split_heads(q, 1, H)
            if cache.length == 0:
                kv, _ = ops.linear_forward(key, W[E:], None if b is None else b[E:])
                cache.append(*_split_heads(kv, 2, H))
            k, v = cache.view()
            offset = 0
        else:
            if not (key is query and value is query):
                raise ValueError("a growing KVCache is for self-attention; use KVCache(static=True) for a memory")
            qkv, _ = ops.linear_forward(query, W, b)
            q, k_new, v_new = _split_qkv(qkv, H, self.n_kv_heads)
            q, k_new, _ = self._positions(q, k_new, offset)        # the cache keeps rotated keys, n_kv_heads heads
            k, v = self._share_kv(*cache.append(k_new, v_new))
        Tk = k.shape[2]
        causal = is_causal and not cache.static and Tq > 1
        if self.attention == "flash" and not self.record_weights:
            (ctx, _), weights = self._flash(q, k, v, attn_mask, key_padding_mask, causal, 0.0, offset), None
        else:
            mask = self._alibi_mask(build_attention_mask(Tq, Tk, q.dtype, attn_mask, key_padding_mask, causal, B, H,
                                                         causal_offset=offset), Tq, Tk, offset, q.dtype)
            ctx, weights, _ = scaled_dot_product_attention_forward(q, k, v, attn_mask=mask,
                                                                   need_weights=self.record_weights)
        if self.record_weights:
            self.last_weights = weights
        if self.head_mask is not None:
            ctx = ctx * np.asarray(self.head_mask, dtype=ctx.dtype)[None, :, None, None]
        out, _ = ops.linear_forward(_merge_heads(ctx), self.out_proj.weight.data,
                                    None if self.out_proj.bias is None else self.out_proj.bias.data)
        return out
