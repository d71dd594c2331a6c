"""Stateful modules built on the ops (``numformer.kernels``, or the references of ``numformer.ops`` inside
``numformer.reference_mode()``, see ``nn.dispatch``); each has ``forward`` and a hand-written ``backward``."""
from .attention import KVCache, MultiHeadAttention, QKVProjection, build_attention_mask
from .dispatch import reference_mode
from .blocks import BlockConfig, Decoder, DecoderBlock, Encoder, EncoderBlock
from .layers import (ACTIVATIONS, Activation, BatchStatNorm, Dropout, Embedding, FeedForward, GatedFeedForward,
                     LayerNorm, Linear, RMSNorm, SwiGLUFeedForward, make_feed_forward, make_norm)
from .module import Module, ModuleList, Parameter
from .positional import (LearnedPositionalEncoding, PositionsInAttention, SinusoidalPositionalEncoding, make_positional,
                         sinusoidal_table)

__all__ = [name for name in dir() if not name.startswith("_")]
