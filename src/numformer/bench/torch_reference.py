"""PyTorch models with numformer's architectures, used only to compare training speed.

``TorchGPT`` mirrors ``numformer.GPT`` (token + learned/sinusoidal positions,
pre- or post-LN blocks with a fused QKV projection, GELU/ReLU feed-forward,
final norm, tied output layer) and ``TorchEncoderClassifier`` mirrors
``numformer.EncoderClassifier`` (scaled embeddings, sinusoidal positions,
encoder blocks with a key-padding mask, mean or first-token pooling, linear
head). The parameter names are numformer's, so ``from_numformer(model)`` copies
the weights one to one and both compute the same loss (tested in
``tests/test_bench_throughput.py``). Attention is
``torch.nn.functional.scaled_dot_product_attention``, the fused kernel that
nanoGPT uses, so the reference is PyTorch eager at its best.

PyTorch is imported at this module's top: numformer imports it only where it compares with PyTorch or
converts to and from it (this module, the benchmark parts that time PyTorch or transformers,
``interop.torch``, the speedrun's PyTorch anchor ``experiments/_torch_anchor.py``).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..interop.torch import relu_squared
from ..models import EncoderClassifier, GPT
from ..nn.positional import sinusoidal_table


def _norm(kind, d, eps, bias):
    if kind == "layer":
        return nn.LayerNorm(d, eps=eps, bias=bias)
    if kind == "rms":
        return nn.RMSNorm(d, eps=eps)
    raise ValueError(f"the PyTorch reference supports 'layer' and 'rms' norms, not {kind!r}")


class _SelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, bias):
        super().__init__()
        self.n_heads = n_heads
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, attn_mask=None, is_causal=False):
        B, T, E = x.shape
        q, k, v = self.qkv_proj(x).view(B, T, 3, self.n_heads, E // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, E))


class _FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, activation, bias):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "gelu_tanh": nn.GELU(approximate="tanh"),
                    "relu2": relu_squared}[activation]

    def forward(self, x):
        return self.linear2(self.act(self.linear1(x)))


class _Block(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, activation, norm_first, norm, eps, bias, attn_bias, dropout):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = _SelfAttention(d_model, n_heads, attn_bias)
        self.ff = _FeedForward(d_model, d_ff, activation, bias)
        self.norm1 = _norm(norm, d_model, eps, bias)
        self.norm2 = _norm(norm, d_model, eps, bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, attn_mask=None, is_causal=False):
        if self.norm_first:
            x = x + self.drop(self.self_attn(self.norm1(x), attn_mask, is_causal))
            return x + self.drop(self.ff(self.norm2(x)))
        x = self.norm1(x + self.drop(self.self_attn(x, attn_mask, is_causal)))
        return self.norm2(x + self.drop(self.ff(x)))


def _sinusoidal(max_len, d_model):
    return torch.tensor(sinusoidal_table(max_len, d_model), dtype=torch.float32)


class _TokensAndPositions(nn.Module):
    """The token embedding, numformer's learned or sinusoidal positions and the dropout after them."""

    def _add_embeddings(self, vocab_size, length, d_model, positional, dropout):
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.positional = positional
        if positional == "learned":
            self.pos_emb = nn.Embedding(length, d_model)
        else:
            self.register_buffer("pos_table", _sinusoidal(length, d_model), persistent=False)
        self.drop = nn.Dropout(dropout)

    def _positions(self, T):
        return self.pos_emb.weight[:T] if self.positional == "learned" else self.pos_table[:T]


class TorchGPT(_TokensAndPositions):
    """numformer.GPT in PyTorch: forward(idx (B, T)) -> logits (B, T, vocab)."""

    def __init__(self, vocab_size, block_size, n_layers=4, n_heads=4, d_model=128, d_ff=None, dropout=0.0,
                 positional="learned", activation="gelu", norm_first=True, norm="layer", tie_weights=True,
                 bias=True, layer_norm_eps=1e-5):
        super().__init__()
        d_ff = 4 * d_model if d_ff is None else d_ff
        self._add_embeddings(vocab_size, block_size, d_model, positional, dropout)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads, d_ff, activation, norm_first, norm, layer_norm_eps,
                                           bias, bias, dropout) for _ in range(n_layers))
        self.norm_f = _norm(norm, d_model, layer_norm_eps, bias) if norm_first else None
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    def forward(self, idx):
        T = idx.shape[1]
        x = self.drop(self.tok_emb(idx) + self._positions(T))
        for block in self.blocks:
            x = block(x, is_causal=True)
        if self.norm_f is not None:
            x = self.norm_f(x)
        return self.lm_head(x)


