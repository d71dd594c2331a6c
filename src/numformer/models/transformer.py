"""Transformer: the encoder-decoder model of "Attention Is All You Need".

    memory = Encoder(E_src[src]·√d + PE)
    logits = Decoder(E_tgt[tgt]·√d + PE, memory) W_outᵀ     (causal self-attention in the decoder)

API: ``Transformer(src_vocab_size, tgt_vocab_size, d_model=512,
n_heads=8, n_layers=6, d_ff=2048, dropout=0.1)``, ``model(src, tgt)`` -> logits,
``encode``, ``decode`` and ``generate(src, max_length, temperature)``.
"""
from __future__ import annotations

import math

import numpy as np

from ..nn import (Decoder, DecoderBlock, Dropout, Embedding, Encoder, EncoderBlock, KVCache, Linear, Module,
                  make_norm, make_positional)
from .. import decoding
from ..nn import init
from .config import TransformerConfig, config_from


class Transformer(Module):
    """Encoder-decoder Transformer. forward(src (B, S), tgt (B, T)) -> logits (B, T, tgt_vocab_size).

    Built from a ``TransformerConfig`` or its keyword form (the same arguments); ``model.config``.

    Padding masks are derived from ``src_pad_id`` / ``tgt_pad_id`` when given;
    the decoder's self-attention is always causal. ``final_norm`` (None: ``norm_first``)
    adds a norm after each stack (torch.nn.Transformer always has one).
    ``share_embeddings`` shares one table between source and target (same
    vocabulary); ``tie_output`` ties the output layer to the target embedding.
    ``attention="flash"``: memory-efficient attention kernel (no attention dropout);
    ``gradient_checkpointing``: recompute each block's activations in backward.
    ``positional="rope"`` / ``"alibi"`` puts the positions in the self-attention of both
    stacks (not in cross-attention); ``n_kv_heads``: grouped-query attention in every layer.
    ``bos_id`` / ``eos_id``: the target vocabulary's start and end tokens, kept for
    ``generate`` (a task's ``model_config`` sets them, so a trained run's model has them).
    """

    def __init__(self, *args, rng=None, dtype=np.float32, **keywords):
        super().__init__()
        self.config = c = config_from(TransformerConfig, args, keywords)
        self.bos_id = None if c.bos_id is None else int(c.bos_id)
        self.eos_id = None if c.eos_id is None else int(c.eos_id)
        rng = init.default_rng(rng)
        n_enc = c.n_layers if c.n_encoder_layers is None else c.n_encoder_layers
        n_dec = c.n_layers if c.n_decoder_layers is None else c.n_decoder_layers
        final_norm = c.norm_first if c.final_norm is None else c.final_norm
        d_model = c.d_model
        self.src_vocab_size, self.tgt_vocab_size, self.max_len = c.src_vocab_size, c.tgt_vocab_size, c.max_len
        self.d_model, self.n_heads = d_model, c.n_heads
        self.src_pad_id, self.tgt_pad_id = c.src_pad_id, c.tgt_pad_id
        self.embed_scale = math.sqrt(d_model) if c.scale_embeddings else 1.0
        self.src_emb = Embedding(c.src_vocab_size, d_model, rng, dtype)
        self.tgt_emb = Embedding(c.tgt_vocab_size, d_model, rng, dtype)
        self.src_pos = make_positional(c.positional, d_model, c.max_len, rng, dtype)
        self.tgt_pos = make_positional(c.positional, d_model, c.max_len, rng, dtype)
        self.src_drop = Dropout(c.dropout, rng)
        self.tgt_drop = Dropout(c.dropout, rng)
        block = dict(dropout=c.dropout, norm=c.norm, layer_norm_eps=c.layer_norm_eps, rng=rng, dtype=dtype,
                     attention=c.attention, positional=c.positional if c.positional in ("rope", "alibi") else None)
        self.encoder = Encoder([EncoderBlock(d_model, c.block(), **block) for _ in range(n_enc)],
                               make_norm(c.norm, d_model, c.layer_norm_eps, c.bias, dtype) if final_norm else None,
                               gradient_checkpointing=c.gradient_checkpointing)
        self.decoder = Decoder([DecoderBlock(d_model, c.block(), **block) for _ in range(n_dec)],
                               make_norm(c.norm, d_model, c.layer_norm_eps, c.bias, dtype) if final_norm else None,
                               gradient_checkpointing=c.gradient_checkpointing)
        self.out_proj = Linear(d_model, c.tgt_vocab_size, bias=False, rng=rng, dtype=dtype)
        # Xavier-uniform for every matrix, as torch.nn.Transformer and the Annotated Transformer.
        for _, p in self.named_parameters():
            if p.data.ndim > 1 and not init.is_skipped():
                p.data[...] = init.xavier_uniform(rng, p.shape, dtype)
        # Tie parameters, not modules: each Embedding keeps its own cache for backward.
        if c.share_embeddings:
            self.tgt_emb.weight = self.src_emb.weight
        if c.tie_output:
            self.out_proj.weight = self.tgt_emb.weight

    # -- masks ---------------------------------------------------------------------
    def src_padding_mask(self, src):
        """(B, S) bool, True where src is ``src_pad_id`` (None when src_pad_id is None)."""
        return None if self.src_pad_id is None else np.asarray(src) == self.src_pad_id

    def tgt_padding_mask(self, tgt):
        """(B, T) bool, True where tgt is ``tgt_pad_id`` (None when tgt_pad_id is None)."""
        return None if self.tgt_pad_id is None else np.asarray(tgt) == self.tgt_pad_id

    # -- forward -------------------------------------------------------------------
    def _embed(self, ids, emb, pos, drop, offset=0):
        ids = np.asarray(ids)
        if ids.ndim != 2:
            raise ValueError(f"token ids must have shape (batch, seq), got {ids.shape}")
        if ids.shape[1] == 0:
            raise ValueError("empty input sequence: give at least one token")
        x = emb(ids) * np.asarray(self.embed_scale, self.dtype)
        return drop(pos(x, offset))

    def encode(self, src, src_key_padding_mask=None, src_mask=None):
        """src (B, S) -> memory (B, S, d_model)."""
        if src_key_padding_mask is None:
            src_key_padding_mask = self.src_padding_mask(src)
        x = self._embed(src, self.src_emb, self.src_pos, self.src_drop)
        return self.encoder(x, mask=src_mask, key_padding_mask=src_key_padding_mask)

    def decode(self, tgt, memory, memory_key_padding_mask=None, tgt_key_padding_mask=None, tgt_mask=None,
               memory_mask=None, caches=None):
        """tgt (B, T), memory (B, S, d_model) -> logits (B, T, tgt_vocab_size).

        With ``caches`` (from ``new_caches``) tgt holds only the new tokens.
        """
        if tgt_key_padding_mask is None and caches is None:
            tgt_key_padding_mask = self.tgt_padding_mask(tgt)
        offset = 0 if caches is None else caches[0][0].length
        y = self._embed(tgt, self.tgt_emb, self.tgt_pos, self.tgt_drop, offset)
        h = self.decoder(y, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                         tgt_is_causal=True, caches=caches)
        return self.out_proj(h)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None):
        if src_key_padding_mask is None:
            src_key_padding_mask = self.src_padding_mask(src)
        if memory_key_padding_mask is None:
            memory_key_padding_mask = src_key_padding_mask
        memory = self.encode(src, src_key_padding_mask, src_mask)
        return self.decode(tgt, memory, memory_key_padding_mask, tgt_key_padding_mask, tgt_mask, memory_mask)

    def backward(self, dlogits):
        """Accumulate every parameter's gradient from dL/dlogits (after forward, or encode + decode)."""
        scale = np.asarray(self.embed_scale, dlogits.dtype)
        dh = self.out_proj.backward(dlogits)
        dy, dmemory = self.decoder.backward(dh)
        self.tgt_emb.backward(self.tgt_pos.backward(self.tgt_drop.backward(dy)) * scale)
        dx = self.encoder.backward(dmemory)
        self.src_emb.backward(self.src_pos.backward(self.src_drop.backward(dx)) * scale)

    def new_caches(self):
        """Per decoder layer: (self-attention KVCache, static cross-attention KVCache)."""
        return [(KVCache(), KVCache(static=True)) for _ in self.decoder.layers]

    def generate(self, src, max_length=50, temperature=0.7, top_k=None, top_p=None, greedy=False, beam_size=None,
                 length_penalty=1.0, bos_id=None, eos_id=None, rng=None, **kwargs):
        """Translate src (S,) or (B, S) into target token ids (lists without bos/eos), with the decoder's cache.

        Samples with ``temperature`` (and top_k / top_p) by default, drawing from ``rng`` (a seed or a
        Generator; None: fresh randomness); ``greedy=True`` (or temperature 0) takes the argmax;
        ``beam_size=K`` runs beam search with ``length_penalty`` instead (the sampling arguments unused).
        Other keywords go to ``decoding.sample_decode`` or ``decoding.beam_search``. ``bos_id`` / ``eos_id``
        default to the model's own (``Transformer(..., bos_id=, eos_id=)``, set by the task for a trained
        run); a model without them needs them passed. See ``numformer.generate``.
        """
        bos_id = self.bos_id if bos_id is None else bos_id
        eos_id = self.eos_id if eos_id is None else eos_id
        if bos_id is None or eos_id is None:
            raise ValueError("Transformer.generate needs bos_id and eos_id (the target tokenizer's start and end "
                             "token ids): this model was built without them; pass model.generate(src, ..., "
                             "bos_id=..., eos_id=...) or build it with Transformer(..., bos_id=..., eos_id=...)")
        if beam_size is not None:
            return decoding.beam_search(self, src, beam_size, max_length, bos_id, eos_id, length_penalty=length_penalty,
                                   **kwargs)
        return decoding.sample_decode(self, src, max_length, bos_id, eos_id, temperature=temperature, top_k=top_k,
                                 top_p=top_p, greedy=greedy, rng=rng, **kwargs)
