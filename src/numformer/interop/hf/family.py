"""What a Hugging Face family file fills in: its ``Family`` (the field table, the maps between config.json and a
``GPTConfig``, the tensor layout), and the layout's pieces.

Tensors: a ``Layout`` pairs each numformer module with the Hugging Face module(s) holding it; ``expand``
turns it into ``TensorMap`` rows for a given ``GPTConfig`` (weight and, where that layer has one, bias).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class TensorMap:
    """numformer parameter ``nf`` <- Hugging Face tensor(s) ``hf``.

    transpose: the Hugging Face tensor is stored (in, out) (GPT-2's Conv1D); several ``hf``
    tensors are concatenated along axis 0 in order (e.g. separate q, k, v projections into
    numformer's fused ``qkv_proj``), and split back on export at ``sizes`` (rows of each part;
    equal parts when empty).
    """

    nf: str
    hf: tuple
    transpose: bool = False
    sizes: tuple = ()


@dataclass(frozen=True)
class Module_:
    """One numformer module <- Hugging Face module(s): ``nf`` and ``hf`` name modules (".weight" / ".bias"
    appended), ``{i}`` the layer; ``bias``: which of the layer's bias switches gives it a bias ("ff", "attn",
    "qkv", "always", "never"); ``transpose``: the weight is stored (in, out); ``split``: hf modules stacked as
    (q, k, v); ``when``: the layers that have the module (a test on their BlockConfig; every layer when None)."""

    nf: str
    hf: tuple
    bias: str
    transpose: bool = False
    split: bool = False
    when: Callable | None = None


@dataclass(frozen=True)
class Layout:
    """A family's tensor table: ``Module_`` rows before, in and after the layers, the checkpoint names'
    prefixes, and a regular expression of the checkpoint tensors that are buffers (skipped on import)."""

    top: tuple                       # modules before the layers (embeddings)
    layer: tuple                     # per layer, "{i}" the index
    final: tuple                     # after the layers (final norm)
    prefixes: tuple = ()             # checkpoint name prefixes; a name without one gets the first (headless saves)
    ignored: str = r"(?!)"           # checkpoint tensors that are buffers, not weights


def expand(layout, config):
    """[TensorMap, ...]: every tensor a checkpoint of ``config`` holds under ``layout``: the position table
    unless the model uses RoPE or ALiBi, each layer's modules (a bias where the module's bias switch gives
    one), the final modules, and ``lm_head.weight`` when the output layer is not tied."""
    rows = []
    for mod in layout.top:
        if mod.nf == "pos_emb" and config.positional in ("rope", "alibi"):
            continue
        rows += _rows(mod, mod.nf, mod.hf, None)
    for i, block in enumerate(config.layers):
        for mod in layout.layer:
            if mod.when is None or mod.when(block):
                rows += _rows(mod, f"blocks.{i}.{mod.nf}", tuple(h.format(i=i) for h in mod.hf), block)
    for mod in layout.final:
        rows += _rows(mod, mod.nf, mod.hf, config.layers[-1])
    if not config.tie_weights:
        rows.append(TensorMap("lm_head.weight", ("lm_head.weight",)))
    return rows


def _rows(mod, nf, hf, block):
    has_bias = {"always": True, "never": False}.get(mod.bias) if block is None or mod.bias in ("always", "never") \
        else {"ff": block.bias, "attn": block.attn_bias, "qkv": block.qkv_bias}[mod.bias]
    kv = None if block is None else block.n_kv_heads * block.head_dim
    sizes = (block.n_heads * block.head_dim, kv, kv) if mod.split else ()
    return [TensorMap(f"{nf}.{part}", tuple(f"{h}.{part}" for h in hf), mod.transpose and part == "weight", sizes)
            for part in (("weight", "bias") if has_bias else ("weight",))]


@dataclass(frozen=True)
class Family:
    """How one Hugging Face ``model_type`` maps onto numformer.

    model_type:              config.json's ``model_type`` (the key of ``families.FAMILIES``).
    fields:                  the field table (``fields.Field``): every config.json field transformers reads.
    to_config(hf_config) ->  the ``GPTConfig``; raises ValueError naming a config field numformer cannot
                             reproduce.
    to_hf(config)        ->  config.json dict of a ``GPTConfig``; raises ValueError naming a feature the family
                             lacks.
    layout:                  the tensor table (``tensors(config)`` expands it).
    """

    model_type: str
    fields: tuple
    to_config: Callable
    to_hf: Callable
    layout: Layout

    def tensors(self, config):
        """The ``TensorMap`` rows of a ``GPTConfig`` (``expand``)."""
        return expand(self.layout, config)

    def canonical(self, name):
        """A checkpoint tensor name as ``tensors`` spells it: saves of the headless model (GPT2Model,
        LlamaModel) lack the prefix."""
        if name.startswith("lm_head.") or any(name.startswith(p) for p in self.layout.prefixes):
            return name
        return self.layout.prefixes[0] + name

    @property
    def ignored(self):
        """The regular expression of checkpoint tensors that are buffers, not weights (skipped on import)."""
        return self.layout.ignored


def check_export(family_name, checks):
    """One ValueError for the first (ok, what) check that fails: what the family cannot express."""
    for ok, what in checks:
        if not ok:
            raise ValueError(f"{family_name} cannot express {what}; this model cannot be exported to the "
                             f"{family_name.lower()} format")


def shared(config, family_name, *names):
    """The values every layer of ``config`` shares for the BlockConfig fields ``names`` (a ValueError naming
    the field for layers that differ, which the family cannot express)."""
    out = []
    for name in names:
        values = {getattr(b, name) for b in config.layers}
        check_export(family_name, [(len(values) == 1, f"layers that differ in {name} ({sorted(map(str, values))})")])
        out.append(values.pop())
    return out if len(out) > 1 else out[0]
