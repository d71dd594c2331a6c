"""Which implementation of each op the modules run: one table, one switch.

Every module of ``numformer.nn`` calls its ops through ``F`` (``F.layer_norm_forward(x, γ, β)``), which looks
the name up in ``OPS``: the speed path (``numformer.kernels``) by default, the reference (``numformer.ops``)
inside ``reference_mode()``. Attention follows the same switch (``MultiHeadAttention.kernel_name``: the
reference ``ops.attention`` instead of the fused or flash kernel). Both paths compute the same function;
tests/test_kernels.py checks each kernel against its reference and whole models trained on both.

    with numformer.reference_mode():
        loss = train_step(model, batch)         # every op of the model is the plain NumPy reference

Switch between steps, not between a forward pass and its backward (each path's cache is its own).

``using_ops({name: function, ...})`` puts other functions in the table for the length of a block, whichever
path is selected (``numformer exercises train`` runs a learner's own ops this way). Attention's reference
kernel calls ``F.scaled_dot_product_attention_forward/backward``, so it is one of them.
"""
from __future__ import annotations

import contextlib

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
    "gelu_forward":            (ops.gelu_forward,             kernels.gelu_forward),
    "gelu_backward":           (ops.gelu_backward,            kernels.gelu_backward),
    "silu_forward":            (ops.silu_forward,             kernels.silu_forward),
    "silu_backward":           (ops.silu_backward,            kernels.silu_backward),
    "silu_gate_forward":       (ops.silu_gate_forward,        kernels.silu_gate_forward),
    "silu_gate_backward":      (ops.silu_gate_backward,       kernels.silu_gate_backward),
    "dropout_forward":         (ops.dropout_forward,          ops.dropout_forward),
    "dropout_backward":        (ops.dropout_backward,         ops.dropout_backward),
    "rope_forward":            (ops.rope_forward,             kernels.rope_forward),
    "rope_backward":           (ops.rope_backward,            kernels.rope_backward),
    "repeat_kv_forward":       (ops.repeat_kv_forward,        ops.repeat_kv_forward),
    "repeat_kv_backward":      (ops.repeat_kv_backward,       ops.repeat_kv_backward),
    # the reference attention kernel (nn.attention.KERNELS["reference"]); its fast kernels are chosen there
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

__all__ = ["OPS", "F", "reference_mode", "using_ops", "using_reference"]
