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

from ..nn import Decoder, DecoderBlock, Encoder, EncoderBlock, LayerNorm, Module, MultiHeadAttention


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("numformer.interop.torch needs PyTorch: pip install torch==2.13.0") from e
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
def _activation_name(layer):
    torch = _torch()
    act = layer.activation
    if act is torch.nn.functional.relu or isinstance(act, torch.nn.ReLU):
        return "relu"
    if act is torch.nn.functional.gelu:
        return "gelu"
    if isinstance(act, torch.nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    raise ValueError(f"unsupported activation {act!r}: numformer has relu, gelu and gelu (tanh)")


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


def from_torch(module):
    """Build the equivalent numformer module from a torch.nn module, weights copied, in its dtype."""
    nn = _torch().nn
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
    raise TypeError(f"from_torch does not know {type(module).__name__}; supported: MultiheadAttention, "
                    "TransformerEncoderLayer, TransformerDecoderLayer, TransformerEncoder, TransformerDecoder, "
                    "Transformer")


# -- back to torch -----------------------------------------------------------------------------
def _torch_layer(block, cls):
    torch = _torch()
    act = {"relu": "relu", "gelu": "gelu", "gelu_tanh": torch.nn.GELU(approximate="tanh")}[block.activation]
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
    """The torch.nn module equivalent to a numformer module (or adapter), weights copied, in its dtype."""
    torch = _torch()
    nn = torch.nn
    m = _inner(module)
    if isinstance(m, MultiHeadAttention):
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
    state = {torch_name(n): torch.from_numpy(np.ascontiguousarray(p.data)) for n, p in m.named_parameters()}
    out.load_state_dict(state, strict=True)
    return out
