"""Parameter and Module: named parameters, state dicts, train/eval, gradients.

A Module's ``forward`` stores the caches its ``backward`` needs; ``backward(dout)``
accumulates into each Parameter's ``.grad`` and returns the input gradients.
Because a module keeps one cache, a module must not be called twice in one
forward pass; to share weights, share the Parameter (see ``GPT`` tying).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterator

import numpy as np


class Parameter:
    """A trainable array. ``grad`` is None until a backward pass writes it (as torch's set_to_none).

    ``requires_grad`` (torch's name, True by default): False freezes the parameter. Backward then computes
    and accumulates no gradient for it (``grad`` stays None; the modules skip the work where that is
    cheap, e.g. a frozen Linear weight costs no dW product), so an optimizer leaves it alone and creates
    no state for it.
    """

    __slots__ = ("data", "grad", "requires_grad")

    def __init__(self, data, requires_grad=True):
        self.data = np.ascontiguousarray(data)
        self.grad = None
        self.requires_grad = bool(requires_grad)

    @property
    def shape(self):
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def size(self):
        return self.data.size

    def accumulate(self, g):
        """Add a gradient contribution (tied weights receive several); nothing for a frozen parameter."""
        if not self.requires_grad:
            return
        if self.grad is None:
            self.grad = g if g.dtype == self.data.dtype else g.astype(self.data.dtype)
        else:
            self.grad += g

    def __repr__(self):
        frozen = "" if self.requires_grad else ", requires_grad=False"
        return f"Parameter(shape={self.shape}, dtype={self.dtype}{frozen})"


# What backward says when there is no forward pass to go back through (a layer keeps one pass's cache).
NO_FORWARD = ("backward called without a forward pass to go back through (call forward first; each forward "
              "allows one backward)")
# What a model's backward says after a forward pass that raised (a hook's error, a bad input): some layers
# keep that pass's activations, others the previous pass's, so there is no forward pass to go back through.
FAILED_FORWARD = ("backward after a forward pass that raised an exception: its layers keep activations of "
                  "different passes; run a forward pass that completes, then backward")


class Module:
    """Base class: registers Parameters and sub-Modules assigned as attributes, in order."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        params = self.__dict__.get("_parameters")
        if params is None:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() before assigning {name}")
        # A replaced parameter or module keeps its place in the order (named_parameters, ModuleList order).
        if isinstance(value, Parameter):
            self._modules.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            params.pop(name, None)
            self._modules[name] = value
        elif name in params or name in self._modules:
            params.pop(name, None)
            self._modules.pop(name, None)
        object.__setattr__(self, name, value)

    # -- calling ---------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    def backward(self, dout):  # pragma: no cover - abstract
        raise NotImplementedError

    # -- traversal -------------------------------------------------------------
    def named_modules(self, prefix="") -> Iterator[tuple[str, "Module"]]:
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def children(self):
        return iter(self._modules.values())

    def get_submodule(self, name):
        """The sub-module at dotted path ``name`` (``"blocks.0.self_attn.qkv_proj"``; ``""`` is this module),
        as torch's. A path that names no module is one AttributeError naming the first missing part."""
        module = self
        for i, part in enumerate(name.split(".") if name else ()):
            child = module._modules.get(part)
            if child is None:
                where = ".".join(name.split(".")[:i]) or type(self).__name__
                raise AttributeError(f"{where} has no sub-module {part!r} (it has {list(module._modules)})")
            module = child
        return module

    def set_submodule(self, name, module):
        """Put ``module`` at dotted path ``name`` in place of the sub-module there (as torch's): the parent
        then calls the new module in forward and backward, e.g. a LoRA wrapper or an int8 linear layer in
        place of ``blocks.0.self_attn.qkv_proj``. The path must name an existing sub-module."""
        if not isinstance(module, Module):
            raise TypeError(f"set_submodule needs a numformer Module, got {type(module).__name__}")
        parent_name, _, last = name.rpartition(".")
        parent = self.get_submodule(parent_name)
        if last not in parent._modules:
            raise AttributeError(f"{parent_name or type(self).__name__} has no sub-module {last!r} "
                                 f"(it has {list(parent._modules)})")
        setattr(parent, last, module)

    def requires_grad_(self, requires_grad=True):
        """Freeze (False) or unfreeze (True) every parameter of this module and its sub-modules; returns self."""
        for p in self.parameters():
            p.requires_grad = bool(requires_grad)
        return self

    # What weight decay sees this module's parameters as: None, "norm" (norms' gains and biases) or
    # "embedding" (token and position tables); ``optim.param_groups`` asks each module.
    parameter_kind = None

    def residual_weights(self):
        """The weights of the layers whose output is added to the residual stream (attention output
        projection, feed-forward output layer; GPT-2 initializes them with a std scaled by 1/√(2·n_layers)):
        by default, what the sub-modules answer."""
        return [p for m in self.children() for p in m.residual_weights()]

    def flops_per_token(self, context):
        """Floating-point operations of this module's own products for one token's forward pass, with
        ``context`` positions of attention span (``numformer.models.flops``); its sub-modules answer for
        themselves. By default none (norms, activations and lookups count nothing)."""
        return 0

    def hidden_matrices(self):
        """The weight matrices of the hidden layers, in model order: what Muon updates. A module answers for
        itself: by default, what its sub-modules answer (a Transformer block answers with every weight
        matrix inside it; token embeddings and output heads, outside the blocks, answer nothing)."""
        found, seen = [], set()
        for m in self.children():
            for p in m.hidden_matrices():
                if id(p) not in seen:
                    seen.add(id(p))
                    found.append(p)
        return found

    def named_parameters(self, prefix="") -> Iterator[tuple[str, Parameter]]:
        """(dotted name, Parameter) in a stable order; a tied Parameter is listed once, under its first name."""
        seen = set()
        for mod_name, m in self.named_modules(prefix):
            for name, p in m._parameters.items():
                if id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self):
        for _, p in self.named_parameters():
            yield p

    def num_parameters(self):
        return sum(p.size for p in self.parameters())

    # -- state -----------------------------------------------------------------
    def state_dict(self):
        """{dotted name: array} of every (deduplicated) parameter; arrays are the live data, not copies."""
        return OrderedDict((name, p.data) for name, p in self.named_parameters())

    def load_state_dict(self, state, strict=True):
        """Copy arrays into the parameters, checking names and shapes first (``check_state_dict``: one
        ValueError lists every problem, nothing copied). ``strict=False`` skips missing and unexpected names
        (shapes are still checked). Returns None."""
        self.check_state_dict(state, strict)
        for k, p in self.named_parameters():
            if k in state:
                p.data[...] = np.asarray(state[k], dtype=p.dtype)

    def check_state_dict(self, state, strict=True):
        """The checks of ``load_state_dict`` alone: names (unless ``strict=False``) and shapes of ``state``'s
        values (anything with a ``shape``: arrays, or tensors not read yet) against this module's parameters;
        one ValueError lists every problem."""
        own = dict(self.named_parameters())
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        wrong = [f"{k}: checkpoint {tuple(np.shape(state[k]))} vs model {own[k].shape}"
                 for k in own if k in state and tuple(np.shape(state[k])) != own[k].shape]
        problems = []
        if wrong:
            problems.append("shape mismatch: " + "; ".join(wrong))
        if strict and missing:
            problems.append(f"missing keys: {missing}")
        if strict and unexpected:
            problems.append(f"unexpected keys: {unexpected}")
        if problems:
            raise ValueError("state dict does not fit this model (was it saved from another configuration?): "
                             + " | ".join(problems))

    def astype(self, dtype):
        """Convert every parameter to ``dtype`` in place (e.g. float64 for gradient checks) and drop its
        gradient (``grad`` None); returns self."""
        for m in self.modules():
            for name, p in m._parameters.items():
                p.data = p.data.astype(dtype)
                p.grad = None
            if hasattr(m, "_on_dtype_change"):
                m._on_dtype_change(dtype)
        return self

    @property
    def dtype(self):
        for p in self.parameters():
            return p.dtype
        return np.dtype(np.float32)

    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def clear_cache(self):
        """Drop the activations stored for backward (frees memory after a step or for inference)."""
        for m in self.modules():
            if "_cache" in m.__dict__:
                object.__setattr__(m, "_cache", None)

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"


class ModuleList(Module):
    """A list of modules registered as ``0``, ``1``, ... (dotted names ``layers.0.…``)."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module):
        setattr(self, str(len(self._modules)), module)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        return list(self._modules.values())[i]
