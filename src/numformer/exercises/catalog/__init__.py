"""The exercises, one module each: its ``EXERCISE`` (an ``exercises.checker.Exercise``).

Adding an exercise is one module here (the op's name, the docstrings of the stub, the inputs that grade it,
the hints) and one line in ``EXERCISES`` below: its place in ``numformer exercises list``.
"""
from __future__ import annotations

from . import (adamw, bpe_merge, cross_entropy, dropout, embedding, gelu, layer_norm, linear, log_softmax, lora,
               merge_heads, relu_squared, repeat_kv, rms_norm, rope, scaled_dot_product_attention, softmax,
               split_heads, swiglu)

# in the order of the tutorials: tutorial 1-2 (attention, backpropagation), 4 (the optimizer), 9 (BPE),
# 12 (Llama), 13 (LoRA)
EXERCISES = {e.name: e for e in (
    softmax.EXERCISE,
    log_softmax.EXERCISE,
    linear.EXERCISE,
    embedding.EXERCISE,
    gelu.EXERCISE,
    relu_squared.EXERCISE,
    layer_norm.EXERCISE,
    dropout.EXERCISE,
    cross_entropy.EXERCISE,
    scaled_dot_product_attention.EXERCISE,
    split_heads.EXERCISE,
    merge_heads.EXERCISE,
    adamw.EXERCISE,
    bpe_merge.EXERCISE,
    rms_norm.EXERCISE,
    swiglu.EXERCISE,
    rope.EXERCISE,
    repeat_kv.EXERCISE,
    lora.EXERCISE,
)}
