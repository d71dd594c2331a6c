"""Encoder and decoder blocks, and their stacks.

Post-LN (the paper, ``norm_first=False``)          Pre-LN (``norm_first=True``, GPT-2)
    h = Norm₁(x + Dropout(SelfAttn(x)))                h = x + Dropout(SelfAttn(Norm₁(x)))
    y = Norm₂(h + Dropout(FFN(h)))                     y = h + Dropout(FFN(Norm₂(h)))

The decoder block adds cross-attention to the encoder output (the memory)
between the two. The sub-module names follow ``torch.nn.TransformerEncoderLayer``
/ ``TransformerDecoderLayer`` (``self_attn``, ``norm1`` …) so that weights map
one to one; the feed-forward pair is grouped as ``ff.linear1`` / ``ff.linear2``.
A decoder-only model (GPT) uses ``EncoderBlock`` with a causal mask.
"""
from __future__ import annotations

import numpy as np

from . import init
from . import checkpoint
from .attention import MultiHeadAttention
from .layers import Dropout, make_feed_forward, make_norm
from .module import Module, ModuleList


class _Block(Module):
    """What the encoder and decoder blocks share: their arguments and sub-modules. The self-attention
    (``self_attn``), for a decoder block the cross-attention to the memory (``cross_attn``), the feed-forward
    (``ff``), and one norm and one dropout per sub-layer (``norm1`` …, ``dropout1`` …)."""

    CROSS_ATTENTION = False

    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, activation="relu", norm_first=False, norm="layer",
                 layer_norm_eps=1e-5, bias=True, attn_bias=None, rng=None, dtype=np.float32, attention="plain",
                 n_kv_heads=None, positional=None, rope_theta=10000.0, qkv_bias=None, sliding_window=None):
        super().__init__()
        rng = init.default_rng(rng)
        attn_bias = bias if attn_bias is None else attn_bias
        self.d_model, self.n_heads, self.d_ff = d_model, n_heads, d_ff
        self.norm_first, self.activation, self.norm_kind = norm_first, activation, norm
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout, attn_bias, rng, dtype, attention,
                                            n_kv_heads=n_kv_heads, positional=positional, rope_theta=rope_theta,
                                            qkv_bias=qkv_bias, sliding_window=sliding_window)
        if self.CROSS_ATTENTION:
            self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout, attn_bias, rng, dtype, attention,
                                                 n_kv_heads=n_kv_heads)
        self.ff = make_feed_forward(d_model, d_ff, activation, dropout, bias, rng, dtype)
        n_sublayers = 3 if self.CROSS_ATTENTION else 2
        for i in range(1, n_sublayers + 1):
            setattr(self, f"norm{i}", make_norm(norm, d_model, layer_norm_eps, bias, dtype))
        for i in range(1, n_sublayers + 1):
            setattr(self, f"dropout{i}", Dropout(dropout, rng))

    def extra_repr(self):
        return f"norm_first={self.norm_first}"


class EncoderBlock(_Block):
    """Self-attention and feed-forward sub-layers, each with a residual connection and a norm.

    x: (B, T, d_model) -> (B, T, d_model). Masks follow torch.nn (bool True = blocked).
    ``attn_bias`` (default: ``bias``) switches the attention projections' biases separately.
    ``attention``: "plain" or "flash" (memory-efficient kernel, see MultiHeadAttention).
    ``activation="swiglu"``: Llama's gated feed-forward (SwiGLUFeedForward);
    ``n_kv_heads``, ``positional`` ("rope" / "alibi", else None), ``rope_theta``, ``qkv_bias``
    (default: ``attn_bias``; biases on the q/k/v projections only, as Qwen2) and ``sliding_window``
    are the self-attention options of MultiHeadAttention.
    """

    def forward(self, x, attn_mask=None, key_padding_mask=None, is_causal=False, kv_cache=None, positions=None):
        """``positions`` (B, T): each row's token positions, for positional='rope' (default: 0 … T-1 after
        the cached ones)."""
        where = {} if positions is None else {"positions": positions}

        def attend(z):
            return self.self_attn(z, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                                  kv_cache=kv_cache, **where)

        if self.norm_first:
            h = x + self.dropout1(attend(self.norm1(x)))
            return h + self.dropout2(self.ff(self.norm2(h)))
        h = self.norm1(x + self.dropout1(attend(x)))
        return self.norm2(h + self.dropout2(self.ff(h)))

    def backward(self, dy):
        if self.norm_first:
            dh = dy + self.norm2.backward(self.ff.backward(self.dropout2.backward(dy)))
            return dh + self.norm1.backward(self.self_attn.backward(self.dropout1.backward(dh)))
        dz2 = self.norm2.backward(dy)
        dh = dz2 + self.ff.backward(self.dropout2.backward(dz2))
        dz1 = self.norm1.backward(dh)
        return dz1 + self.self_attn.backward(self.dropout1.backward(dz1))


