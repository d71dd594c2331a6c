"""``QuantizedLinear`` (an int8 linear layer for inference) and ``quantize_model`` (swap a model's layers for it).

    report = quantize_model(model, bits=8, group_size=None)     # in place; the report says what changed
    model.generate(prompt, 100, greedy=True)                     # the int8 weights are used from here on

What is quantized: every ``Linear`` of the model (the attention and feed-forward projections of each block,
and the output layer ``lm_head``), each replaced by name. Embeddings and norms stay float: a lookup reads
one row per token, a norm a vector, so neither is worth its rounding error. An output layer tied to the
token embedding gets its own int8 copy of the table: the lookup keeps reading the float table (one row
per token), the output product reads the int8 copy (the whole table per token) -- memory grows by a
quarter of the table, the bytes read per token shrink by three quarters. ``skip`` keeps named layers float.

A layer is replaced only where the replacement takes effect. Before quantizing, the model is run on a
two-token input (once without and once with the key/value cache, in evaluation mode) with each
candidate ``Linear`` watched: a layer whose parent reads its ``weight`` array directly instead of calling
it would ignore a swapped-in module, so it is kept float, and the report names it with the reason. The
swap itself goes through ``set_submodule`` (a parent's child replaced by its dotted name).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import numpy as np

from ..nn.dispatch import using_reference
from ..nn.layers import Linear
from ..nn.module import Module, Parameter
from . import kernel, reference

__all__ = ["QuantizedLinear", "quantize_model", "QuantizationReport", "weight_bytes", "set_submodule"]


class QuantizedLinear(Module):
    """y = x Ŵᵀ + b with Ŵ = s · q: int8 weights q (out_features, in_features) and their float scales s
    (out_features, ceil(in_features / group_size)), one per output channel (``group_size=None``) or per
    group of ``group_size`` inputs (see ``numformer.quantize.reference``). Inference only.

    ``qweight`` and ``scales`` are plain arrays, not Parameters: nothing trains them, and the model's
    ``state_dict`` (its float checkpoint format) does not hold them. The bias stays a float Parameter.
    The forward pass runs ``numformer.quantize.kernel`` (``reference`` inside ``numformer.reference_mode()``).
    """

    def __init__(self, qweight, scales, bias=None, bits=8, group_size=None):
        super().__init__()
        qweight, scales = np.ascontiguousarray(qweight), np.ascontiguousarray(scales)
        N, K = qweight.shape
        groups = -(-K // reference.group_width(group_size, K))
        if qweight.dtype != np.int8 or scales.shape != (N, groups):
            raise ValueError(f"QuantizedLinear needs int8 weights (out, in) and scales (out, {groups}) for "
                             f"group_size {group_size}; got {qweight.dtype} {qweight.shape} and {scales.shape}")
        self.out_features, self.in_features = N, K
        self.bits, self.group_size = int(bits), group_size
        self.qweight, self.scales = qweight, scales
        self.bias = None if bias is None else Parameter(np.asarray(bias, dtype=scales.dtype))

    @classmethod
    def from_linear(cls, linear, bits=8, group_size=None):
        """The quantized copy of a ``Linear`` (its weight quantized, its bias copied)."""
        q, scales = reference.quantize(linear.weight.data, bits, group_size)
        bias = None if linear.bias is None else linear.bias.data.copy()
        return cls(q, scales, bias, bits, group_size)

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"QuantizedLinear expects inputs with last dimension {self.in_features}, "
                             f"got shape {x.shape}")
        fn = reference.quantized_linear_forward if using_reference() else kernel.quantized_linear_forward
        return fn(x, self.qweight, self.scales, self.group_size, None if self.bias is None else self.bias.data)

    def backward(self, dy):
        raise RuntimeError("QuantizedLinear is for inference only (int8 weights have no gradient): train or "
                           "fine-tune the float model, then quantize it")

    def dequantized_weight(self):
        """Ŵ = s · q, (out_features, in_features) in the scales' dtype: the weight this layer multiplies by."""
        return reference.dequantize(self.qweight, self.scales, self.group_size)

    @property
    def nbytes(self):
        """Bytes this layer holds: int8 weights, scales and bias."""
        return self.qweight.nbytes + self.scales.nbytes + (0 if self.bias is None else self.bias.data.nbytes)

    def _on_dtype_change(self, dtype):            # Module.astype: the scales follow the model's float dtype
        self.scales = self.scales.astype(dtype)

    def extra_repr(self):
        per = "per channel" if self.group_size is None else f"group_size={self.group_size}"
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}, int{self.bits}, {per}"


