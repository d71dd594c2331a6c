"""LoRA adapters (Hu et al. 2021) on a model's linear layers, named as Hugging Face and PEFT name them.

    add_lora(model, r=8, alpha=8, target_modules=("q_proj", "v_proj"))    # base frozen, adapters trainable
    ... train ...
    merge_lora(model)                     # W₀ + s·B A written into the base weights; the adapters removed

Each targeted layer h = x W₀ᵀ + b becomes h = x W₀ᵀ + b + s · (dropout(x) Aᵀ) Bᵀ (``ops.lora_forward``),
with A: (r, d_in) drawn as PEFT draws it (torch.nn.Linear's default, kaiming-uniform with a = √5), B: (d_out, r)
zeros, so the model starts as it was; s = α / r (α / √r with ``use_rslora``, Kalajdzievski 2023). Every
parameter of the model is frozen except the adapters, so the optimizer holds state for the adapters only.

Targets are Hugging Face's projection names (``TARGET_MODULES``). numformer keeps q, k and v in one fused
matrix (``qkv_proj``, rows [W^Q; W^K; W^V]); an adapter on ``q_proj`` covers the query rows alone
(n_heads·head_dim of them), ``k_proj`` and ``v_proj`` the key and value rows (n_kv_heads·head_dim each, fewer
with grouped-query attention), and GPT-2's ``c_attn`` all of them (one adapter, as PEFT puts on GPT-2's fused
Conv1D). An adapter's parameters are named ``<layer>.<HF name>.lora_A`` / ``.lora_B``, e.g.
``blocks.0.self_attn.q_proj.lora_A`` or ``blocks.1.ff.down_proj.lora_B``; the base weights keep their names.
"""
from __future__ import annotations

import math

import numpy as np

from . import ops
from .nn import init
from .nn.module import Module, Parameter

# Hugging Face name -> [(parent module, numformer module, part of the fused q/k/v rows or None), ...]
TARGET_MODULES = {
    "q_proj": [("self_attn", "qkv_proj", "q")],
    "k_proj": [("self_attn", "qkv_proj", "k")],
    "v_proj": [("self_attn", "qkv_proj", "v")],
    "o_proj": [("self_attn", "out_proj", None)],
    "gate_proj": [("ff", "gate_proj", None)],
    "up_proj": [("ff", "up_proj", None)],
    "down_proj": [("ff", "down_proj", None)],
    "c_attn": [("self_attn", "qkv_proj", "qkv")],                   # GPT-2: the fused q/k/v Conv1D
    "c_proj": [("self_attn", "out_proj", None), ("ff", "linear2", None)],   # GPT-2: attention and MLP outputs
    "c_fc": [("ff", "linear1", None)],                                # GPT-2: the MLP's first layer
}
LORA_DEFAULTS = {"r": 8, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "use_rslora": False}


def lora_scaling(r, alpha, use_rslora=False):
    """s = α / r, or α / √r with rsLoRA."""
    return alpha / math.sqrt(r) if use_rslora else alpha / r


class LoRAAdapter(Module):
    """The trainable pair of one adapted layer: ``lora_A`` (r, d_in), ``lora_B`` (d_out, r), the scaling s
    and the dropout p applied to the adapter's input (as PEFT's ``lora_dropout``)."""

    def __init__(self, d_in, d_out, r, alpha, dropout=0.0, use_rslora=False, rng=None, dtype=np.float32):
        super().__init__()
        self.rng = init.default_rng(rng)
        self.r, self.alpha, self.dropout, self.use_rslora = r, alpha, dropout, use_rslora
        self.scaling = lora_scaling(r, alpha, use_rslora)
        self.lora_A = Parameter(init.linear_default(self.rng, (r, d_in), dtype))
        self.lora_B = Parameter(np.zeros((d_out, r), dtype=dtype))
        self._cache = None

    def forward(self, x, training=False):
        xd, mask = ops.dropout_forward(x, self.dropout, self.rng, training)
        y, cache = ops.lora_forward(xd, self.lora_A.data, self.lora_B.data, self.scaling)
        self._cache = (cache, mask)
        return y

    def backward(self, dy):
        cache, mask = self._cache
        self._cache = None
        dxd, dA, dB = ops.lora_backward(dy, cache)
        self.lora_A.accumulate(dA)
        self.lora_B.accumulate(dB)
        return ops.dropout_backward(dxd, mask)

    def flops_per_token(self, context):
        """None of its own: the ``LoRALinear`` that runs it counts its products (it may also be registered
        under its Hugging Face name, and would be counted twice)."""
        return 0

    def products_per_token(self):
        """2 · r · (d_in + d_out): x Aᵀ, then u Bᵀ."""
        return 2 * self.r * (self.lora_A.shape[1] + self.lora_B.shape[0])

    def delta_weight(self):
        """ΔW = s · B A, (d_out, d_in): what ``merge_lora`` adds to the base weight."""
        return self.scaling * (self.lora_B.data @ self.lora_A.data)

    def extra_repr(self):
        return f"r={self.r}, alpha={self.alpha:g}, scaling={self.scaling:g}, dropout={self.dropout:g}"


