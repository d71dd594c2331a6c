"""Which implementation of each op the modules run: one table, one switch.

Every module of ``numformer.nn`` calls its ops through ``F`` (``F.layer_norm_forward(x, γ, β)``), which looks
the name up in ``OPS``: the speed path (``numformer.kernels``) by default, the reference (``numformer.ops``)
inside ``reference_mode()``. Both paths compute the same function; tests/test_kernels.py checks each kernel
against its reference and whole models trained on both.

Attention has three kernels, listed in ``ATTENTION`` with what each computes: the reference
(``ops.attention``: everything, dropout and soft-capped scores included), the fused kernel
(``kernels.fused_attention``: no dropout, no soft-cap) and the memory-efficient one
(``kernels.flash_attention``: no dropout, no soft-cap, no weights to record). ``attention_kernel`` picks
the fastest one that computes what a call asks for, falling back to the reference, and the reference
always inside ``reference_mode()``.

    with numformer.reference_mode():
        loss = train_step(model, batch)         # every op of the model is the plain NumPy reference

Switch between steps, not between a forward pass and its backward (each path's cache is its own).

``using_ops({name: function, ...})`` puts other functions in the table for the length of a block, whichever
path is selected (``numformer exercises train`` runs a learner's own ops this way). Attention's reference
kernel (``ATTENTION["reference"]``) calls ``F.scaled_dot_product_attention_forward/backward``, so it is one
of them.
"""
from __future__ import annotations

import contextlib
from typing import Callable, NamedTuple

import numpy as np

from .. import kernels, ops


def _embedding_backward_into(dy, cache, out):
    """The reference scatter added into an existing gradient (tied weights), as the kernel's ``out=``."""
    out += ops.embedding_backward(dy, cache)
    return out


#  name                        reference (numformer.ops)      speed path (numformer.kernels)
OPS = {
    "linear_forward":          (ops.linear_forward,           kernels.linear_forward),
    "linear_backward":         (ops.linear_backward,          kernels.linear_backward),
    "embedding_forward":       (ops.embedding_forward,        kernels.embedding_forward),
    "embedding_backward":      (ops.embedding_backward,       kernels.embedding_backward),
    "embedding_backward_into": (_embedding_backward_into,     kernels.embedding_backward),
    "layer_norm_forward":      (ops.layer_norm_forward,       kernels.layer_norm_forward),
    "layer_norm_backward":     (ops.layer_norm_backward,      kernels.layer_norm_backward),
    "rms_norm_forward":        (ops.rms_norm_forward,         kernels.rms_norm_forward),
    "rms_norm_backward":       (ops.rms_norm_backward,        kernels.rms_norm_backward),
    "batch_norm_forward":      (ops.batch_norm_forward,       ops.batch_norm_forward),
    "batch_norm_backward":     (ops.batch_norm_backward,      ops.batch_norm_backward),
    "relu_forward":            (ops.relu_forward,             kernels.relu_forward),
    "relu_backward":           (ops.relu_backward,            kernels.relu_backward),
    "relu_squared_forward":    (ops.relu_squared_forward,     kernels.relu_squared_forward),
    "relu_squared_backward":   (ops.relu_squared_backward,    kernels.relu_squared_backward),
    "gelu_forward":            (ops.gelu_forward,             kernels.gelu_forward),
    "gelu_backward":           (ops.gelu_backward,            kernels.gelu_backward),
    "silu_forward":            (ops.silu_forward,             kernels.silu_forward),
    "silu_backward":           (ops.silu_backward,            kernels.silu_backward),
    "silu_gate_forward":       (ops.silu_gate_forward,        kernels.silu_gate_forward),
    "silu_gate_backward":      (ops.silu_gate_backward,       kernels.silu_gate_backward),
    "gelu_gate_forward":       (ops.gelu_gate_forward,        ops.gelu_gate_forward),
    "gelu_gate_backward":      (ops.gelu_gate_backward,       ops.gelu_gate_backward),
    "softcap_forward":         (ops.softcap_forward,          ops.softcap_forward),
    "softcap_backward":        (ops.softcap_backward,         ops.softcap_backward),
    "dropout_forward":         (ops.dropout_forward,          ops.dropout_forward),
    "dropout_backward":        (ops.dropout_backward,         ops.dropout_backward),
    "rope_forward":            (ops.rope_forward,             kernels.rope_forward),
    "rope_backward":           (ops.rope_backward,            kernels.rope_backward),
    "repeat_kv_forward":       (ops.repeat_kv_forward,        ops.repeat_kv_forward),
    "repeat_kv_backward":      (ops.repeat_kv_backward,       ops.repeat_kv_backward),
    # the reference attention kernel (ATTENTION["reference"] below); its fast kernels are chosen there
    "scaled_dot_product_attention_forward":  (ops.scaled_dot_product_attention_forward,
                                              ops.scaled_dot_product_attention_forward),
    "scaled_dot_product_attention_backward": (ops.scaled_dot_product_attention_backward,
                                              ops.scaled_dot_product_attention_backward),
}

