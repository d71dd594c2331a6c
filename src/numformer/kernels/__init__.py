"""The speed path: fast kernels beside the reference ops.

Each module here mirrors the module of ``numformer.ops`` it speeds up and keeps its function names
(``kernels.normalization.layer_norm_forward`` is the fast ``ops.layer_norm_forward``); each starts by naming
the reference it computes and is tested against it (tests/test_kernels.py, tests/test_flash_attention.py).
What makes them fast: rows split across numformer's threads (``_runtime.parallel_for``), products split or
paired on the BLAS (``_runtime.matmul``, ``matmul_pair``), row sums as BLAS products, chunked float32 GELU,
SiLU and the SwiGLU gate in place, rotary tables cached, and attention computed fused with an in-place
softmax (``fused_attention``) or block by block (``flash_attention``).

Read ``numformer.ops`` first. The modules of ``numformer.nn`` pick one or the other in one table
(``numformer.nn.dispatch``); ``numformer.reference_mode()`` switches a whole model to the references.
"""
from .activations import (gelu_backward, gelu_forward, relu_backward, relu_forward, relu_squared_backward,
                          relu_squared_forward)
from .embedding import embedding_backward, embedding_forward
from .fast_gelu import gelu_erf_f32
from .flash_attention import flash_attention_backward, flash_attention_forward
from .fused_attention import fused_attention_backward, fused_attention_forward
from .linear import linear_backward, linear_forward
from .normalization import layer_norm_backward, layer_norm_forward, rms_norm_backward, rms_norm_forward
from .rotary import rope_backward, rope_forward
from .swiglu import silu_backward, silu_forward, silu_gate_backward, silu_gate_forward

__all__ = [name for name in dir() if not name.startswith("_")]
