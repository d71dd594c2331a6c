"""GPT: a decoder-only language model (Radford et al. 2018/2019; nanoGPT's layout).

    x₀ = E[idx] + P[0:T]                   token + position embeddings, then dropout
    x_l = Block_l(x_{l-1})  (causal)       pre-LN by default, as GPT-2
    logits = Norm_f(x_L) W_outᵀ            W_out tied to E by default

The same class is a Llama-family decoder with ``positional="rope"`` (or
"alibi"), ``norm="rms"``, ``activation="swiglu"``, ``n_kv_heads`` < ``n_heads``,
``bias=False`` and ``tie_weights=False`` (see ``interop.hf`` for checkpoints).
"""
from __future__ import annotations

import math

import numpy as np

from ..nn import (Dropout, Embedding, EncoderBlock, KVCache, Linear, Module, ModuleList, SwiGLUFeedForward,
                  make_norm, make_positional)
from ..decoding import generate
from ..nn import checkpoint, init
from ._checks import check_sizes
from .pretrained import loader as pretrained_loader


class GPT(Module):
    """Decoder-only Transformer LM. forward(idx (B, T) ints) -> logits (B, T, vocab_size).

    Options: learned or sinusoidal positions; ReLU or GELU; post-LN or pre-LN
    (``norm_first``, with a final norm); weight tying between the token
    embedding and the output layer (``tie_weights``). Weights are initialized
    as nanoGPT: N(0, 0.02), residual output projections N(0, 0.02/√(2·n_layers)).
    ``attention="flash"`` uses the memory-efficient attention kernel (no attention
    dropout); ``gradient_checkpointing=True`` recomputes each block's activations
    in backward instead of keeping them (same gradients, less memory).

    Modern-decoder options: ``positional`` "rope" (rotary embeddings of queries and
    keys, base ``rope_theta``) or "alibi" (per-head linear biases) instead of an
    added table; ``activation="swiglu"`` (gated FFN; d_ff defaults to 8·d_model/3
    rounded up to a multiple of 8, about the parameters of a 4·d_model GELU FFN);
    ``n_kv_heads`` key/value heads (grouped-query attention; 1 = multi-query; the
    KV cache holds n_kv_heads heads); ``norm="rms"`` (RMSNorm); ``attn_bias`` (default
    ``bias``) biases of the attention projections and ``qkv_bias`` (default ``attn_bias``) of the
    q/k/v projections alone (Qwen2: q/k/v biases only); ``sliding_window=W``: each position
    attends to the W most recent positions, itself included (Mistral), in training, in every
    attention kernel and in the KV cache, which then keeps only the last W positions;
    ``padding_idx``: a token id whose embedding row gets no gradient from the lookup (as torch's).
    """

    supports_logits_to_keep = True          # forward(..., logits_to_keep=1): generation computes one row of logits

    def __init__(self, vocab_size, block_size, n_layers=4, n_heads=4, d_model=128, d_ff=None, dropout=0.0,
                 positional="learned", activation="gelu", norm_first=True, norm="layer", tie_weights=True,
                 bias=True, layer_norm_eps=1e-5, attention="plain", gradient_checkpointing=False, n_kv_heads=None,
                 rope_theta=10000.0, attn_bias=None, qkv_bias=None, sliding_window=None, padding_idx=None, rng=None,
                 dtype=np.float32):
        super().__init__()
        check_sizes("GPT", vocab_size=vocab_size, block_size=block_size, n_layers=n_layers, n_heads=n_heads,
                    d_model=d_model, d_ff=d_ff)
        rng = init.default_rng(rng)
        if d_ff is None:
            d_ff = -(-8 * d_model // 24) * 8 if activation == "swiglu" else 4 * d_model
        self.gradient_checkpointing = gradient_checkpointing
        self.positional, self.n_kv_heads, self.rope_theta = positional, n_kv_heads, float(rope_theta)
        self.vocab_size, self.block_size, self.n_layers = vocab_size, block_size, n_layers
        self.n_heads, self.d_model, self.d_ff = n_heads, d_model, d_ff
        self.sliding_window, self.padding_idx = sliding_window, padding_idx
        self.tok_emb = Embedding(vocab_size, d_model, rng, dtype, std=0.02, padding_idx=padding_idx)
        self.pos_emb = make_positional(positional, d_model, block_size, rng, dtype)
        self.drop = Dropout(dropout, rng)
        in_attention = positional if positional in ("rope", "alibi") else None
        self.blocks = ModuleList(EncoderBlock(d_model, n_heads, d_ff, dropout, activation, norm_first, norm,
                                              layer_norm_eps, bias, rng=rng, dtype=dtype, attention=attention,
                                              n_kv_heads=n_kv_heads, positional=in_attention, rope_theta=rope_theta,
                                              attn_bias=attn_bias, qkv_bias=qkv_bias, sliding_window=sliding_window)
                                 for _ in range(n_layers))
        self.norm_f = make_norm(norm, d_model, layer_norm_eps, bias, dtype) if norm_first else None
        self.lm_head = Linear(d_model, vocab_size, bias=False, rng=rng, dtype=dtype)
        self.tie_weights = tie_weights
        if tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self._init_weights(rng, dtype)

    def _init_weights(self, rng, dtype):
        proj_std = 0.02 / math.sqrt(2 * self.n_layers)
        for block in self.blocks:
            ff = block.ff
            ffn = (((ff.gate_proj, 0.02), (ff.up_proj, 0.02), (ff.down_proj, proj_std))
                   if isinstance(ff, SwiGLUFeedForward) else ((ff.linear1, 0.02), (ff.linear2, proj_std)))
            for lin, std in ((block.self_attn.qkv_proj, 0.02), (block.self_attn.out_proj, proj_std), *ffn):
                lin.weight.data[...] = init.normal(rng, lin.weight.shape, std, dtype)
                if lin.bias is not None:
                    lin.bias.data[...] = 0
        if not self.tie_weights:
            self.lm_head.weight.data[...] = init.normal(rng, self.lm_head.weight.shape, 0.02, dtype)

    def load_state_dict(self, state, strict=True):
        """As Module.load_state_dict; a learned position table with positions inside attention is one clear error."""
        if self.positional in ("rope", "alibi") and "pos_emb.weight" in state:
            raise ValueError(f"the checkpoint has a learned position table (pos_emb.weight) but this model uses "
                             f"positional={self.positional!r}, which has none; build the model with "
                             f"positional='learned', or drop pos_emb.weight")
        return super().load_state_dict(state, strict)

    @classmethod
    def from_pretrained(cls, name_or_dir, dtype=np.float32, **overrides):
        """A GPT with the weights of a Hugging Face checkpoint: a folder (config.json + model.safetensors)
        or a hub id such as ``"gpt2"`` (see ``numformer.interop.hf.load_pretrained``; its tokenizer:
        ``load_pretrained(name_or_dir)[1]``). ``overrides``: e.g. ``dropout=0.1`` for fine-tuning."""
        return pretrained_loader().load_pretrained(name_or_dir, dtype=dtype, **overrides)[0]

    def new_kv_caches(self):
        """One empty KVCache per block, for incremental decoding with forward(idx, kv_caches=...)."""
        return [KVCache(window=self.sliding_window) for _ in self.blocks]

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, greedy=False, rng=None,
                 **kwargs):
        """Continue idx (T,) or (B, T) by max_new_tokens sampled tokens: ``numformer.decoding.generate``
        (key/value cache, sliding window past block_size, ``stream=`` callback, ``use_cache``, ``shift``)."""
        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        greedy=greedy, rng=rng, **kwargs)

    def forward(self, idx, kv_caches=None, attention_mask=None, logits_to_keep=0):
        """idx: (B, T) token ids -> logits (B, T, vocab_size).

        With ``kv_caches`` (from ``new_kv_caches``), idx holds only the new
        tokens; their positions continue after the cached ones.

        ``attention_mask`` (B, T_past + T), as Hugging Face's: 1 for a real token, 0 for padding,
        covering the cached positions and the new ones. Padding is never attended to, and each
        row's positions count its real tokens: position = (number of real tokens before it),
        so a left-padded prompt gets the positions it has alone (``generate`` relies on this).

        ``logits_to_keep`` = n > 0 computes the logits of the last n positions only, (B, n, vocab_size)
        (inference: generation needs the last one; backward is not supported then).
        """
        idx = np.asarray(idx)
        if idx.ndim != 2 or 0 in idx.shape:
            raise ValueError(f"idx must have shape (batch, seq) with batch >= 1 and seq >= 1, got {idx.shape}")
        offset = 0 if kv_caches is None else kv_caches[0].length
        padding, positions = self._padding(attention_mask, idx.shape, offset)
        x = self.drop(self.pos_emb(self.tok_emb(idx), offset, positions=positions))
        for i, block in enumerate(self.blocks):
            x = checkpoint.run(block, self.gradient_checkpointing and kv_caches is None, x, is_causal=True,
                               key_padding_mask=padding, kv_cache=None if kv_caches is None else kv_caches[i],
                               positions=positions)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        if self.norm_f is not None:
            x = self.norm_f(x)
        return self.lm_head(x)

    @staticmethod
    def _padding(attention_mask, shape, offset):
        """(key_padding_mask (B, offset + T) bool, True = padding; positions (B, T)) of an attention mask,
        or (None, None) without one."""
        if attention_mask is None:
            return None, None
        mask = np.asarray(attention_mask)
        B, T = shape
        if mask.shape != (B, offset + T):
            raise ValueError(f"attention_mask must have shape (batch, cached + new tokens) = {(B, offset + T)}, "
                             f"got {mask.shape}")
        real = mask.astype(bool)
        positions = np.maximum(np.cumsum(real, axis=1) - 1, 0)[:, offset:]
        return ~real, positions

    def backward(self, dlogits):
        """Accumulate every parameter's gradient from dL/dlogits (B, T, vocab_size)."""
        dx = self.lm_head.backward(dlogits)
        if self.norm_f is not None:
            dx = self.norm_f.backward(dx)
        for block in reversed(list(self.blocks)):
            dx = checkpoint.checkpoint_backward(block, dx)
        self.tok_emb.backward(self.pos_emb.backward(self.drop.backward(dx)))