_use_reference = False
_installed = {}         # name -> function, put in the table by using_ops()


def using_reference():
    """True inside ``reference_mode()``: the modules run the reference ops."""
    return _use_reference


@contextlib.contextmanager
def reference_mode(enabled=True):
    """Run every module of ``numformer.nn`` on the reference ops of ``numformer.ops`` inside the block
    (``enabled=False``: on the kernels); the previous setting is restored on leaving."""
    global _use_reference
    before = _use_reference
    _use_reference = bool(enabled)
    try:
        yield
    finally:
        _use_reference = before


@contextlib.contextmanager
def using_ops(functions):
    """Inside the block, ``F.name`` is ``functions[name]`` for each name given (the other names as before);
    the table is restored on leaving. Every name must be a name of ``OPS``."""
    global _installed
    unknown = sorted(set(functions) - set(OPS))
    if unknown:
        raise ValueError(f"no op {unknown[0]!r} in numformer.nn.dispatch.OPS; choose among {sorted(OPS)}")
    before = _installed
    _installed = {**before, **functions}
    try:
        yield
    finally:
        _installed = before


class _Table:
    """``F.name`` is the function ``using_ops`` installed under that name, else ``OPS[name]``'s reference or
    kernel, whichever the switch selects at the call."""

    def __getattr__(self, name):
        if name in _installed:
            return _installed[name]
        try:
            pair = OPS[name]
        except KeyError:
            raise AttributeError(f"no op {name!r} in numformer.nn.dispatch.OPS") from None
        return pair[0] if _use_reference else pair[1]


F = _Table()


# -- attention ------------------------------------------------------------------------------------------------
# Each kernel is a pair. forward(layer, q, k, v, masks, p_drop, out) writes the context (B, H, Tq, d_head) into
# ``out`` and returns (weights or None, cache); backward(dctx, cache, dq, dk, dv) writes the gradients into the
# given (B, H, T, d_head) arrays. A ``grouped`` kernel takes k, v (and writes dk, dv) with the layer's
# n_kv_heads heads, each serving n_heads / n_kv_heads query heads; the others get them repeated to n_heads.
# ``layer`` (a MultiHeadAttention) gives the scale, the soft-cap, the dropout
# generator and the flash block sizes; ``masks`` (its ``Masks``) the masks in the module convention, which each
# forward turns into its kernel's.

def _reference_forward(layer, q, k, v, masks, p_drop, out):
    """ops.attention: the reference, the only kernel with attention dropout and soft-capped scores."""
    mask, causal = masks.additive(q, k)
    ctx, weights, cache = F.scaled_dot_product_attention_forward(
        q, k, v, attn_mask=mask, is_causal=causal, scale=layer.scale, dropout_p=p_drop, rng=layer.rng,
        need_weights=layer.record_weights, softcap=layer.attn_logit_softcap)
    out[...] = ctx
    return weights, cache


