"""Pure forward/backward pairs on NumPy arrays.

Convention (llm.c / CS231n style)::

    y, cache = op_forward(x, params...)
    dx, dparams... = op_backward(dy, cache)

No hidden state and no globals: the cache holds exactly what backward needs.

These are the references: plain NumPy that reads as the formula in each
docstring, no threads and no preallocated buffers. The speed path sits beside
them in ``numformer.kernels`` (same module and function names: e.g.
``kernels.normalization.layer_norm_forward`` is the fast
``ops.layer_norm_forward``), each kernel tested against its reference here.
The modules in ``numformer.nn`` run the kernels; ``numformer.reference_mode()``
runs them on these references instead.
"""
from .alibi import alibi_backward, alibi_bias, alibi_forward, alibi_slopes
from .activations import (gelu_backward, gelu_erf, gelu_forward, gelu_tanh, log_softmax_backward, log_softmax_forward,
                          relu_backward, relu_forward, relu_squared_backward, relu_squared_forward,
                          softmax_backward, softmax_forward)
from .attention import (causal_mask, scaled_dot_product_attention_backward,
                        scaled_dot_product_attention_forward)
from .dropout import dropout_backward, dropout_forward
from .embedding import embedding_backward, embedding_forward
from .grouped_query import check_kv_heads, repeat_kv_backward, repeat_kv_forward
from .heads import merge_heads_backward, merge_heads_forward, split_heads_backward, split_heads_forward
from .linear import linear_backward, linear_forward
from .lora import lora_backward, lora_forward
from .loss import cross_entropy_backward, cross_entropy_forward
from .normalization import (batch_norm_backward, batch_norm_forward, layer_norm_backward, layer_norm_forward,
                            rms_norm_backward, rms_norm_forward)
from .preference import (dpo_loss_backward, dpo_loss_forward, dpo_reward_accuracy, sequence_logprob_backward,
                         sequence_logprob_forward)
from .rope_scaling import RopeScaling, rope_inverse_frequencies
from .rotary import rope_angles, rope_backward, rope_forward, rotate_half
from .softcap import softcap_backward, softcap_forward
from .special import erf
from .swiglu import (gelu_gate_backward, gelu_gate_forward, silu_backward, silu_forward, silu_gate_backward,
                     silu_gate_forward, swiglu_backward, swiglu_forward)

__all__ = [name for name in dir() if not name.startswith("_")]
