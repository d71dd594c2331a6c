"""GPT: a decoder-only language model (Radford et al. 2018/2019; nanoGPT's layout), built from a ``GPTConfig``.

    x₀ = E[idx] + P[0:T]                   token + position embeddings, then dropout
    x_l = Block_l(x_{l-1})  (causal)       each block built from its own BlockConfig
    logits = Norm_f(x_L) W_outᵀ            W_out tied to E by default

The same class is a Llama-family decoder with ``positional="rope"`` (or "alibi"), ``norm="rms"``,
``activation="swiglu"``, ``n_kv_heads`` < ``n_heads``, ``bias=False`` and ``tie_weights=False``, and a Qwen3
or Gemma decoder with their options (``qk_norm``, ``head_dim``, ``norm_placement="sandwich"``, per-layer
windows and RoPE bases, ``attn_scale``, soft-capping); ``numformer.interop.hf`` maps each Hugging Face family
onto a ``GPTConfig``.

Hook points (``nn.hooks``, TransformerLens's names): ``hook_embed`` (the token embeddings, scaled where the
config scales them), ``hook_pos_embed`` (the position table's rows, with a learned or sinusoidal table),
each block's (``blocks.{l}.hook_resid_pre`` …, ``blocks.{l}.attn.hook_pattern`` …) and
``ln_final.hook_normalized``; ``model.run_with_cache(idx)`` and ``model.run_with_hooks(idx, fwd_hooks=...)``.
"""
from __future__ import annotations

import math

import numpy as np

from ..decoding import generate
from ..nn import Dropout, Embedding, EncoderBlock, KVCache, Linear, Module, ModuleList, make_norm, make_positional
from ..nn import checkpoint, init
from ..nn.dispatch import F
from ..nn.hooks import HookedModel, HookPoint, add_through_hook, add_through_hook_backward, has_forward_hooks
from ..nn.module import FAILED_FORWARD, NO_FORWARD
from .config import GPTConfig, config_from


