"""The bridge to PyTorch: check numformer against ``torch.nn`` with your own weights.

    adapter = from_torch(torch_module)          # numformer module, weights copied
    out = adapter(*same_arguments_as_torch)     # NumPy in, NumPy out, same return values
    grads = adapter.backward(dout)              # gradients w.r.t. the array inputs
    grads_to_torch(adapter)                     # {torch parameter name: gradient}, torch layouts
    to_torch(adapter)                           # back to an equivalent torch module

Supported: ``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``,
``nn.TransformerDecoderLayer``, ``nn.TransformerEncoder``,
``nn.TransformerDecoder`` and ``nn.Transformer``, all with ``batch_first=True``.
PyTorch is imported lazily; it is never a runtime dependency of numformer.

Whole encoder-decoder models::

    torch_model = to_torch(numformer_transformer)     # a TorchSeq2Seq: embeddings, nn.Transformer, output layer
    model = from_torch(torch_model)                   # back to numformer.models.Transformer
    model = from_torch_seq2seq(transformer, src_embed, tgt_embed, generator, ...)   # your own torch model

``nn.Transformer`` always ends each stack with a LayerNorm, while numformer's
``Transformer`` has final norms only when ``final_norm`` is true (default:
``final_norm = norm_first``); ``from_torch_seq2seq`` sets ``final_norm`` from
the torch model, and ``to_torch`` of a numformer model without final norms
builds its ``nn.Transformer`` from custom stacks without them.

Mask arguments keep torch's meaning (boolean True = not allowed; float added).
As in torch, an ``is_causal`` flag (``is_causal``, ``src_is_causal``,
``tgt_is_causal``, ``memory_is_causal``) is a hint that the matching mask is
the causal mask: the mask is what is applied. A flag set to True without its
mask raises ValueError, as torch 2.13 raises RuntimeError ("Need attn_mask if
specifying the is_causal hint") for every supported module. (Only torch's
inference fast path, eval mode under ``torch.no_grad()``, accepts the flag
alone for self-attention, and then ignores it: it attends to every key.)
"""
from __future__ import annotations

import re

import numpy as np

from .._install import require
from ..models import Transformer
from ..nn import Decoder, DecoderBlock, Encoder, EncoderBlock, LayerNorm, Module, MultiHeadAttention
from ..nn.positional import SinusoidalPositionalEncoding, sinusoidal_table


def _torch():
    require(("torch",), "numformer.interop.torch")
    import torch
    return torch


def _array(t):
    return t.detach().cpu().numpy().copy()


def _np_dtype(torch_module):
    for p in torch_module.parameters():
        return np.dtype(str(p.dtype).replace("torch.", ""))
    return np.dtype(np.float32)


# -- names ---------------------------------------------------------------------------
def torch_name(name):
    """numformer parameter name -> torch parameter name (same tensor, same layout)."""
    name = re.sub(r"(^|\.)ff\.linear", r"\1linear", name)
    name = re.sub(r"(^|\.)cross_attn\.", r"\1multihead_attn.", name)
    name = re.sub(r"(^|\.)qkv_proj\.weight$", r"\1in_proj_weight", name)
    return re.sub(r"(^|\.)qkv_proj\.bias$", r"\1in_proj_bias", name)


def _inner(module):
    return module.inner if isinstance(module, TorchAdapter) else module


def _load_from_torch(nf_module, torch_module):
    state = {name: _array(t) for name, t in torch_module.named_parameters()}
    own = {torch_name(n): p for n, p in nf_module.named_parameters()}
    if set(state) != set(own):
        raise ValueError(f"parameter names do not match: torch has {sorted(set(state) - set(own))} extra, "
                         f"numformer has {sorted(set(own) - set(state))} extra")
    for name, p in own.items():
        if state[name].shape != p.shape:
            raise ValueError(f"{name}: torch shape {state[name].shape} vs numformer {p.shape}")
        p.data = np.ascontiguousarray(state[name])


