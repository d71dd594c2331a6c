"""EncoderClassifier: a Transformer encoder with a pooled classification head.

    h = Encoder(E[ids]·s + PE)          padding positions are masked out of attention
    z = mean of h over non-padding positions   (pooling="mean")   or  h[:, 0]  (pooling="first")
    logits = Linear(Dropout(z))

Hook points (``nn.hooks``, TransformerLens's names): ``hook_embed`` (the scaled token embeddings),
``hook_pos_embed`` (with a learned or sinusoidal table), each encoder layer's as ``blocks.{l}.…``
(``blocks.0.hook_resid_pre``, ``blocks.0.attn.hook_pattern`` …) and, with pre-norm blocks,
``ln_final.hook_normalized``; ``model.run_with_cache(ids)``, ``model.run_with_hooks(ids, fwd_hooks=...)``.
"""
from __future__ import annotations

import math

import numpy as np

from ..nn import Dropout, Embedding, Encoder, EncoderBlock, Linear, Module, make_norm, make_positional
from ..nn import init
from ..nn.hooks import HookedModel, HookPoint, add_through_hook, add_through_hook_backward
from ..nn.module import FAILED_FORWARD, NO_FORWARD
from .config import EncoderClassifierConfig, config_from

POOLINGS = ("mean", "first")


class EncoderClassifier(HookedModel, Module):
    """forward(ids (B, T), key_padding_mask=None) -> logits (B, n_classes).

    Built from an ``EncoderClassifierConfig`` or its keyword form (the same arguments); ``model.config``.

    ``key_padding_mask`` (B, T) bool, True at padding. If ``pad_id`` is set (0 by default) and no mask is
    given, positions equal to pad_id are padding.
    ``scale_embeddings`` multiplies token embeddings by √d_model, as in the paper.
    ``attention="flash"``: memory-efficient attention kernel; ``gradient_checkpointing``:
    recompute each encoder block's activations in backward. ``positional="rope"`` / ``"alibi"``
    (bidirectional: the bias is -m·|i - j|) and ``n_kv_heads`` act inside the self-attention.
    """

    def __init__(self, *args, rng=None, dtype=np.float32, **keywords):
        super().__init__()
        self.config = c = config_from(EncoderClassifierConfig, args, keywords)
        if c.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {c.pooling!r}; choose one of {list(POOLINGS)}")
        rng = init.default_rng(rng)
        d_model = c.d_model
        self.vocab_size, self.n_classes, self.max_len = c.vocab_size, c.n_classes, c.max_len
        self.d_model, self.pooling, self.pad_id = d_model, c.pooling, c.pad_id
        self.embed_scale = math.sqrt(d_model) if c.scale_embeddings else 1.0
        self.tok_emb = Embedding(c.vocab_size, d_model, rng, dtype, std=d_model ** -0.5)
        self.pos_emb = make_positional(c.positional, d_model, c.max_len, rng, dtype)
        self.drop = Dropout(c.dropout, rng)
        in_attention = c.positional if c.positional in ("rope", "alibi") else None
        blocks = [EncoderBlock(d_model, c.block(), dropout=c.dropout, norm=c.norm, layer_norm_eps=c.layer_norm_eps,
                               rng=rng, dtype=dtype, attention=c.attention, positional=in_attention)
                  for _ in range(c.n_layers)]
        self.encoder = Encoder(blocks, make_norm(c.norm, d_model, c.layer_norm_eps, c.bias, dtype) if c.norm_first
                               else None, gradient_checkpointing=c.gradient_checkpointing)
        self.head_drop = Dropout(c.dropout, rng)
        self.head = Linear(d_model, c.n_classes, rng=rng, dtype=dtype)
        self.hook_embed = HookPoint()
        if c.positional not in ("rope", "alibi"):
            self.hook_pos_embed = HookPoint()
        self._cache = None
        self._positions_apart = False

    HOOK_PREFIXES = (("encoder.layers.", "blocks."), ("encoder.norm.", "ln_final."))

    def padding_mask(self, ids):
        """(B, T) bool, True at padding positions (None when pad_id is None)."""
        return None if self.pad_id is None else (np.asarray(ids) == self.pad_id)

    def encode(self, ids, key_padding_mask=None):
        """Token ids (B, T) -> contextual vectors (B, T, d_model)."""
        x = self.hook_embed(self.tok_emb(ids) * np.asarray(self.embed_scale, self.dtype))
        x, self._positions_apart = add_through_hook(self.pos_emb, getattr(self, "hook_pos_embed", None), x)
        return self.encoder(self.drop(x), key_padding_mask=key_padding_mask)

    def forward(self, ids, key_padding_mask=None):
        ids = np.asarray(ids)
        self._cache = FAILED_FORWARD                   # until this forward completes (a hook may raise)
        if ids.ndim != 2:
            raise ValueError(f"ids must have shape (batch, seq), got {ids.shape}")
        if key_padding_mask is None:
            key_padding_mask = self.padding_mask(ids)
        h = self.encode(ids, key_padding_mask)
        B, T, _ = h.shape
        if self.pooling == "mean":
            keep = np.ones((B, T), h.dtype) if key_padding_mask is None else (~key_padding_mask).astype(h.dtype)
            weights = keep / np.maximum(keep.sum(axis=1, keepdims=True), 1.0)      # (B, T), rows sum to 1
            pooled = np.einsum("btd,bt->bd", h, weights)
        else:
            weights = None
            pooled = h[:, 0]
        self._cache = (weights, h.shape)
        return self.head(self.head_drop(pooled))

    def backward(self, dlogits):
        """Accumulate every parameter's gradient from dL/dlogits (B, n_classes)."""
        if self._cache is None or isinstance(self._cache, str):
            raise RuntimeError(NO_FORWARD if self._cache is None else self._cache)
        weights, h_shape = self._cache
        dpooled = self.head_drop.backward(self.head.backward(dlogits))
        if weights is not None:
            dh = weights[:, :, None] * dpooled[:, None, :]
        else:
            dh = np.zeros(h_shape, dtype=dpooled.dtype)
            dh[:, 0] = dpooled
        dx = add_through_hook_backward(self.pos_emb, getattr(self, "hook_pos_embed", None),
                                       self.drop.backward(self.encoder.backward(dh)), self._positions_apart)
        dx = self.hook_embed.backward(dx)
        self.tok_emb.backward(dx * np.asarray(self.embed_scale, dx.dtype))
        self._cache = None