class DecoderBlock(_Block):
    """Masked self-attention, cross-attention to the memory, and feed-forward; each with residual + norm.

    x: (B, T, d_model), memory: (B, S, d_model) -> (B, T, d_model).
    backward(dy) returns (dx, dmemory). ``attention``: "plain" or "flash" (both attention layers).
    ``n_kv_heads`` applies to both attention layers; ``positional`` ("rope" / "alibi") and ``rope_theta``
    to the self-attention only (the memory's positions are the encoder's business).
    """

    CROSS_ATTENTION = True

    def forward(self, x, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, cache=None):
        """``cache`` = (self-attention KVCache, static cross-attention KVCache) for incremental decoding."""
        self_cache, cross_cache = (None, None) if cache is None else cache

        def self_attend(z):
            return self.self_attn(z, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask,
                                  is_causal=tgt_is_causal, kv_cache=self_cache)

        def cross_attend(z):
            return self.cross_attn(z, memory, attn_mask=memory_mask, key_padding_mask=memory_key_padding_mask,
                                   kv_cache=cross_cache)

        if self.norm_first:
            h1 = x + self.dropout1(self_attend(self.norm1(x)))
            h2 = h1 + self.dropout2(cross_attend(self.norm2(h1)))
            return h2 + self.dropout3(self.ff(self.norm3(h2)))
        h1 = self.norm1(x + self.dropout1(self_attend(x)))
        h2 = self.norm2(h1 + self.dropout2(cross_attend(h1)))
        return self.norm3(h2 + self.dropout3(self.ff(h2)))

    def backward(self, dy):
        if self.norm_first:
            dh2 = dy + self.norm3.backward(self.ff.backward(self.dropout3.backward(dy)))
            dq, dmemory = self.cross_attn.backward(self.dropout2.backward(dh2))
            dh1 = dh2 + self.norm2.backward(dq)
            dx = dh1 + self.norm1.backward(self.self_attn.backward(self.dropout1.backward(dh1)))
            return dx, dmemory
        dz3 = self.norm3.backward(dy)
        dh2 = dz3 + self.ff.backward(self.dropout3.backward(dz3))
        dz2 = self.norm2.backward(dh2)
        dq, dmemory = self.cross_attn.backward(self.dropout2.backward(dz2))
        dh1 = dz2 + dq
        dz1 = self.norm1.backward(dh1)
        return dz1 + self.self_attn.backward(self.dropout1.backward(dz1)), dmemory


class Encoder(Module):
    """A stack of EncoderBlocks with an optional final norm (needed after pre-LN blocks).

    ``gradient_checkpointing=True``: each block keeps only its input in forward and
    recomputes its activations in backward (same gradients, see ``nn.checkpoint``).
    """

    def __init__(self, layers, norm=None, gradient_checkpointing=False):
        super().__init__()
        self.layers = ModuleList(layers)
        self.norm = norm
        self.gradient_checkpointing = gradient_checkpointing

    def forward(self, x, mask=None, key_padding_mask=None, is_causal=False, kv_caches=None):
        for i, layer in enumerate(self.layers):
            x = checkpoint.run(layer, self.gradient_checkpointing and kv_caches is None, x, attn_mask=mask,
                               key_padding_mask=key_padding_mask, is_causal=is_causal,
                               kv_cache=None if kv_caches is None else kv_caches[i])
        return x if self.norm is None else self.norm(x)

    def backward(self, dy):
        if self.norm is not None:
            dy = self.norm.backward(dy)
        for layer in reversed(list(self.layers)):
            dy = checkpoint.checkpoint_backward(layer, dy)
        return dy


class Decoder(Module):
    """A stack of DecoderBlocks with an optional final norm. backward returns (dx, dmemory).

    ``gradient_checkpointing=True``: as in ``Encoder``.
    """

    def __init__(self, layers, norm=None, gradient_checkpointing=False):
        super().__init__()
        self.layers = ModuleList(layers)
        self.norm = norm
        self.gradient_checkpointing = gradient_checkpointing

    def forward(self, x, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, caches=None):
        for i, layer in enumerate(self.layers):
            x = checkpoint.run(layer, self.gradient_checkpointing and caches is None, x, memory, tgt_mask,
                               memory_mask, tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal,
                               cache=None if caches is None else caches[i])
        return x if self.norm is None else self.norm(x)

    def backward(self, dy):
        if self.norm is not None:
            dy = self.norm.backward(dy)
        dmemory = None
        for layer in reversed(list(self.layers)):
            dy, dm = checkpoint.checkpoint_backward(layer, dy)
            dmemory = dm if dmemory is None else dmemory + dm
        return dy, dmemory