@dataclass
class QuantizationReport:
    """What ``quantize_model`` did: the layers quantized, those kept float (name -> why), and the bytes of
    the model's weights before and after (``weight_bytes``)."""

    bits: int
    group_size: int | None
    quantized: list = field(default_factory=list)
    kept_float: dict = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0

    def __str__(self):
        per = "per channel" if self.group_size is None else f"groups of {self.group_size}"
        text = (f"int{self.bits} ({per}): {len(self.quantized)} linear layers quantized, weights "
                f"{self.bytes_before / 2**20:,.1f} -> {self.bytes_after / 2**20:,.1f} MiB")
        if self.kept_float:
            reasons = {}
            for name, why in self.kept_float.items():
                reasons.setdefault(why, []).append(name)
            text += "; kept float: " + "; ".join(f"{len(names)} ({why}, e.g. {names[0]})"
                                                 for why, names in reasons.items())
        return text


def weight_bytes(model):
    """Bytes of a model's weights in memory: every Parameter once (a tied one counted once) plus the int8
    weights and scales of its QuantizedLinear layers."""
    total = sum(p.data.nbytes for p in model.parameters())
    quantized = {id(m): m for m in model.modules() if isinstance(m, QuantizedLinear)}
    return total + sum(m.qweight.nbytes + m.scales.nbytes for m in quantized.values())


NOT_CALLED = ("read through its weight array by its parent, not called: a swapped-in layer would be ignored "
              "(numformer's attention reads qkv_proj.weight until issue 37's restructuring)")


def quantize_model(model, bits=8, group_size=None, skip=(), probe=None):
    """Replace the model's linear layers by ``QuantizedLinear`` in place (see the module docstring); returns
    a ``QuantizationReport``.

    bits: 2 to 8 (the values are stored as int8 whatever the bits). group_size: inputs per scale, or None
    for one scale per output channel. skip: names (or fnmatch patterns, ``"blocks.0.*"``) of layers to keep
    float. probe: callables, each running the model once (``lambda m: m(ids)``), that show which layers
    its forward pass calls; default for a decoder with ``new_kv_caches`` (GPT): a two-token input without
    and with the key/value cache. A layer not called by every probe is kept float.
    """
    reference.qmax(bits)
    reference.group_width(group_size, 1)
    report = QuantizationReport(int(bits), group_size, bytes_before=weight_bytes(model))
    candidates = {}
    for name, m in model.named_modules():
        if isinstance(m, Linear) and all(m is not c for c in candidates.values()):   # a shared layer: once
            candidates[name] = m
    for name in [n for n in candidates if any(fnmatch.fnmatchcase(n, p) for p in skip)]:
        report.kept_float[name] = "skip"
        del candidates[name]
    called = _called_in_every_pass(model, candidates, _probes(model, probe))
    for name, layer in candidates.items():
        if name not in called:
            report.kept_float[name] = NOT_CALLED
            continue
        set_submodule(model, name, QuantizedLinear.from_linear(layer, bits, group_size).train(layer.training))
        report.quantized.append(name)
    report.bytes_after = weight_bytes(model)
    return report


def _probes(model, probe):
    """The forward passes that show which layers a model calls: ``probe`` or the GPT default."""
    if probe is not None:
        return [lambda p=p: p(model) for p in (probe if isinstance(probe, (list, tuple)) else [probe])]
    if not callable(getattr(model, "new_kv_caches", None)):
        raise ValueError(f"quantize_model does not know how to run a {type(model).__name__}: pass "
                         f"probe=lambda model: model(example inputs)")
    ids = np.zeros((1, 2), dtype=np.int64)

    def cached():
        caches = model.new_kv_caches()
        model(ids[:, :1], kv_caches=caches)
        model(ids[:, 1:], kv_caches=caches)

    return [lambda: model(ids), cached]


def _called_in_every_pass(model, layers, passes):
    """Names of ``layers`` ({name: module}) whose forward runs in every one of ``passes`` (model in eval mode,
    modes and stored activations restored afterwards)."""
    modes = [(m, m.training) for m in model.modules()]
    counts, seen = dict.fromkeys(layers, 0), set()
    for name, layer in layers.items():
        def watched(*args, _name=name, _forward=layer.forward, **kwargs):
            seen.add(_name)
            return _forward(*args, **kwargs)
        object.__setattr__(layer, "forward", watched)
    model.eval()
    try:
        for run in passes:
            seen.clear()
            run()
            for name in seen:
                counts[name] += 1
    finally:
        for layer in layers.values():
            object.__delattr__(layer, "forward")
        for m, mode in modes:
            object.__setattr__(m, "training", mode)
        model.clear_cache()
    return {name for name, n in counts.items() if n == len(passes)}


def set_submodule(model, name, module):
    """Replace the sub-module at dotted ``name`` (``blocks.0.ff.linear1``) by ``module`` on its parent: what
    ``Module.set_submodule`` does once issue 37's restructuring gives it (then this function goes)."""
    *path, last = name.split(".")
    parent = model
    for part in path:
        parent = getattr(parent, part)
    if not isinstance(getattr(parent, last, None), Module):
        raise ValueError(f"{name} is not a sub-module of this {type(model).__name__}")
    setattr(parent, last, module)