class LoRALinear(Module):
    """A linear layer (``Linear`` or the fused ``QKVProjection``) with adapters on row blocks of its output:
    y = x Wᵀ + b, then y[rows] += adapter(x) for each (rows, adapter). ``weight`` and ``bias`` are the base
    layer's own (frozen) Parameters, so their names do not change; the base layer computes its part."""

    def __init__(self, base, adapters, own_name=None):
        super().__init__()
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_adapters", list(adapters))       # [(row slice, LoRAAdapter)]
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        if own_name is not None:                 # the base layer has the HF name (gate_proj ...): its adapter's
            (_, adapter), = self._adapters       # parameters are this layer's own, <layer>.lora_A / .lora_B
            self.lora_A, self.lora_B = adapter.lora_A, adapter.lora_B

    def __getattr__(self, name):                 # the base layer's attributes (n_heads, head_dim ...)
        if name in ("project_parts", "backward_parts") or name.startswith("__"):
            raise AttributeError(name)           # cross-attention's row parts would skip the adapters
        base = self.__dict__.get("_base")
        if base is None:
            raise AttributeError(name)
        return getattr(base, name)

    def forward(self, x):
        y = self._base(x)
        for rows, adapter in self._adapters:
            y[..., rows] += adapter.forward(x, self.training)
        return y

    def backward(self, dy):
        dx = self._base.backward(dy)
        for rows, adapter in self._adapters:
            dx = dx + adapter.backward(np.ascontiguousarray(dy[..., rows]))
        return dx

    def flops_per_token(self, context):
        """The base layer's products and its adapters' (the base layer is not a sub-module: its weights are
        this layer's own)."""
        return self._base.flops_per_token(context) + sum(a.products_per_token() for _, a in self._adapters)

    def extra_repr(self):
        return f"{self._base.extra_repr()}, adapters on rows {[(s.start, s.stop) for s, _ in self._adapters]}"


def _rows(module, part):
    """The output rows an adapter covers: all of them, or the q, k or v block of a fused projection."""
    if part is None or part == "qkv":
        return slice(0, module.out_features)
    H, Hkv, dh = module.n_heads, module.n_kv_heads, module.head_dim
    start = {"q": 0, "k": H * dh, "v": (H + Hkv) * dh}[part]
    return slice(start, start + (H if part == "q" else Hkv) * dh)


def check_lora_options(r, alpha, dropout, target_modules, use_rslora):
    """One ValueError naming the first bad option and what is valid."""
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1:
        raise ValueError(f"[lora] r = {r!r} should be an integer >= 1 (the rank of the update)")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"[lora] alpha = {alpha!r} should be a number > 0 (the scaling is alpha / r)")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"[lora] dropout = {dropout!r} should be in [0, 1)")
    if not isinstance(use_rslora, bool):
        raise ValueError(f"[lora] use_rslora = {use_rslora!r} should be true or false")
    names = [target_modules] if isinstance(target_modules, str) else target_modules
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"[lora] target_modules = {target_modules!r} should be a list of layer names among "
                         f"{list(TARGET_MODULES)}")
    unknown = [n for n in names if n not in TARGET_MODULES]
    if unknown:
        raise ValueError(f"[lora] target_modules: unknown layer name(s) {unknown}; valid names: "
                         f"{list(TARGET_MODULES)}")
    names = list(dict.fromkeys(names))
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = _shared_rows(a, b)
            if shared:
                raise ValueError(f"[lora] target_modules: {a} overlaps {b}: both adapt {shared} (two adapters "
                                 f"on the same rows); name one of them")
    return names


def _shared_rows(a, b):
    """The rows of one layer that both target names ``a`` and ``b`` reach, described (c_attn and q_proj: the
    query rows of self_attn.qkv_proj; o_proj and c_proj: self_attn.out_proj), or None when they reach none."""
    for parent, child, part in TARGET_MODULES[a]:
        for parent_b, child_b, part_b in TARGET_MODULES[b]:
            if (parent, child) != (parent_b, child_b):
                continue
            rows = [p for p in (part, part_b) if p in ("q", "k", "v")]
            if len(set(rows)) < 2:                  # not two different blocks of the fused q/k/v rows
                what = {"q": "the query rows of ", "k": "the key rows of ", "v": "the value rows of "}
                return f"{what[rows[0]] if rows else ''}{parent}.{child}"
    return None