def grads_to_torch(module):
    """{torch parameter name: gradient array} in the names and layouts of the torch module's named_parameters().

    A parameter that received no gradient is reported as zeros (torch would say None).
    """
    return {torch_name(n): (np.zeros_like(p.data) if p.grad is None else p.grad)
            for n, p in _inner(module).named_parameters()}


# -- configuration of torch layers ------------------------------------------------------
def relu_squared(x):
    """max(0, x)² on a torch tensor: the activation ``to_torch`` gives a layer of activation "relu2" (torch has
    no module of its own for it); ``from_torch`` reads it back."""
    return x.relu().square()


def _activation_name(layer):
    torch = _torch()
    act = layer.activation
    if act is torch.nn.functional.relu or isinstance(act, torch.nn.ReLU):
        return "relu"
    if act is relu_squared:
        return "relu2"
    if act is torch.nn.functional.gelu:
        return "gelu"
    if isinstance(act, torch.nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    raise ValueError(f"unsupported activation {act!r}: numformer has relu, gelu, gelu (tanh) and "
                     f"numformer.interop.torch.relu_squared")


def _check_batch_first(module):
    if not getattr(module, "batch_first", False):
        raise ValueError(f"{type(module).__name__} must be built with batch_first=True "
                         f"(numformer arrays are (batch, seq, features))")


def _mha_from_torch(m, dtype):
    _check_batch_first(m)
    if not m._qkv_same_embed_dim:
        raise ValueError("MultiheadAttention with kdim/vdim different from embed_dim is not supported")
    if m.bias_k is not None or m.add_zero_attn:
        raise ValueError("MultiheadAttention with add_bias_kv or add_zero_attn is not supported")
    nf = MultiHeadAttention(m.embed_dim, m.num_heads, m.dropout, m.in_proj_bias is not None, dtype=dtype)
    _load_from_torch(nf, m)
    return nf


def _layer_config(layer):
    return dict(d_model=layer.self_attn.embed_dim, n_heads=layer.self_attn.num_heads,
                d_ff=layer.linear1.out_features, dropout=layer.dropout.p, activation=_activation_name(layer),
                norm_first=layer.norm_first, layer_norm_eps=layer.norm1.eps, bias=layer.linear1.bias is not None)


def _encoder_layer_from_torch(layer, dtype):
    _check_batch_first(layer.self_attn)
    nf = EncoderBlock(**_layer_config(layer), dtype=dtype)
    _load_from_torch(nf, layer)
    return nf


def _decoder_layer_from_torch(layer, dtype):
    _check_batch_first(layer.self_attn)
    nf = DecoderBlock(**_layer_config(layer), dtype=dtype)
    _load_from_torch(nf, layer)
    return nf


def _final_norm(norm, dtype):
    if norm is None:
        return None
    nf = LayerNorm(norm.normalized_shape[0], norm.eps, bias=norm.bias is not None, dtype=dtype)
    _load_from_torch(nf, norm)
    return nf


def _encoder_from_torch(enc, dtype):
    return Encoder([_encoder_layer_from_torch(layer, dtype) for layer in enc.layers], _final_norm(enc.norm, dtype))


def _decoder_from_torch(dec, dtype):
    return Decoder([_decoder_layer_from_torch(layer, dtype) for layer in dec.layers], _final_norm(dec.norm, dtype))


# -- adapters ----------------------------------------------------------------------------
class TorchAdapter(Module):
    """A numformer module (``inner``) called with the arguments of the torch module it mirrors."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def backward(self, dout):
        """The gradients with respect to the array inputs (see each adapter), from ``inner.backward``."""
        return self.inner.backward(dout)


def _check_causal_hint(module, flag_name, flag, mask_name, mask):
    """torch treats an is_causal flag as a hint about its mask and refuses the flag without the mask.

    The mask is what numformer applies, so the hint itself is never passed on.
    """
    if flag and mask is None:
        raise ValueError(f"{module}: {flag_name}=True needs the causal mask itself, and {mask_name} is None "
                         f"(torch raises 'Need attn_mask if specifying the is_causal hint'); pass the causal "
                         f"mask as {mask_name}, e.g. {mask_name}=np.triu(np.ones((L, S), dtype=bool), k=1) "
                         f"for L queries and S keys (True = not allowed)")


class MultiheadAttentionAdapter(TorchAdapter):
    """Called as torch.nn.MultiheadAttention: returns (attn_output, attn_weights or None).

    backward(dout) returns one gradient per distinct input array: dx when
    query, key and value are the same array; (dquery, dkey_value) when key is
    value; else (dquery, dkey, dvalue).
    """

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        _check_causal_hint("MultiheadAttention", "is_causal", is_causal, "attn_mask", attn_mask)
        mha = self.inner
        mha.record_weights = need_weights
        out = mha(query, key, value, attn_mask=attn_mask, key_padding_mask=key_padding_mask)
        weights = None
        if need_weights:
            weights = mha.last_weights.mean(axis=1) if average_attn_weights else mha.last_weights
        mha.record_weights, mha.last_weights = False, None
        return out, weights


class EncoderLayerAdapter(TorchAdapter):
    """Called as torch.nn.TransformerEncoderLayer: forward(src, src_mask, src_key_padding_mask, is_causal)."""

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        _check_causal_hint("TransformerEncoderLayer", "is_causal", is_causal, "src_mask", src_mask)
        return self.inner(src, attn_mask=src_mask, key_padding_mask=src_key_padding_mask)


class DecoderLayerAdapter(TorchAdapter):
    """Called as torch.nn.TransformerDecoderLayer; backward returns (dtgt, dmemory)."""

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        _check_causal_hint("TransformerDecoderLayer", "tgt_is_causal", tgt_is_causal, "tgt_mask", tgt_mask)
        _check_causal_hint("TransformerDecoderLayer", "memory_is_causal", memory_is_causal, "memory_mask", memory_mask)
        return self.inner(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask)


class EncoderAdapter(TorchAdapter):
    """Called as torch.nn.TransformerEncoder: forward(src, mask, src_key_padding_mask, is_causal)."""

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        _check_causal_hint("TransformerEncoder", "is_causal", is_causal, "mask", mask)
        return self.inner(src, mask=mask, key_padding_mask=src_key_padding_mask)


class DecoderAdapter(TorchAdapter):
    """Called as torch.nn.TransformerDecoder; backward returns (dtgt, dmemory)."""

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        _check_causal_hint("TransformerDecoder", "tgt_is_causal", tgt_is_causal, "tgt_mask", tgt_mask)
        _check_causal_hint("TransformerDecoder", "memory_is_causal", memory_is_causal, "memory_mask", memory_mask)
        return self.inner(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask)


class EncoderDecoder(Module):
    """An encoder stack and a decoder stack without embeddings (the body of torch.nn.Transformer)."""

    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=False, tgt_is_causal=False):
        memory = self.encoder(src, mask=src_mask, key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal)

    def backward(self, dout):
        """Returns (dsrc, dtgt)."""
        dtgt, dmemory = self.decoder.backward(dout)
        return self.encoder.backward(dmemory), dtgt


class TransformerAdapter(TorchAdapter):
    """Called as torch.nn.Transformer: forward(src, tgt, masks...) -> output; backward returns (dsrc, dtgt)."""

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        _check_causal_hint("Transformer", "src_is_causal", src_is_causal, "src_mask", src_mask)
        _check_causal_hint("Transformer", "tgt_is_causal", tgt_is_causal, "tgt_mask", tgt_mask)
        _check_causal_hint("Transformer", "memory_is_causal", memory_is_causal, "memory_mask", memory_mask)
        return self.inner(src, tgt, src_mask, tgt_mask, memory_mask, src_key_padding_mask, tgt_key_padding_mask,
                          memory_key_padding_mask)


_FROM_TORCH_KINDS = ("MultiheadAttention, TransformerEncoderLayer, TransformerDecoderLayer, TransformerEncoder, "
                     "TransformerDecoder, Transformer, TorchSeq2Seq (numformer's to_torch of a Transformer; for "
                     "your own seq2seq model: from_torch_seq2seq)")
_SEQ2SEQ_ATTRIBUTES = ("transformer", "src_emb", "tgt_emb", "out_proj", "max_len", "learned_positions", "embed_scale",
                       "src_pad_id", "tgt_pad_id")


def from_torch(module):
    """Build the equivalent numformer module from a torch.nn module, weights copied, in its dtype: for
    MultiheadAttention, TransformerEncoderLayer, TransformerDecoderLayer, TransformerEncoder, TransformerDecoder
    and Transformer an adapter called with the torch module's arguments (``MultiheadAttentionAdapter`` ...,
    ``TransformerAdapter``); for a ``TorchSeq2Seq`` (``to_torch`` of a numformer Transformer) a
    ``numformer.models.Transformer``. Any other module (or object) is a TypeError naming the modules it
    converts."""
    nn = _torch().nn
    if not isinstance(module, nn.Module):
        raise TypeError(f"from_torch converts a torch.nn.Module, got {type(module).__name__}; it converts "
                        f"{_FROM_TORCH_KINDS}")
    dtype = _np_dtype(module)
    if isinstance(module, nn.MultiheadAttention):
        return MultiheadAttentionAdapter(_mha_from_torch(module, dtype))
    if isinstance(module, nn.TransformerEncoderLayer):
        return EncoderLayerAdapter(_encoder_layer_from_torch(module, dtype))
    if isinstance(module, nn.TransformerDecoderLayer):
        return DecoderLayerAdapter(_decoder_layer_from_torch(module, dtype))
    if isinstance(module, nn.TransformerEncoder):
        return EncoderAdapter(_encoder_from_torch(module, dtype))
    if isinstance(module, nn.TransformerDecoder):
        return DecoderAdapter(_decoder_from_torch(module, dtype))
    if isinstance(module, nn.Transformer):
        _check_batch_first(module.encoder.layers[0].self_attn)
        return TransformerAdapter(EncoderDecoder(_encoder_from_torch(module.encoder, dtype),
                                                 _decoder_from_torch(module.decoder, dtype)))
    if type(module).__name__ == "TorchSeq2Seq":
        lacking = [a for a in _SEQ2SEQ_ATTRIBUTES if not hasattr(module, a)]
        if lacking:
            raise TypeError(f"from_torch does not know this TorchSeq2Seq (it lacks {lacking}); it converts "
                            f"{_FROM_TORCH_KINDS}")
        pos = {k: (None if module.learned_positions is False else getattr(module, k).weight) for k in
               ("src_pos", "tgt_pos")}
        return from_torch_seq2seq(module.transformer, module.src_emb, module.tgt_emb, module.out_proj,
                                  max_len=module.max_len, src_pos=pos["src_pos"], tgt_pos=pos["tgt_pos"],
                                  scale_embeddings=module.embed_scale != 1.0, src_pad_id=module.src_pad_id,
                                  tgt_pad_id=module.tgt_pad_id)
    raise TypeError(f"from_torch does not know {type(module).__name__}; it converts {_FROM_TORCH_KINDS}")


# -- whole encoder-decoder models --------------------------------------------------------------------------------
def from_torch_seq2seq(transformer, src_embed, tgt_embed, generator, max_len=512, src_pos=None, tgt_pos=None,
                       scale_embeddings=True, src_pad_id=None, tgt_pad_id=None):
    """numformer.models.Transformer equal to a torch seq2seq model, weights copied.

    The torch model computes ``generator(transformer(E_src[src]·s + P_src, E_tgt[tgt]·s + P_tgt,
    causal tgt_mask, padding masks))`` with s = √d_model (``scale_embeddings``) or 1:
    transformer: an ``nn.Transformer`` (batch_first=True); src_embed / tgt_embed: ``nn.Embedding``
    (the same module or weight = shared embeddings); generator: ``nn.Linear(d_model, tgt_vocab,
    bias=False)`` (its weight may be tgt_embed's: tied output). Positions: the sinusoidal table of
    "Attention Is All You Need" (sin on even, cos on odd features) when src_pos / tgt_pos are None,
    else learned tables (max_len, d_model) given as tensors or arrays. src_pad_id / tgt_pad_id: the ids
    whose positions the padding masks hide (None: no padding mask). A generator bias must be zero. dropout,
    activation, norm order and sizes come from the first encoder layer; ``final_norm`` follows the
    torch stacks (nn.Transformer has final norms; custom stacks may not).
    """
    torch = _torch()
    _check_batch_first(transformer.encoder.layers[0].self_attn)
    if getattr(generator, "bias", None) is not None and bool(torch.any(generator.bias != 0)):
        raise ValueError("the generator has a bias, and numformer's output layer has none; train the torch model "
                         "with nn.Linear(d_model, vocab, bias=False)")
    if (src_pos is None) != (tgt_pos is None):
        raise ValueError("give both src_pos and tgt_pos (learned tables) or neither (sinusoidal)")

    enc, dec = transformer.encoder, transformer.decoder
    cfg = _layer_config(enc.layers[0])
    if (enc.norm is None) != (dec.norm is None):
        raise ValueError("the encoder and decoder must both have a final norm or both lack one")
    model = Transformer(src_embed.num_embeddings, tgt_embed.num_embeddings, cfg["d_model"], cfg["n_heads"],
                        d_ff=cfg["d_ff"], dropout=cfg["dropout"], max_len=max_len, n_encoder_layers=len(enc.layers),
                        n_decoder_layers=len(dec.layers), norm_first=cfg["norm_first"], activation=cfg["activation"],
                        positional="sinusoidal" if src_pos is None else "learned",
                        share_embeddings=src_embed.weight is tgt_embed.weight,
                        tie_output=generator.weight is tgt_embed.weight, src_pad_id=src_pad_id, tgt_pad_id=tgt_pad_id,
                        final_norm=enc.norm is not None, bias=cfg["bias"], layer_norm_eps=cfg["layer_norm_eps"],
                        scale_embeddings=scale_embeddings, dtype=_np_dtype(transformer))
    model.encoder, model.decoder = _encoder_from_torch(enc, model.dtype), _decoder_from_torch(dec, model.dtype)
    arrays = {"src_emb.weight": src_embed.weight, "tgt_emb.weight": tgt_embed.weight, "out_proj.weight": generator.weight,
              "src_pos.weight": src_pos, "tgt_pos.weight": tgt_pos}
    for name, p in model.named_parameters():
        if name in arrays:
            a = arrays[name]
            a = _array(a) if hasattr(a, "detach") else np.array(a, dtype=model.dtype)
            if a.shape != p.shape:
                raise ValueError(f"{name}: torch shape {a.shape} vs numformer {p.shape}")
            p.data = np.ascontiguousarray(a, dtype=model.dtype)
    return model


def _seq2seq_torch_name(name):
    """numformer.Transformer parameter name -> TorchSeq2Seq parameter name."""
    name = torch_name(name)
    return "transformer." + name if name.startswith(("encoder.", "decoder.")) else name


def _torch_seq2seq(model):
    """The TorchSeq2Seq equivalent of a numformer Transformer (weights copied in ``to_torch``)."""
    torch = _torch()
    nn = torch.nn

    if getattr(model.encoder.layers[0].self_attn.qkv_proj, "bias", None) is None and \
            model.encoder.layers[0].ff.linear1.bias is not None:
        raise ValueError("torch layers have one bias switch; this model has attention without biases "
                         "(attn_bias = false) but feed-forward biases")
    enc, dec = to_torch(model.encoder), to_torch(model.decoder)
    first = model.encoder.layers[0]
    transformer = nn.Transformer(first.d_model, first.n_heads, len(enc.layers), len(dec.layers), first.d_ff,
                                 first.self_attn.dropout_p, batch_first=True, norm_first=first.norm_first,
                                 custom_encoder=enc, custom_decoder=dec)
    learned = not isinstance(model.src_pos, SinusoidalPositionalEncoding)
    return TorchSeq2Seq(model.src_vocab_size, model.tgt_vocab_size, transformer, model.max_len, learned,
                        model.embed_scale, model.src_pad_id, model.tgt_pad_id, model.src_drop.p,
                        share_embeddings=model.tgt_emb.weight is model.src_emb.weight,
                        tie_output=model.out_proj.weight is model.tgt_emb.weight)


def _make_torch_seq2seq_class():
    nn = _torch().nn

    class TorchSeq2Seq(nn.Module):
        """numformer.models.Transformer in torch: embeddings (·√d_model) + positions -> nn.Transformer
        (causal target mask, padding masks from the pad ids) -> output layer without bias.

        forward(src (B, S), tgt (B, T)) -> logits (B, T, tgt_vocab). Parameter names:
        src_emb, tgt_emb, src_pos / tgt_pos (learned tables; sinusoidal ones are buffers),
        transformer.*, out_proj.
        """

        def __init__(self, src_vocab, tgt_vocab, transformer, max_len, learned_positions, embed_scale,
                     src_pad_id=None, tgt_pad_id=None, dropout=0.0, share_embeddings=False, tie_output=False):
            super().__init__()

            torch = _torch()
            d = transformer.d_model
            self.max_len, self.learned_positions, self.embed_scale = max_len, learned_positions, embed_scale
            self.src_pad_id, self.tgt_pad_id = src_pad_id, tgt_pad_id
            self.src_emb = nn.Embedding(src_vocab, d)
            self.tgt_emb = nn.Embedding(tgt_vocab, d)
            if share_embeddings:
                self.tgt_emb.weight = self.src_emb.weight
            if learned_positions:
                self.src_pos, self.tgt_pos = nn.Embedding(max_len, d), nn.Embedding(max_len, d)
            else:
                # float64; .to() casts it
                self.register_buffer("pos_table", torch.from_numpy(sinusoidal_table(max_len, d)))
            self.drop = nn.Dropout(dropout)
            self.transformer = transformer
            self.out_proj = nn.Linear(d, tgt_vocab, bias=False)
            if tie_output:
                self.out_proj.weight = self.tgt_emb.weight

        def _embed(self, ids, emb, pos):
            T = ids.shape[1]
            table = pos.weight[:T] if self.learned_positions else self.pos_table[:T].to(emb.weight.dtype)
            return self.drop(emb(ids) * self.embed_scale + table)

        def forward(self, src, tgt):
            torch = _torch()
            src_kpm = None if self.src_pad_id is None else src == self.src_pad_id
            tgt_kpm = None if self.tgt_pad_id is None else tgt == self.tgt_pad_id
            T = tgt.shape[1]
            causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            out = self.transformer(self._embed(src, self.src_emb, getattr(self, "src_pos", None)),
                                   self._embed(tgt, self.tgt_emb, getattr(self, "tgt_pos", None)),
                                   tgt_mask=causal, src_key_padding_mask=src_kpm, tgt_key_padding_mask=tgt_kpm,
                                   memory_key_padding_mask=src_kpm, tgt_is_causal=True)
            return self.out_proj(out)

    return TorchSeq2Seq


def TorchSeq2Seq(*args, **kwargs):  # noqa: N802 - builds the torch class on first use (torch imported lazily)
    """A torch ``nn.Module``, numformer.models.Transformer in torch: ``TorchSeq2Seq(src_vocab, tgt_vocab,
    transformer, max_len, learned_positions, embed_scale, src_pad_id=None, tgt_pad_id=None, dropout=0.0,
    share_embeddings=False, tie_output=False)``, ``transformer`` an ``nn.Transformer`` (batch_first=True).
    forward(src (B, S), tgt (B, T)) -> logits (B, T, tgt_vocab), with the causal target mask and the padding
    masks of the pad ids. ``to_torch`` of a Transformer builds one, ``from_torch`` converts it back."""
    global _TORCH_SEQ2SEQ
    if _TORCH_SEQ2SEQ is None:
        _TORCH_SEQ2SEQ = _make_torch_seq2seq_class()
    return _TORCH_SEQ2SEQ(*args, **kwargs)


_TORCH_SEQ2SEQ = None


# -- back to torch -----------------------------------------------------------------------------
def _torch_layer(block, cls):
    torch = _torch()
    act = {"relu": "relu", "relu2": relu_squared, "gelu": "gelu",
           "gelu_tanh": torch.nn.GELU(approximate="tanh")}[block.activation]
    if block.norm_kind != "layer":
        raise ValueError(f"torch layers use LayerNorm; this block uses {block.norm_kind!r}")
    return cls(block.d_model, block.n_heads, block.d_ff, block.self_attn.dropout_p, act,
               layer_norm_eps=block.norm1.eps, batch_first=True, norm_first=block.norm_first,
               bias=block.ff.linear1.bias is not None)


def _torch_norm(norm):
    if norm is None:
        return None
    return _torch().nn.LayerNorm(norm.d, eps=norm.eps, bias=norm.bias is not None)


def to_torch(module):
    """The torch.nn module equivalent to a numformer module (or adapter), weights copied, in its dtype:
    MultiHeadAttention -> nn.MultiheadAttention, EncoderBlock / DecoderBlock -> nn.TransformerEncoderLayer /
    nn.TransformerDecoderLayer, Encoder / Decoder -> nn.TransformerEncoder / nn.TransformerDecoder,
    ``EncoderDecoder`` -> nn.Transformer, numformer.models.Transformer -> ``TorchSeq2Seq`` (all batch_first).
    Blocks must use LayerNorm (a ValueError otherwise); any other module is a TypeError."""
    torch = _torch()
    nn = torch.nn
    m = _inner(module)
    name = torch_name
    if isinstance(m, Transformer):
        out, name = _torch_seq2seq(m), _seq2seq_torch_name
    elif isinstance(m, MultiHeadAttention):
        out = nn.MultiheadAttention(m.d_model, m.n_heads, dropout=m.dropout_p, bias=m.qkv_proj.bias is not None,
                                    batch_first=True)
    elif isinstance(m, EncoderBlock):
        out = _torch_layer(m, nn.TransformerEncoderLayer)
    elif isinstance(m, DecoderBlock):
        out = _torch_layer(m, nn.TransformerDecoderLayer)
    elif isinstance(m, Encoder):
        out = nn.TransformerEncoder(_torch_layer(m.layers[0], nn.TransformerEncoderLayer), len(m.layers),
                                    norm=_torch_norm(m.norm), enable_nested_tensor=False)
    elif isinstance(m, Decoder):
        out = nn.TransformerDecoder(_torch_layer(m.layers[0], nn.TransformerDecoderLayer), len(m.layers),
                                    norm=_torch_norm(m.norm))
    elif isinstance(m, EncoderDecoder):
        enc, dec = m.encoder, m.decoder
        first = enc.layers[0]
        # nn.Transformer re-initializes custom stacks, so the weights are loaded below, after construction.
        out = nn.Transformer(first.d_model, first.n_heads, len(enc.layers), len(dec.layers), first.d_ff,
                             first.self_attn.dropout_p, batch_first=True, norm_first=first.norm_first,
                             custom_encoder=to_torch(enc), custom_decoder=to_torch(dec))
    else:
        raise TypeError(f"to_torch does not know {type(m).__name__}")
    dtype = getattr(torch, str(m.dtype))
    out = out.to(dtype)
    params = dict(out.named_parameters())           # deduplicated, as numformer's: tied weights appear once
    state = {name(n): p.data for n, p in m.named_parameters()}
    if set(state) != set(params):
        raise ValueError(f"parameter names do not match: numformer gives {sorted(set(state) - set(params))}, "
                         f"torch has {sorted(set(params) - set(state))}")
    with torch.no_grad():
        for n, a in state.items():
            params[n].copy_(torch.from_numpy(np.ascontiguousarray(a)))
    return out
