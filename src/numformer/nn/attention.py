"""Multi-head attention (Vaswani et al. 2017, §3.2.2):

    MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O,   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

All heads are one batched axis (no Python loop over heads). A forward pass is a sequence of visible steps,
each a module or an op pair with its own backward:

1. project: the ``qkv_proj`` module (a ``QKVProjection``: [W^Q; W^K; W^V] as one Linear, the layout of
   torch's ``in_proj_weight``; one matmul for self-attention) gives the per-head q, k, v (B, H, T, d_head);
2. transform q and k: q/k RMSNorm over each head (``q_norm``, ``k_norm``; Qwen3, Gemma 3), then RoPE;
3. share the key/value heads among the query heads (grouped-query attention): repeated for the kernel, unless
   the kernel shares them itself (``dispatch.AttentionKernel.grouped``, the fused kernel);
4. the kernel: scores S = q kᵀ · scale (scale 1/√d_head unless given), an optional soft-cap c·tanh(S/c),
   the mask, softmax, the weighted sum of v; chosen in ``nn.dispatch.ATTENTION``;
5. ``out_proj`` maps the merged heads (n_heads · head_dim) back to d_model.

Backward runs them in reverse. Hook points (``nn.hooks``; TransformerLens's names and layouts) sit between
the steps: ``hook_q``, ``hook_k``, ``hook_v`` after step 1, (B, T, heads, d_head), the keys and values with
their n_kv_heads heads (TransformerLens's grouped-query attention); ``hook_rot_q``, ``hook_rot_k`` after RoPE;
``hook_attn_scores`` (scaled, soft-capped and masked scores, ALiBi's bias included) and ``hook_pattern`` (the
softmax), (B, heads, Tq, Tk), inside step 4; ``hook_z`` (the weighted sums of the values, (B, T, heads,
d_head)) before step 5.
A hook on the scores or the pattern runs step 4 as its visible steps (``STEPWISE_ATTENTION``, the
reference's arithmetic) instead of a fused kernel.

The attention calls its sub-modules (``qkv_proj``, ``q_norm``, ``k_norm``,
``out_proj``) and never reads their weights, so a module put in their place with ``set_submodule`` (a LoRA
wrapper, an int8 linear layer) is the one that runs, in training and in cached generation.

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
from ..ops.attention import apply_mask
from ..kernels.flash_attention import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q
from . import dispatch, init
from .dispatch import F
from .hooks import HookPoint
from .layers import RMS_NORMS, Linear, make_norm
from .module import NO_FORWARD, Module


class KVCache:
    """Keys and values of the positions already processed by one attention layer.

    Used for incremental decoding: each call appends the new positions' keys
    and values, so a step costs O(T) instead of recomputing O(T²).
    ``static=True`` (cross-attention) computes them once from the memory.
    Arrays: (batch, n_kv_heads, capacity, d_head); the first ``stored`` rows are valid, the keys and values of
    the last ``stored`` of the ``length`` positions processed so far.

    ``window=W`` (sliding-window attention: a query attends to the W most recent positions, itself included)
    keeps only what the next queries can attend to: before new positions are appended into a full array, all
    but the last W - 1 stored positions are dropped, and arrays longer than 2·(W + new positions) (left by a
    long prompt) are reallocated to that, so they stay at most about 2·(W + new positions) long however long
    the prompt and the generation (memory flat beyond W).
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
        """Store the new positions' k, v (B, H_kv, T, d_head); returns the stored keys and values, each
        (B, H_kv, stored, d_head)."""
        B, H, T, dh = k.shape
        if self.window is not None and self.k is not None and self.stored + T > self.k.shape[2]:
            self._drop_outside_window()
        need = self.stored + T
        bound = None if self.window is None else max(need, 2 * (self.window + T))
        # a window's arrays are reallocated when too small, and when a long prompt left them longer than the bound
        if self.k is None or need > self.k.shape[2] or (bound is not None and self.k.shape[2] > bound):
            cap = max(need, 2 * (0 if self.k is None else self.k.shape[2]), 16)
            if bound is not None:
                cap = min(cap, bound)
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
        """The stored keys and values, each (B, H_kv, stored, d_head)."""
        return self.k[:, :, :self.stored], self.v[:, :, :self.stored]

    def reset(self):
        """Empty the cache (length and stored 0)."""
        self.k = self.v = None
        self.length = self.stored = 0

    def reorder(self, indices):
        """Row i continues old row ``indices[i]`` (batch axis; beam search reorders its beams this way)."""
        if self.k is not None:
            self.k = np.take(self.k, indices, axis=0)
            self.v = np.take(self.v, indices, axis=0)


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
    """Combine the module-level masks into one additive float mask of ``dtype``, or None.

    attn_mask: (Tq, Tk), (B·H, Tq, Tk) (needs ``batch`` and ``n_heads``) or (B, H, Tq, Tk); bool True =
    blocked, float added.
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


# -- step 4 in its steps, with the hook points of the scores and the pattern ----------------------------------
def _stepwise_forward(layer, q, k, v, masks, p_drop, out):
    """The reference attention (``ops.attention``'s arithmetic) one step at a time, through ``layer``'s hook
    points: S = q kᵀ · scale, soft-capped, masked -> ``hook_attn_scores``; P = softmax(S) -> ``hook_pattern``;
    attention dropout; out = P v. The interface of ``dispatch.ATTENTION``'s kernels."""
    scale = 1.0 / np.sqrt(q.shape[-1]) if layer.scale is None else layer.scale
    scores = (q @ np.swapaxes(k, -1, -2)) * np.asarray(scale, q.dtype)
    capped = None
    if layer.attn_logit_softcap is not None:
        scores, capped = ops.softcap_forward(scores, layer.attn_logit_softcap)
    mask, causal = masks.additive(q, k)
    scores = layer.hook_attn_scores(apply_mask(scores, mask, causal))
    softmax, _ = ops.softmax_forward(scores, axis=-1)
    pattern = layer.hook_pattern(softmax)
    drop = None
    if p_drop > 0.0:
        keep = 1.0 - p_drop
        drop = ((layer.rng.random(pattern.shape, dtype=np.float32) < keep) / keep).astype(pattern.dtype)
    used = pattern if drop is None else pattern * drop
    out[...] = used @ v
    return (used if layer.record_weights else None), (layer, q, k, v, softmax, pattern, drop, scale, capped)


def _stepwise_backward(dctx, cache, dq, dk, dv):
    """Backward of ``_stepwise_forward``, through the hook points in reverse; writes dq, dk, dv."""
    layer, q, k, v, softmax, pattern, drop, scale, capped = cache
    used = pattern if drop is None else pattern * drop
    dv[...] = np.swapaxes(used, -1, -2) @ dctx
    dpattern = dctx @ np.swapaxes(v, -1, -2)
    if drop is not None:
        dpattern *= drop
    dscores = layer.hook_attn_scores.backward(ops.softmax_backward(layer.hook_pattern.backward(dpattern),
                                                                   (softmax, -1)))
    if capped is not None:
        dscores = ops.softcap_backward(dscores, capped)
    dscores = dscores * np.asarray(scale, dscores.dtype)
    dq[...] = dscores @ k
    dk[...] = np.swapaxes(dscores, -1, -2) @ q


STEPWISE_ATTENTION = dispatch.AttentionKernel(_stepwise_forward, _stepwise_backward, True, True, True)


# -- the q/k/v projection -------------------------------------------------------------------------------------
class QKVProjection(Linear):
    """The query, key and value projections as one Linear: ``weight`` = [W^Q; W^K; W^V] of shape
    ((n_heads + 2·n_kv_heads)·head_dim, d_model), torch's ``in_proj_weight`` layout; ``bias`` likewise.

    Self-attention calls it as any Linear, ``forward(x)`` -> (B, T, (H + 2·H_kv)·head_dim) in one matmul, and
    ``backward(dy)``: a module that replaces it (``set_submodule``: LoRA, int8 weights) needs only that.
    Cross-attention projects the query and the memory with different rows (``project_parts``), which only
    this class knows how to do.
    """

    def __init__(self, d_model, n_heads, n_kv_heads, head_dim, bias=True, rng=None, dtype=np.float32):
        super().__init__(d_model, (n_heads + 2 * n_kv_heads) * head_dim, bias, rng, dtype)
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self._parts = None

    def project_parts(self, parts, first_head=0):
        """[(x, (head counts)), ...] -> one (B, T, Σcounts·head_dim) array per part, each from the next rows of
        the weight, from head ``first_head`` on (cross-attention: ((query, (H,)), (memory, (H_kv, H_kv))); a
        cached memory alone: ((memory, (H_kv, H_kv)),) from head H). ``backward_parts`` follows."""
        W, b = self.weight.data, None if self.bias is None else self.bias.data
        outs, caches, start = [], [], first_head * self.head_dim
        for x, counts in parts:
            rows = slice(start, start + sum(counts) * self.head_dim)
            start = rows.stop
            y, c = F.linear_forward(x, W[rows], None if b is None else b[rows])
            outs.append(y)
            caches.append(c)
        self._parts = caches
        return outs

    def backward_parts(self, grads):
        """The inputs' gradients of ``project_parts`` from its outputs' gradients; accumulates dW (and db)."""
        results = [F.linear_backward(g, c, weight_grad=self.weight.requires_grad)
                   for g, c in zip(grads, self._parts)]
        self._parts = None
        if self.weight.requires_grad:
            self.weight.accumulate(np.concatenate([r[1] for r in results]))
        if self.bias is not None:
            self.bias.accumulate(np.concatenate([r[2] for r in results]))
        return tuple(r[0] for r in results)

    def extra_repr(self):
        return (f"{self.in_features}, q/k/v heads {self.n_heads}/{self.n_kv_heads}/{self.n_kv_heads} x "
                f"{self.head_dim}, bias={self.bias is not None}")


class MultiHeadAttention(Module):
    """Multi-head attention, self- or cross-attention, as the steps of the module docstring.

    d_model: model width E;  n_heads: h;  head_dim: d_head (default E / h, which must then divide);
    the queries are n_heads·head_dim wide, which need not equal E.
    forward(query (B, Tq, E), key=None, value=None, ...) -> (B, Tq, E).
    key defaults to query (self-attention), value to key (cross-attention on a memory).

    backward(dout (B, Tq, E)) returns the inputs' gradients, in the order query, key,
    value: dquery when key and value are the query (self-attention), (dquery, dkey) when
    value is key (cross-attention on a memory), (dquery, dkey, dvalue) otherwise (also
    when key is the query but value is not: the caller adds dkey to dquery).

    ``dropout``: attention dropout, on the softmax weights in training mode. ``bias``: biases of the
    output projection (and of the q/k/v projection unless ``qkv_bias`` says otherwise); ``rng``: the
    generator of the initialization and of the dropout masks; ``dtype``: the parameters'. Initialized as
    torch's: W^Q, W^K, W^V Xavier-uniform, ``out_proj`` U(-1/√fan_in, 1/√fan_in), biases 0.

    Set ``record_weights = True`` to keep the last attention weights (B, h, Tq, Tk)
    in ``last_weights`` (after attention dropout, as torch returns them); set ``head_mask`` (h,)
    to scale each head's output (0 ablates a head).

    ``attention="flash"`` computes the attention with the memory-efficient kernel
    (``kernels.flash_attention``: block-wise online softmax, recomputation in backward,
    memory linear in the sequence length) instead of the plain one (``"plain"``).
    Results and gradients are the same. The flash kernel has no attention
    dropout: in training mode with ``dropout > 0`` forward raises a ValueError (unless recorded weights,
    soft-capped scores or a hook on the scores or the pattern send the call to a kernel that drops).
    ``flash_block_q`` / ``flash_block_k`` set its block sizes. Which kernel runs
    (``kernel_name``) is ``nn.dispatch.attention_kernel``'s choice: the fastest that computes
    the call (recorded weights run the fused kernel, which records them; attention dropout and
    soft-capped scores run the reference ``ops.attention``; so does everything inside
    ``numformer.reference_mode()``).

    Options of the Llama family and later: ``n_kv_heads`` (a divisor of n_heads, default n_heads)
    key/value heads (``qkv_proj`` and the KV cache hold n_kv_heads heads); ``positional``
    (self-attention only): None, "rope" (rotary embeddings with base ``rope_theta``; head_dim must
    be even) or "alibi" (linear biases with slopes ``alibi_slopes``). Positions count from 0, or
    continue after a KVCache's cached ones. ``qkv_bias`` (default ``bias``): biases on the q/k/v
    projection alone (Qwen2 has no output-projection bias). ``rope_scaling``: a ``RopeScaling``
    (``ops.rope_scaling``: linear, dynamic, llama3, yarn) of the rotary frequencies, in training and in the
    cached steps alike. ``qk_norm``: RMSNorm of each query and
    key head before RoPE (``q_norm``, ``k_norm``, eps ``norm_eps``, of kind ``qk_norm_kind``: "rms", or
    "rms_plus_one", Gemma 3's (1 + w); Qwen3, Gemma 3). ``scale``: the
    scores' factor (default 1/√head_dim; Gemma: query_pre_attn_scalar^-½). ``attn_logit_softcap``:
    c, the scores capped to c·tanh(S / c) before the mask (Gemma 2).

    ``sliding_window=W`` (self-attention): query i attends only keys j with
    i - W < j (Mistral's window; with ``is_causal`` also j <= i). The window enters every
    kernel as part of its attention mask (``sliding_window_mask``), so the reference, fused
    and flash kernels and their backward passes need nothing else; a cached step keeps only
    the keys the window reaches (``KVCache(window=W)``).
    """

    ATTENTION_KINDS = ("plain", "flash")
    POSITIONAL_KINDS = (None, "rope", "alibi")

    def __init__(self, d_model, n_heads, dropout=0.0, bias=True, rng=None, dtype=np.float32, attention="plain",
                 n_kv_heads=None, positional=None, rope_theta=10000.0, qkv_bias=None, sliding_window=None,
                 head_dim=None, qk_norm=False, scale=None, attn_logit_softcap=None, norm_eps=1e-6,
                 rope_scaling=None, qk_norm_kind="rms"):
        super().__init__()
        head_dim = self._check_options(d_model, n_heads, attention, n_kv_heads, positional, sliding_window,
                                       head_dim, scale, attn_logit_softcap)
        rng = init.default_rng(rng)
        n_kv_heads = n_heads if n_kv_heads is None else int(n_kv_heads)
        self.attention, self.flash_block_q, self.flash_block_k = attention, DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K
        self.d_model, self.n_heads, self.n_kv_heads, self.d_head = d_model, n_heads, n_kv_heads, head_dim
        self.positional, self.rope_theta, self.sliding_window = positional, float(rope_theta), sliding_window
        self.rope_scaling = rope_scaling                              # a RopeScaling, or None: plain RoPE
        self.scale = None if scale is None else float(scale)          # None: the kernels' 1/√head_dim
        self.attn_logit_softcap = None if attn_logit_softcap is None else float(attn_logit_softcap)
        self.alibi_slopes = ops.alibi_slopes(n_heads) if positional == "alibi" else None
        self.dropout_p, self.rng = dropout, rng
        qkv_bias = bias if qkv_bias is None else qkv_bias
        self.qkv_proj = QKVProjection(d_model, n_heads, n_kv_heads, head_dim, qkv_bias, rng, dtype)
        if not init.is_skipped():            # skipped: zeros until a checkpoint is written (init.skipped)
            self.qkv_proj.weight.data[...] = init.xavier_uniform(rng, self.qkv_proj.weight.shape, dtype)
            if qkv_bias:
                self.qkv_proj.bias.data[...] = 0
        if qk_norm:
            if qk_norm_kind not in RMS_NORMS:
                raise ValueError(f"qk_norm_kind must be one of {list(RMS_NORMS)}, got {qk_norm_kind!r}")
            self.q_norm, self.k_norm = (make_norm(qk_norm_kind, head_dim, norm_eps, dtype=dtype) for _ in "qk")
        else:
            self.q_norm = self.k_norm = None
        self.out_proj = Linear(n_heads * head_dim, d_model, bias, rng, dtype)
        if bias and not init.is_skipped():
            self.out_proj.bias.data[...] = 0
        self.record_weights = False
        self.last_weights = None
        self.head_mask = None
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        if positional == "rope":
            self.hook_rot_q, self.hook_rot_k = HookPoint(), HookPoint()
        self.hook_attn_scores, self.hook_pattern, self.hook_z = HookPoint(), HookPoint(), HookPoint()
        self._cache = None

    @staticmethod
    def _check_options(d_model, n_heads, attention, n_kv_heads, positional, sliding_window, head_dim, scale, cap):
        """Each option checked on its own; returns the head size."""
        if attention not in MultiHeadAttention.ATTENTION_KINDS:
            raise ValueError(f"unknown attention kernel {attention!r}; choose one of "
                             f"{list(MultiHeadAttention.ATTENTION_KINDS)}")
        if head_dim is None:
            if n_heads <= 0 or d_model % n_heads != 0:
                raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads} "
                                 f"(each head gets d_model / n_heads features), or give head_dim")
            head_dim = d_model // n_heads
        elif isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 1:
            raise ValueError(f"head_dim must be a positive integer (features per head), got {head_dim!r}")
        ops.check_kv_heads(n_heads, n_heads if n_kv_heads is None else n_kv_heads)
        if positional not in MultiHeadAttention.POSITIONAL_KINDS:
            raise ValueError(f"unknown attention positional option {positional!r}; choose None, 'rope' or 'alibi'")
        if positional == "rope" and head_dim % 2:
            raise ValueError(f"positional='rope' needs an even head size, but the head size is {head_dim}; "
                             f"change d_model, n_heads or head_dim")
        if sliding_window is not None and (type(sliding_window) is not int or sliding_window < 1):
            raise ValueError(f"sliding_window must be a positive integer (keys attended per query) or None, "
                             f"got {sliding_window!r}")
        for name, value in (("scale", scale), ("attn_logit_softcap", cap)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, np.number))
                                      or not value > 0 or not np.isfinite(value)):
                raise ValueError(f"{name} must be a positive number or None, got {value!r}")
        return int(head_dim)

    def extra_repr(self):
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, dropout={self.dropout_p}"
                + (f", head_dim={self.d_head}" if self.d_head * self.n_heads != self.d_model else "")
                + (f", n_kv_heads={self.n_kv_heads}" if self.n_kv_heads != self.n_heads else "")
                + (f", positional={self.positional!r}" if self.positional else "")
                + (f", sliding_window={self.sliding_window}" if self.sliding_window else "")
                + (f", scale={self.scale}" if self.scale is not None else "")
                + (f", attn_logit_softcap={self.attn_logit_softcap}" if self.attn_logit_softcap else "")
                + (f", attention={self.attention!r}" if self.attention != "plain" else ""))

    def kernel_name(self, p_drop):
        """The entry of ``nn.dispatch.ATTENTION`` that runs a call with attention dropout ``p_drop``, or
        "stepwise" (``STEPWISE_ATTENTION``) while a hook is attached to the scores or the pattern."""
        if any(p.fwd_hooks or p.bwd_hooks for p in (self.hook_attn_scores, self.hook_pattern)):
            return "stepwise"
        return dispatch.attention_kernel(self.attention, p_drop, self.record_weights, self.attn_logit_softcap)

    @staticmethod
    def _kernel(name):
        return STEPWISE_ATTENTION if name == "stepwise" else dispatch.ATTENTION[name]

    def residual_weights(self):
        return [self.out_proj.weight]

    def flops_per_token(self, context):
        """The scores q·kᵀ and the weighted sum of v: 2 · context · n_heads · d_head each (the projections are
        its sub-modules')."""
        return 2 * 2 * context * self.n_heads * self.d_head

    # -- step 1: projections ------------------------------------------------------------------------------
    def _project(self, query, key, value):
        """The per-head queries, keys and values, each (B, H, T, d_head) (keys and values: H_kv heads), and
        what ``_project_backward`` needs: the head counts of each projected input. Self-attention calls
        ``qkv_proj`` on the query (one matmul); cross-attention projects the query with W^Q and the memory
        with [W^K; W^V] (or each separately when value is not key)."""
        H, Hkv = self.n_heads, self.n_kv_heads
        if key is query and value is query:
            return _split_groups(self.qkv_proj(query), (H, Hkv, Hkv)), ((H, Hkv, Hkv),)
        if value is key:
            groups = ((query, (H,)), (key, (Hkv, Hkv)))
        else:
            groups = ((query, (H,)), (key, (Hkv,)), (value, (Hkv,)))
        self._check_parts()
        outs = self.qkv_proj.project_parts(groups)
        return sum((_split_groups(y, counts) for y, (_, counts) in zip(outs, groups)), ()), \
            tuple(counts for _, counts in groups)

    def _check_parts(self):
        if not hasattr(self.qkv_proj, "project_parts"):
            raise ValueError(f"cross-attention projects the query and the memory with different rows of its "
                             f"QKVProjection; the {type(self.qkv_proj).__name__} in its place projects one input "
                             f"(self-attention only): put it in a self-attention layer")

    def _project_backward(self, grad_rows):
        """Input gradients from the (B, T, heads, d_head) gradients of each projected input."""
        flat = [g.reshape(g.shape[:2] + (-1,)) for g in grad_rows]
        if len(flat) == 1:
            return self.qkv_proj.backward(flat[0])
        return self.qkv_proj.backward_parts(flat)

    # -- step 2: q/k norm and positions; step 3: shared key/value heads ------------------------------------
    def _plain_heads(self, kernel):
        """True when q, k, v go to ``kernel`` as projected (no norm, no positions inside, as many key/value heads
        as query heads or a grouped kernel), so the kernel can write its gradients into dqkv directly."""
        return self.positional is None and self.q_norm is None and (self.n_kv_heads == self.n_heads
                                                                     or kernel.grouped)

    def _transform_qk(self, q, k, offset, positions=None):
        """q/k RMSNorm (each head vector), then RoPE at positions offset, offset+1, … or ``positions`` (B, T)
        (a left-padded row counts its real tokens). ALiBi needs nothing here: its bias -m·|i - j| depends on
        the distance only. Returns (q, k, cache of the RoPE steps or None)."""
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.positional != "rope":
            return q, k, None
        q, cq = F.rope_forward(q, offset, self.rope_theta, positions, scaling=self.rope_scaling)
        k, ck = F.rope_forward(k, offset, self.rope_theta, positions, scaling=self.rope_scaling)
        return self.hook_rot_q.seq_first(q), self.hook_rot_k.seq_first(k), (cq, ck)

    def _share_kv(self, k, v, name):
        """Repeat each key/value head for its n_heads / n_kv_heads query heads: (B, H_kv, T, d) -> (B, H, T, d),
        unless the kernel ``name`` shares them itself (grouped). Returns (k, v, caches of the two repeats)."""
        rep = 1 if self._kernel(name).grouped else self.n_heads // self.n_kv_heads
        (k, ck), (v, cv) = F.repeat_kv_forward(k, rep), F.repeat_kv_forward(v, rep)
        return k, v, (ck, cv)

    def _undo_transforms(self, dq, dk, dv, rope_cache, share_cache):
        """Backward of _share_kv and _transform_qk: sum the shared heads' gradients, rotate back, then back
        through the q/k norms."""
        dk, dv = F.repeat_kv_backward(dk, share_cache[0]), F.repeat_kv_backward(dv, share_cache[1])
        if rope_cache is not None:
            dq, dk = self.hook_rot_q.backward_seq_first(dq), self.hook_rot_k.backward_seq_first(dk)
            dq, dk = F.rope_backward(dq, rope_cache[0]), F.rope_backward(dk, rope_cache[1])
        if self.q_norm is not None:
            dq, dk = self.q_norm.backward(dq), self.k_norm.backward(dk)
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

    # -- step 4: the kernel ------------------------------------------------------------------------------
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
        and the kernel's cache. Records the weights and applies the head mask, then ``hook_z``."""
        B, H, t_q, dh = q.shape
        merged = np.empty((B, t_q, H, dh), dtype=q.dtype)
        weights, cache = self._kernel(name).forward(self, q, k, v, masks, p_drop, _as_heads(merged))
        if self.record_weights:
            self.last_weights = weights
        if self.head_mask is not None:          # a new array: the fused kernel's cache holds ``merged``
            merged = merged * np.asarray(self.head_mask, dtype=merged.dtype)[None, None, :, None]
        return self.hook_z(merged), cache

    def _hook_qkv(self, q, k, v):
        """hook_q, hook_k, hook_v on the projected heads (B, H, T, d_head), seen as (B, T, H, d_head)."""
        return self.hook_q.seq_first(q), self.hook_k.seq_first(k), self.hook_v.seq_first(v)

    # -- forward / backward ------------------------------------------------------------------------------
    def forward(self, query, key=None, value=None, attn_mask=None, key_padding_mask=None, is_causal=False,
                kv_cache=None, positions=None):
        """query (B, Tq, E); key, value (B, Tk, E) (defaults above) -> (B, Tq, E).

        ``attn_mask`` (Tq, Tk), (B·H, Tq, Tk) or (B, H, Tq, Tk) and ``key_padding_mask`` (B, Tk): bool True =
        blocked, or float added to the scores (``build_attention_mask``); ``is_causal``: query i attends keys
        j <= i. ``kv_cache``: a KVCache for incremental decoding (no backward; a growing cache for
        self-attention, whose key_padding_mask then covers every position processed, a static one for a
        memory). ``positions`` (B, Tq): the tokens' positions for positional='rope' (default 0 … Tq-1, after
        the cached ones with a KVCache)."""
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        if kv_cache is not None:
            return self._forward_cached(query, key, value, attn_mask, key_padding_mask, is_causal, kv_cache,
                                        positions)
        (q, k, v), counts = self._project(query, key, value)            # 1. q: (B, H, T, d_head); k, v: H_kv
        q, k, v = self._hook_qkv(q, k, v)
        q, k, rope_cache = self._transform_qk(q, k, 0, positions)       # 2. q/k norm, RoPE
        p_drop = self.dropout_p if self.training else 0.0
        name = self.kernel_name(p_drop)
        k, v, share_cache = self._share_kv(k, v, name)                  # 3. shared key/value heads
        masks = self._masks(q, k, attn_mask, key_padding_mask, is_causal, window=key is query)
        ctx, attn_cache = self._attend(name, q, k, v, masks, p_drop)   # 4. (B, Tq, H, d_head)
        self._cache = (name, counts, [x.shape[:2] for x in (query, key, value)[:len(counts)]], attn_cache,
                       rope_cache, share_cache)
        return self.out_proj(ctx.reshape(ctx.shape[:2] + (-1,)))        # 5.

    def backward(self, dout):
        """Gradients of the inputs (see the class docstring for what is returned); accumulates the parameters'."""
        if self._cache is None:
            raise RuntimeError(NO_FORWARD + "; a forward with kv_cache keeps nothing for backward")
        name, counts, shapes, attn_cache, rope_cache, share_cache = self._cache
        self._cache = None
        B, Tq, _ = dout.shape
        H, dh = self.n_heads, self.d_head
        dctx = _as_heads(self.hook_z.backward(self.out_proj.backward(dout).reshape(B, Tq, H, dh)))
        if self.head_mask is not None:
            dctx = dctx * np.asarray(self.head_mask, dtype=dctx.dtype)[None, :, None, None]
        grad_rows = [np.empty((b, t, sum(c), dh), dtype=dctx.dtype) for (b, t), c in zip(shapes, counts)]
        views = tuple(v for g, c in zip(grad_rows, counts)
                      for v in _split_groups(g.reshape(g.shape[:2] + (-1,)), c))     # dq, dk, dv
        kernel = self._kernel(name)
        if self._plain_heads(kernel):
            kernel.backward(dctx, attn_cache, *views)                   # writes into grad_rows
            grads = views
        else:
            Tk, Hk = views[1].shape[2], self.n_kv_heads if kernel.grouped else H
            # stored (B, T, heads, d_head) as grad_rows: RoPE's backward and the copies below run along rows
            grads = (_as_heads(np.empty((B, Tq, H, dh), dctx.dtype)),) + \
                tuple(_as_heads(np.empty((B, Tk, Hk, dh), dctx.dtype)) for _ in "kv")
            kernel.backward(dctx, attn_cache, *grads)
            grads = self._undo_transforms(*grads, rope_cache, share_cache)
        for view, g, hook in zip(views, grads, (self.hook_q, self.hook_k, self.hook_v)):
            g = hook.backward_seq_first(g)
            if g is not view:
                view[...] = g
        return self._project_backward(grad_rows)

    def _forward_cached(self, query, key, value, attn_mask, key_padding_mask, is_causal, cache, positions=None):
        """Inference step with a KVCache: no backward. Self-attention appends the new keys/values;
        a static cache (cross-attention) projects the memory once and reuses it."""
        H, Hkv = self.n_heads, self.n_kv_heads
        offset = cache.length
        if cache.static:
            self._check_parts()
            (q,) = _split_groups(self.qkv_proj.project_parts(((query, (H,)),))[0], (H,))
            q = self.hook_q.seq_first(q)
            if cache.length == 0:
                (kv,) = self.qkv_proj.project_parts(((key, (Hkv, Hkv)),), first_head=H)
                k_mem, v_mem = _split_groups(kv, (Hkv, Hkv))
                cache.append(self.hook_k.seq_first(k_mem), self.hook_v.seq_first(v_mem))
            k, v, _ = self._share_kv(*cache.view(), self.kernel_name(0.0))
            offset = 0
        else:
            if not (key is query and value is query):
                raise ValueError("a growing KVCache is for self-attention; use KVCache(static=True) for a memory")
            q, k_new, v_new = self._hook_qkv(*_split_groups(self.qkv_proj(query), (H, Hkv, Hkv)))
            q, k_new, _ = self._transform_qk(q, k_new, offset, positions)  # the cache keeps rotated keys, H_kv heads
            k, v, _ = self._share_kv(*cache.append(k_new, v_new), self.kernel_name(0.0))
        causal = is_causal and not cache.static and query.shape[1] > 1
        if not cache.static:
            offset = k.shape[2] - query.shape[1]        # stored keys before the queries (a window drops old ones)
            if key_padding_mask is not None:           # given for every position processed: keep the stored ones
                key_padding_mask = np.asarray(key_padding_mask)[:, -k.shape[2]:]
        masks = self._masks(q, k, attn_mask, key_padding_mask, causal, offset, cached=True, window=not cache.static)
        ctx, _ = self._attend(self.kernel_name(0.0), q, k, v, masks, 0.0)
        return self.out_proj(ctx.reshape(ctx.shape[:2] + (-1,)))