def add_lora(model, r=8, alpha=8, target_modules=("q_proj", "v_proj"), dropout=0.0, use_rslora=False, rng=None):
    """Put LoRA adapters on the layers of ``model`` named by ``target_modules`` (Hugging Face names) and
    freeze every other parameter; returns the model. The adapters take the model's mode (an ``eval()`` model
    applies no adapter dropout). ``rng`` draws the A matrices, then the dropout masks.
    The options are recorded in ``model.lora_config`` (what ``save_adapter`` writes), and which parameters
    were trainable before, by name, in ``model.lora_requires_grad`` (what ``unload_lora`` restores)."""
    names = check_lora_options(r, alpha, dropout, target_modules, use_rslora)
    if getattr(model, "lora_config", None):
        raise ValueError("this model already has LoRA adapters; merge_lora(model) first to add others")
    rng = init.default_rng(rng)
    found = _targets(model, names)
    trainable = {name: p.requires_grad for name, p in model.named_parameters()}
    model.requires_grad_(False)
    for path, parent, child, hf_parts in found:
        base = parent.get_submodule(child)
        adapters = []
        for hf_name, part in hf_parts:
            rows = _rows(base, part)
            adapters.append((hf_name, rows, LoRAAdapter(base.in_features, rows.stop - rows.start, r, alpha,
                                                        dropout, use_rslora, rng, base.weight.dtype)))
        own = hf_parts[0][0] if len(hf_parts) == 1 and hf_parts[0][0] == child else None
        for hf_name, _, adapter in adapters:
            if hf_name != own:
                setattr(parent, hf_name, adapter)                 # <parent>.<HF name>.lora_A
        layer = LoRALinear(base, [(rows, a) for _, rows, a in adapters], own)
        for module in (layer, *(a for _, _, a in adapters)):
            module.train(model.training)                  # the model's mode: no adapter dropout in eval
        parent.set_submodule(child, layer)
    object.__setattr__(model, "lora_config", {"r": r, "alpha": alpha, "dropout": dropout, "target_modules": names,
                                              "use_rslora": use_rslora})
    object.__setattr__(model, "lora_requires_grad", trainable)
    return model


def _targets(model, names):
    """[(path, parent module, numformer child name, [(HF name, part), ...])] of every layer to adapt, in model
    order; ValueError when a name matches no layer of this model."""
    found, matched = {}, set()
    for path, parent in model.named_modules():
        kind = path.rpartition(".")[2]
        for name in names:
            for parent_kind, child, part in TARGET_MODULES[name]:
                if kind == parent_kind and child in parent._modules:
                    found.setdefault((path, child), (parent, []))[1].append((name, part))
                    matched.add(name)
    missing = [n for n in names if n not in matched]
    if missing:
        raise ValueError(f"[lora] target_modules {missing} match no layer of this {type(model).__name__}; its "
                         f"layers answer to {_available(model)}")
    return [(f"{path}.{child}", parent, child, parts) for (path, child), (parent, parts) in found.items()]


def _available(model):
    kinds = {(p.rpartition(".")[2], c) for p, m in model.named_modules() for c in m._modules}
    return [n for n, where in TARGET_MODULES.items() if any((pk, c) in kinds for pk, c, _ in where)]


def lora_layers(model):
    """[(path, LoRALinear)] of the adapted layers, in model order."""
    return [(path, m) for path, m in model.named_modules() if isinstance(m, LoRALinear)]


def lora_adapters(model):
    """[(dotted prefix of lora_A / lora_B, LoRAAdapter, adapted layer path, row slice)] in model order:
    e.g. ("blocks.0.self_attn.q_proj", adapter, "blocks.0.self_attn.qkv_proj", slice(0, 64))."""
    out = []
    for path, layer in lora_layers(model):
        parent_path, _, child = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        for rows, adapter in layer._adapters:
            name = next((n for n, m in parent._modules.items() if m is adapter), child)
            out.append((f"{parent_path}.{name}", adapter, path, rows))
    return out


def merge_lora(model):
    """Add each adapter's s·B A into its base weight rows, then ``unload_lora``: the model computes the same
    function with exactly the base model's parameter names. Returns the model."""
    if not getattr(model, "lora_config", None):
        raise ValueError("this model has no LoRA adapters to merge (add_lora adds them)")
    for prefix, adapter, path, rows in lora_adapters(model):
        layer = model.get_submodule(path)
        layer.weight.data[rows] += adapter.delta_weight().astype(layer.weight.dtype)
    return unload_lora(model)


def unload_lora(model):
    """Remove the adapters without merging them (PEFT's ``unload``): the base model as it was, each parameter
    trainable or frozen as it was before ``add_lora`` (``model.lora_requires_grad``; a change made to a base
    parameter's ``requires_grad`` while the adapters were on is undone). Returns the model."""
    if not getattr(model, "lora_config", None):
        raise ValueError("this model has no LoRA adapters to remove (add_lora adds them)")
    for path, layer in lora_layers(model):
        parent_path, _, child = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        for name in [n for n, m in parent._modules.items() if any(m is a for _, a in layer._adapters)]:
            delattr(parent, name)
            del parent._modules[name]
        parent.set_submodule(child, layer._base)
    trainable = getattr(model, "lora_requires_grad", None) or {}
    for name, p in model.named_parameters():
        p.requires_grad = trainable.get(name, True)
    object.__setattr__(model, "lora_config", None)
    object.__setattr__(model, "lora_requires_grad", None)
    return model


__all__ = ["TARGET_MODULES", "LORA_DEFAULTS", "LoRAAdapter", "LoRALinear", "add_lora", "merge_lora", "unload_lora",
           "lora_scaling", "lora_layers", "lora_adapters", "check_lora_options"]