class GPT(HookedModel, Module):
    """Decoder-only Transformer LM. forward(idx (B, T) ints) -> logits (B, T, vocab_size).

    Built from a config, ``GPT(config, rng=..., dtype=...)``, or from the keyword form
    ``GPT(vocab_size, block_size, n_layers=4, n_heads=4, d_model=128, ...)`` (``GPTConfig.from_keywords``:
    identical layers, each overridable through ``layers=[{...}, ...]``); ``model.config`` is the config.

    Options: learned or sinusoidal positions; ReLU or GELU; post-LN or pre-LN
    (``norm_first``, with a final norm); weight tying between the token
    embedding and the output layer (``tie_weights``). Weights are initialized
    as nanoGPT: N(0, 0.02), residual output projections N(0, 0.02/√(2·n_layers)).
    ``attention="flash"`` uses the memory-efficient attention kernel (no attention
    dropout); ``gradient_checkpointing=True`` recomputes each block's activations
    in backward instead of keeping them (same gradients, less memory).

    Modern-decoder options: ``positional`` "rope" (rotary embeddings of queries and
    keys, base ``rope_theta``) or "alibi" (per-head linear biases) instead of an
    added table; ``activation="swiglu"`` or ``"geglu"`` (gated FFN; d_ff defaults to 8·d_model/3
    rounded up to a multiple of 8, about the parameters of a 4·d_model GELU FFN);
    ``n_kv_heads`` key/value heads (grouped-query attention; 1 = multi-query; the
    KV cache holds n_kv_heads heads); ``head_dim`` (the heads' size, default d_model / n_heads);
    ``qk_norm`` (RMSNorm of each query and key head); ``norm="rms"`` (RMSNorm);
    ``norm_placement="sandwich"`` (a norm before and after each sub-layer); ``attn_bias`` (default
    ``bias``) biases of the attention projections and ``qkv_bias`` (default ``attn_bias``) of the
    q/k/v projections alone (Qwen2: q/k/v biases only); ``sliding_window=W``: each position
    attends to the W most recent positions, itself included (Mistral), in training, in every
    attention kernel and in the KV cache, whose memory then stays bounded (``KVCache(window=W)``);
    ``attn_scale``, ``attn_logit_softcap`` and ``final_logit_softcap`` (Gemma);
    ``padding_idx``: a token id whose embedding row gets no gradient from the lookup (as torch's).
    """

    supports_logits_to_keep = True          # forward(..., logits_to_keep=1): generation computes one row of logits

    def __init__(self, *args, rng=None, dtype=np.float32, **keywords):
        super().__init__()
        self.config = c = config_from(GPTConfig, args, keywords)
        rng = init.default_rng(rng)
        self.gradient_checkpointing = c.gradient_checkpointing
        self.tok_emb = Embedding(c.vocab_size, c.d_model, rng, dtype, std=0.02, padding_idx=c.padding_idx)
        self.pos_emb = make_positional(c.positional, c.d_model, c.block_size, rng, dtype)
        self.drop = Dropout(c.dropout, rng)
        in_attention = c.positional if c.positional in ("rope", "alibi") else None
        self.blocks = ModuleList(EncoderBlock(c.d_model, block, dropout=c.dropout, norm=c.norm,
                                              layer_norm_eps=c.layer_norm_eps, rng=rng, dtype=dtype,
                                              attention=c.attention, positional=in_attention)
                                 for block in c.layers)
        self.norm_f = make_norm(c.norm, c.d_model, c.layer_norm_eps, c.layers[-1].bias, dtype) if c.final_norm else None
        self.lm_head = Linear(c.d_model, c.vocab_size, bias=False, rng=rng, dtype=dtype)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self._init_weights(rng, dtype)
        self.hook_embed = HookPoint()
        if c.positional not in ("rope", "alibi"):
            self.hook_pos_embed = HookPoint()
        self._cache = None
        self._positions_apart = False        # the last forward added hook_pos_embed's array itself
        self._no_backward = NO_FORWARD       # why backward cannot run now (None: the last forward allows it)

    def _init_weights(self, rng, dtype):
        """nanoGPT's initialization: every matrix of the blocks N(0, 0.02), those writing into the residual
        stream (each block's ``residual_weights``) N(0, 0.02/√(2·n_layers)), biases 0; an untied head N(0, 0.02)."""
        if init.is_skipped():                # a checkpoint is written next: leave the zeros untouched (unmapped)
            return
        proj_std = 0.02 / math.sqrt(2 * self.n_layers)
        for block in self.blocks:
            residual = {id(p) for p in block.residual_weights()}
            for p in block.hidden_matrices():
                p.data[...] = init.normal(rng, p.shape, proj_std if id(p) in residual else 0.02, dtype)
            for name, p in block.named_parameters():
                if name.rsplit(".", 1)[-1] == "bias":
                    p.data[...] = 0
        if not self.tie_weights:
            self.lm_head.weight.data[...] = init.normal(rng, self.lm_head.weight.shape, 0.02, dtype)

    # -- the config's values, as attributes ------------------------------------------------------------------
    vocab_size = property(lambda self: self.config.vocab_size)
    block_size = property(lambda self: self.config.block_size)
    d_model = property(lambda self: self.config.d_model)
    n_layers = property(lambda self: self.config.n_layers)
    positional = property(lambda self: self.config.positional)
    tie_weights = property(lambda self: self.config.tie_weights)
    padding_idx = property(lambda self: self.config.padding_idx)
    n_heads = property(lambda self: self._every_layer("n_heads"))
    n_kv_heads = property(lambda self: self._every_layer("n_kv_heads"))
    head_dim = property(lambda self: self._every_layer("head_dim"))
    d_ff = property(lambda self: self._every_layer("d_ff"))
    sliding_window = property(lambda self: self._every_layer("sliding_window"))
    rope_theta = property(lambda self: self._every_layer("rope_theta"))

    def _every_layer(self, name):
        """A block option shared by every layer; ValueError when the layers differ in it."""
        values = {getattr(b, name) for b in self.config.layers}
        if len(values) > 1:
            raise ValueError(f"the layers of this GPT differ in {name}; read model.config.layers[i].{name}")
        return values.pop()

    def load_state_dict(self, state, strict=True):
        """As Module.load_state_dict; a learned position table with positions inside attention is one clear error."""
        if self.positional in ("rope", "alibi") and "pos_emb.weight" in state:
            raise ValueError(f"the checkpoint has a learned position table (pos_emb.weight) but this model uses "
                             f"positional={self.positional!r}, which has none; build the model with "
                             f"positional='learned', or drop pos_emb.weight")
        return super().load_state_dict(state, strict)

    def new_kv_caches(self):
        """One empty KVCache per block (bounded by the block's window), for incremental decoding with
        forward(idx, kv_caches=...)."""
        return [KVCache(window=b.sliding_window) for b in self.config.layers]

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, greedy=False, rng=None,
                 **kwargs):
        """Continue idx (T,) or (B, T) by max_new_tokens sampled tokens: ``numformer.decoding.generate``
        (key/value cache, sliding window past block_size, ``stream=`` callback, ``use_cache``, ``shift``).
        Returns the prompt followed by the new tokens, (T + max_new_tokens,) or (B, T + max_new_tokens) int64
        (fewer when generation stops early)."""
        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        greedy=greedy, rng=rng, **kwargs)

    def forward(self, idx, kv_caches=None, attention_mask=None, logits_to_keep=0):
        """idx: (B, T) token ids -> logits (B, T, vocab_size).

        With ``kv_caches`` (from ``new_kv_caches``), idx holds only the new
        tokens; their positions continue after the cached ones (inference: no backward).

        ``attention_mask`` (B, T_past + T), as Hugging Face's: 1 for a real token, 0 for padding,
        covering the cached positions and the new ones. Padding is never attended to, and each
        row's positions count its real tokens: position = (number of real tokens before it),
        so a left-padded prompt gets the positions it has alone (``generate`` relies on this).

        ``logits_to_keep`` = n > 0 computes the logits of the last n positions only, (B, n, vocab_size)
        (inference: generation needs the last one; backward is not supported then).
        """
        idx = np.asarray(idx)
        self._no_backward = FAILED_FORWARD            # until this forward completes (a hook may raise)
        if idx.ndim != 2 or 0 in idx.shape:
            raise ValueError(f"idx must have shape (batch, seq) with batch >= 1 and seq >= 1, got {idx.shape}")
        offset = 0 if kv_caches is None else kv_caches[0].length
        padding, positions = self._padding(attention_mask, idx.shape, offset)
        x = self.tok_emb(idx)
        if self.config.scale_embeddings:
            x = x * np.asarray(math.sqrt(self.d_model), x.dtype)
        x, self._positions_apart = add_through_hook(self.pos_emb, getattr(self, "hook_pos_embed", None),
                                                    self.hook_embed(x), offset, positions=positions)
        x = self.drop(x)
        # a hooked forward keeps every block's activations: a recomputation in backward could not rerun its hooks
        recompute = self.gradient_checkpointing and kv_caches is None and not has_forward_hooks(self)
        for i, block in enumerate(self.blocks):
            x = checkpoint.run(block, recompute, x, is_causal=True,
                               key_padding_mask=padding, kv_cache=None if kv_caches is None else kv_caches[i],
                               positions=positions)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        if self.norm_f is not None:
            x = self.norm_f(x)
        logits = self.lm_head(x)
        if self.config.final_logit_softcap is not None:              # c·tanh(logits / c) (Gemma 2)
            logits, self._cache = F.softcap_forward(logits, self.config.final_logit_softcap)
        self._no_backward = (
            "backward after a forward with kv_caches: a cached (inference) forward keeps nothing for backward; "
            "train with a forward without kv_caches" if kv_caches is not None else
            f"backward after a forward with logits_to_keep={logits_to_keep}: only the last positions' logits were "
            f"computed; train with a forward without logits_to_keep" if logits_to_keep else None)
        return logits

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
        if self._no_backward is not None:
            raise RuntimeError(self._no_backward)
        if self.config.final_logit_softcap is not None and self._cache is not None:
            dlogits, self._cache = F.softcap_backward(dlogits, self._cache), None
        dx = self.lm_head.backward(dlogits)
        self._no_backward = NO_FORWARD                # the pass is consumed (a wrong dlogits shape leaves it)
        if self.norm_f is not None:
            dx = self.norm_f.backward(dx)
        for block in reversed(list(self.blocks)):
            dx = checkpoint.checkpoint_backward(block, dx)
        dx = add_through_hook_backward(self.pos_emb, getattr(self, "hook_pos_embed", None),
                                       self.drop.backward(dx), self._positions_apart)
        dx = self.hook_embed.backward(dx)
        if self.config.scale_embeddings:
            dx = dx * np.asarray(math.sqrt(self.d_model), dx.dtype)
        self.tok_emb.backward(dx)