def _reference_backward(dctx, cache):
    """ops.attention's backward, through the table like its forward (``using_ops`` may replace both)."""
    return F.scaled_dot_product_attention_backward(dctx, cache)


def _fused_forward(layer, q, k, v, masks, p_drop, out):
    """kernels.fused_attention: the fast version of the reference (no dropout, no soft-cap)."""
    mask, causal = masks.additive(q, k)
    _, cache = kernels.fused_attention_forward(q, k, v, mask, causal, scale=layer.scale, out=out)
    return (np.swapaxes(cache.weights_t, -1, -2) if layer.record_weights else None), cache


def _flash_forward(layer, q, k, v, masks, p_drop, out):
    """kernels.flash_attention: memory linear in the sequence length (no dropout, no soft-cap, no weights). The
    module masks (bool True = blocked) become functional ones (True = may attend) without building a (Tq, Tk)
    mask."""
    mask, key_mask = masks.attn_mask, masks.key_padding_mask
    mask = ~mask if mask is not None and mask.dtype == bool else mask
    key_mask = ~key_mask if key_mask is not None and key_mask.dtype == bool else key_mask
    ctx, cache = kernels.flash_attention_forward(q, k, v, attn_mask=mask, is_causal=masks.is_causal,
                                                 key_mask=key_mask, scale=layer.scale,
                                                 causal_offset=masks.causal_offset, block_q=layer.flash_block_q,
                                                 block_k=layer.flash_block_k, alibi_slopes=masks.alibi_slopes)
    out[...] = ctx
    return None, cache


def _writing(backward):
    """A kernel backward that returns (dq, dk, dv), as one that writes them into the given arrays."""
    def write(dctx, cache, dq, dk, dv):
        for target, g in zip((dq, dk, dv), backward(dctx, cache)):
            target[...] = g
    return write


class AttentionKernel(NamedTuple):
    """One attention kernel: its forward and backward (see above) and what it computes."""
    forward: Callable
    backward: Callable
    dropout: bool          # attention dropout
    softcap: bool          # soft-capped scores
    weights: bool          # the attention weights, for ``record_weights``
    grouped: bool = False  # takes k, v with their n_kv_heads heads (grouped-query attention), dk, dv likewise


#  name          forward             backward                                    dropout softcap weights grouped
ATTENTION = {
    "reference": AttentionKernel(_reference_forward, _writing(_reference_backward), True, True, True, False),
    "fused":     AttentionKernel(_fused_forward, kernels.fused_attention_backward, False, False, True, True),
    "flash":     AttentionKernel(_flash_forward, _writing(kernels.flash_attention_backward), False, False, False,
                                 False),
}


def attention_kernel(attention, p_drop=0.0, need_weights=False, softcap=None):
    """The entry of ``ATTENTION`` that computes a call of a module built with ``attention`` ("plain" or
    "flash") with attention dropout ``p_drop``, recorded weights or not, soft-capped scores or not: the
    reference inside ``reference_mode()``; else, in order of preference ("flash" first when asked for, then
    "fused"), the first kernel that computes all of it; else the reference. Asking "flash" for attention
    dropout, with neither recorded weights nor a soft-cap, is an error (a model trained with it would
    silently not drop)."""
    if _use_reference:
        return "reference"
    if attention == "flash" and p_drop > 0.0 and not need_weights and softcap is None:
        raise ValueError(f"attention='flash' has no attention dropout (dropout={p_drop}); set dropout = 0 "
                         f"(a model's dropout also drops attention weights), call .eval() for inference, "
                         f"or use attention='plain'")
    for name in (("flash", "fused") if attention == "flash" else ("fused",)):
        kernel = ATTENTION[name]
        if (kernel.dropout or p_drop == 0.0) and (kernel.softcap or softcap is None) and \
                (kernel.weights or not need_weights):
            return name
    return "reference"


__all__ = ["OPS", "F", "ATTENTION", "AttentionKernel", "attention_kernel", "reference_mode", "using_ops",
           "using_reference"]
