"""``QuantizedLinear`` (an int8 linear layer for inference) and ``quantize_model`` (swap a model's layers for it).

    report = quantize_model(model, bits=8, group_size=None)     # in place; the report says what changed
    model.generate(prompt, 100, greedy=True)                     # the int8 weights are used from here on

What is quantized: every ``Linear`` of the model (the attention and feed-forward projections of each block,
and the output layer ``lm_head``), each replaced by name. Embeddings and norms stay float: a lookup reads
one row per token, a norm a vector, so neither is worth its rounding error. An output layer tied to the
token embedding gets its own int8 copy of the table: the lookup keeps reading the float table (one row
per token), the output product reads the int8 copy (the whole table per token) -- memory grows by a
quarter of the table, the bytes read per token shrink by three quarters. ``skip`` keeps named layers float.

Every parent in numformer calls its linear sub-modules and never reads their weights (the attention
calls ``qkv_proj`` and ``out_proj``, the feed-forward its projections, the GPT ``lm_head``), so each layer is
swapped by name with ``Module.set_submodule`` and the int8 one is what runs. Cross-attention projects the
query and the memory with different rows of its ``QKVProjection`` (``project_parts``): its int8
replacement, ``QuantizedQKVProjection``, slices the rows of its int8 weights and their scales the same way.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import numpy as np

from ..nn.attention import QKVProjection
from ..nn.dispatch import using_reference
from ..nn.layers import Linear
from ..nn.module import Module, Parameter
from . import kernel, reference

__all__ = ["QuantizedLinear", "QuantizedQKVProjection", "quantize_model", "LayerQuantizer", "QuantizationReport",
           "weight_bytes"]


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
        """The quantized copy of a ``Linear`` (its weight quantized, its bias copied); a ``QKVProjection``
        becomes a ``QuantizedQKVProjection``."""
        if cls is QuantizedLinear and isinstance(linear, QKVProjection):
            return QuantizedQKVProjection.from_linear(linear, bits, group_size)
        q, scales = kernel.quantize(linear.weight.data, bits, group_size)
        bias = None if linear.bias is None else linear.bias.data.copy()
        return cls(q, scales, bias, bits, group_size)

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{type(self).__name__} expects inputs with last dimension {self.in_features}, "
                             f"got shape {x.shape}")
        return self._product(x, self.qweight, self.scales, None if self.bias is None else self.bias.data)

    def _product(self, x, q, scales, b):
        fn = reference.quantized_linear_forward if using_reference() else kernel.quantized_linear_forward
        return fn(x, q, scales, self.group_size, b)

    def flops_per_token(self, context):
        """The float layer's count, 2 · in_features · out_features: the same products on int8 weights."""
        return 2 * self.in_features * self.out_features

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


class QuantizedQKVProjection(QuantizedLinear):
    """The int8 ``QKVProjection``: rows [W^Q; W^K; W^V], each row with its own scales, so a slice of rows is
    the int8 form of that slice. Self-attention calls it as any layer; cross-attention calls
    ``project_parts`` (the query with W^Q, the memory with [W^K; W^V]), as ``QKVProjection.project_parts``."""

    n_heads = n_kv_heads = head_dim = None

    @classmethod
    def from_linear(cls, linear, bits=8, group_size=None):
        layer = super().from_linear(linear, bits, group_size)
        layer.n_heads, layer.n_kv_heads, layer.head_dim = linear.n_heads, linear.n_kv_heads, linear.head_dim
        return layer

    def project_parts(self, parts, first_head=0):
        """[(x, (head counts)), ...] -> one (B, T, Σcounts·head_dim) array per part, from the next rows, from
        head ``first_head`` on (see ``QKVProjection.project_parts``)."""
        outs, start = [], first_head * self.head_dim
        for x, counts in parts:
            rows = slice(start, start + sum(counts) * self.head_dim)
            start = rows.stop
            outs.append(self._product(x, self.qweight[rows], self.scales[rows],
                                      None if self.bias is None else self.bias.data[rows]))
        return outs

    def backward_parts(self, grads):
        return self.backward(None)

    def extra_repr(self):
        return (f"{super().extra_repr()}, q/k/v heads {self.n_heads}/{self.n_kv_heads}/{self.n_kv_heads} x "
                f"{self.head_dim}")


@dataclass
class QuantizationReport:
    """What ``quantize_model`` did: the layers quantized, those kept float (name -> why), the bytes of the
    model's weights before and after (``weight_bytes``), and the layers whose rows are one group (at most
    ``group_size`` inputs: one scale per row there)."""

    bits: int
    group_size: int | None
    quantized: list = field(default_factory=list)
    kept_float: dict = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0
    whole_rows: list = field(default_factory=list)

    def __str__(self):
        per = "per channel" if self.group_size is None else f"groups of {self.group_size}"
        if self.group_size is not None and self.whole_rows:
            every = len(self.whole_rows) == len(self.quantized)
            per += (", that is one per row: no layer has more inputs" if every else
                    f"; one per row in the {len(self.whole_rows)} layers of at most {self.group_size} inputs")
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


def quantize_model(model, bits=8, group_size=None, skip=()):
    """Replace the model's linear layers by ``QuantizedLinear`` in place, by name (see the module docstring);
    returns a ``QuantizationReport``.

    bits: 2 to 8 (the values are stored as int8 whatever the bits). group_size: inputs per scale, or None
    for one scale per output channel. skip: names (or fnmatch patterns, ``"blocks.0.*"``) of layers to keep
    float. A layer registered under two names (shared) is quantized once and put under both.
    """
    return LayerQuantizer(bits, group_size, skip).finish(model)