class TorchEncoderClassifier(_TokensAndPositions):
    """numformer.EncoderClassifier in PyTorch: forward(ids (B, T)) -> logits (B, n_classes)."""

    def __init__(self, vocab_size, n_classes, max_len=512, d_model=64, n_heads=1, n_layers=1, d_ff=None,
                 dropout=0.1, pooling="mean", positional="sinusoidal", activation="relu", norm_first=False,
                 norm="layer", pad_id=0, scale_embeddings=True, bias=True, layer_norm_eps=1e-5):
        super().__init__()
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.pooling, self.pad_id = pooling, pad_id
        self.embed_scale = math.sqrt(d_model) if scale_embeddings else 1.0
        self._add_embeddings(vocab_size, max_len, d_model, positional, dropout)
        self.layers = nn.ModuleList(_Block(d_model, n_heads, d_ff, activation, norm_first, norm, layer_norm_eps,
                                           bias, bias, dropout) for _ in range(n_layers))
        self.norm = _norm(norm, d_model, layer_norm_eps, bias) if norm_first else None
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.drop(self.tok_emb(ids) * self.embed_scale + self._positions(T))
        keep = None if self.pad_id is None else ids != self.pad_id                  # (B, T), True = real token
        mask = None if keep is None else keep[:, None, None, :]                     # SDPA: True = may attend
        for layer in self.layers:
            x = layer(x, attn_mask=mask)
        if self.norm is not None:
            x = self.norm(x)
        if self.pooling == "first":
            return self.head(self.drop(x[:, 0]))
        w = torch.ones(ids.shape, dtype=x.dtype) if keep is None else keep.to(x.dtype)
        w = w / w.sum(dim=1, keepdim=True).clamp(min=1.0)
        return self.head(self.drop(torch.einsum("btd,bt->bd", x, w)))


def _torch_name(model, name):
    """numformer parameter name -> the reference's name (they differ only in the classifier's encoder stack)."""
    if isinstance(model, TorchEncoderClassifier):
        name = name.replace("encoder.layers.", "layers.").replace("encoder.norm.", "norm.")
    return name


def from_numformer(model):
    """A float32 PyTorch reference with the architecture and the weights of a numformer GPT or EncoderClassifier."""
    if isinstance(model, GPT):
        block = model.blocks[0]
        ref = TorchGPT(model.vocab_size, model.block_size, model.n_layers, model.n_heads, model.d_model,
                       model.d_ff, model.drop.p, "learned" if hasattr(model.pos_emb, "weight") else "sinusoidal",
                       block.activation, block.norm_first, block.norm_kind, model.tie_weights,
                       block.ff.linear1.bias is not None, getattr(block.norm1, "eps", 1e-5))
    elif isinstance(model, EncoderClassifier):
        layers = list(model.encoder.layers)
        block = layers[0]
        ref = TorchEncoderClassifier(
            model.vocab_size, model.n_classes, model.max_len, model.d_model, block.n_heads, len(layers), block.d_ff,
            model.drop.p, model.pooling, "learned" if hasattr(model.pos_emb, "weight") else "sinusoidal",
            block.activation, block.norm_first, block.norm_kind, model.pad_id, model.embed_scale != 1.0,
            block.ff.linear1.bias is not None, getattr(block.norm1, "eps", 1e-5))
    else:
        raise TypeError(f"no PyTorch reference for {type(model).__name__}; use GPT or EncoderClassifier")
    load_numformer_weights(ref, model)
    return ref


def load_numformer_weights(ref, model):
    """Copy every numformer parameter into the reference (names must match one to one)."""
    own = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        tname = _torch_name(ref, name)
        if tname not in own:
            raise KeyError(f"the PyTorch reference has no parameter {tname!r} (numformer {name!r})")
        with torch.no_grad():
            own[tname].copy_(torch.from_numpy(np.ascontiguousarray(p.data, dtype=np.float32)))
    return ref


def adamw_param_groups(module, weight_decay):
    """nanoGPT's grouping: weight decay on matrices (ndim >= 2), none on biases and norm gains."""
    params = [p for p in module.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