class LayerQuantizer:
    """``quantize_model``, one layer at a time: each linear layer is quantized as soon as its weights are
    written, so that a model being loaded never holds all its float weights at once.

        quantizer = LayerQuantizer(bits=8)
        quantizer.start(model)                 # a model whose parameters are about to be written
        for name, array in weights:            # a loader, one parameter at a time
            params[name].data[...] = array
            quantizer.written(name)            # its layer quantized once all its parameters are written
        report = quantizer.finish()            # any layer not yet quantized; the QuantizationReport

    The loaders take it as ``quantize=`` (``numformer.interop.sources.load``, ``load_pretrained``). A float
    layer is released once its int8 replacement is in the model (the loader must hold no reference to its
    parameters), so loading needs the int8 model's memory and one float layer, not the float model's.
    """

    def __init__(self, bits=8, group_size=None, skip=()):
        reference.qmax(bits)
        reference.group_width(group_size, 1)
        self.bits, self.group_size, self.skip = int(bits), group_size, tuple(skip)
        self.model, self.report = None, None

    def start(self, model):
        """Find the model's linear layers (before any of its parameters is written); returns self."""
        if getattr(model, "lora_config", None):         # its adapted layers are not Linear: they would stay float
            raise ValueError("the model has LoRA adapters: merge them into their layers first "
                             "(numformer.lora.merge_lora(model)), then quantize")
        self.model = model
        self.report = QuantizationReport(self.bits, self.group_size, bytes_before=weight_bytes(model))
        self._names, self._pending = {}, {}             # id(layer) -> its names; -> ids of its unwritten parameters
        for name, layer in model.named_modules():
            if not isinstance(layer, Linear):
                continue
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.skip):
                self.report.kept_float[name] = "skip"
                continue
            self._names.setdefault(id(layer), []).append(name)
            self._pending[id(layer)] = {id(p) for p in layer.parameters()}
        # parameter name -> (its id, the ids of the layers it belongs to: a tied weight, the embedding's and
        # lm_head's); ids only, no references: a quantized layer's float parameters must be freed
        owners = {}
        for layer_id, param_ids in self._pending.items():
            for param_id in param_ids:
                owners.setdefault(param_id, []).append(layer_id)
        self._owners = {name: (id(p), owners[id(p)]) for name, p in model.named_parameters() if id(p) in owners}
        return self

    def expected_bytes(self):
        """``weight_bytes`` of the model once ``finish`` has quantized every layer, from the shapes alone (no
        weight read): the parameters that stay float (an output layer's tied table stays the embedding's),
        and each layer's int8 weights, scales and bias."""
        to_quantize = self._to_quantize()
        floats = self._staying_float(to_quantize)
        itemsize = self.model.dtype.itemsize

        def int8_bytes(layer):
            N, K = layer.out_features, layer.in_features
            groups = -(-K // reference.group_width(self.group_size, K))
            return N * K + N * groups * itemsize + (0 if layer.bias is None else layer.bias.data.nbytes)

        return sum(floats.values()) + sum(int8_bytes(layer) for layer in to_quantize.values())

    def largest_layer_bytes(self):
        """The bytes of the largest float weight of a layer to quantize (a tied output layer's table stays
        the embedding's, counted in ``expected_bytes``): what a load holds beside the int8 model until that
        layer is quantized (``numformer.interop.hf.memory_needed``)."""
        to_quantize = self._to_quantize()
        floats = self._staying_float(to_quantize)
        return max((layer.weight.data.nbytes for layer in to_quantize.values() if id(layer.weight) not in floats),
                   default=0)

    def _to_quantize(self):
        """{id(layer): layer} of the layers not quantized yet."""
        return {layer_id: self.model.get_submodule(names[0]) for layer_id, names in self._names.items()
                if layer_id in self._pending}

    def _staying_float(self, to_quantize):
        """{id(parameter): bytes} of the parameters that stay float: those of every other module."""
        return {id(p): p.data.nbytes for m in self.model.modules() if id(m) not in to_quantize
                for p in m._parameters.values() if p is not None}

    def written(self, name):
        """Parameter ``name`` (as ``named_parameters`` names it) now holds its weights: quantize each layer
        whose parameters are all written."""
        param_id, layer_ids = self._owners.pop(name, (None, ()))
        for layer_id in layer_ids:
            pending = self._pending.get(layer_id)
            if pending is not None:
                pending.discard(param_id)
                if not pending:
                    self._quantize(layer_id)

    def _quantize(self, layer_id):
        names = self._names[layer_id]
        layer = self.model.get_submodule(names[0])
        quantized = QuantizedLinear.from_linear(layer, self.bits, self.group_size).train(layer.training)
        for name in names:
            self.model.set_submodule(name, quantized)
        del self._pending[layer_id]
        self.report.quantized.append(names[0])
        if self.group_size is not None and layer.in_features <= self.group_size:
            self.report.whole_rows.append(names[0])

    def finish(self, model=None):
        """Quantize every layer not quantized yet (all of them when ``start`` was not called: give ``model``);
        returns the ``QuantizationReport``, in the model's order."""
        if self.model is None:
            if model is None:
                raise ValueError("LayerQuantizer.finish needs the model when start(model) was not called")
            self.start(model)
        for layer_id in list(self._pending):
            self._quantize(layer_id)
        order = {name: i for i, (name, _) in enumerate(self.model.named_modules())}
        self.report.quantized.sort(key=order.get)
        self.report.whole_rows.sort(key=order.get)
        self.report.bytes_after = weight_bytes(self.model)
        return self.report
