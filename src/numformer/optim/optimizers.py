"""SGD, Adam and AdamW, numerically equal to ``torch.optim`` given the same gradients.

Each optimizer takes parameters or parameter groups (dicts with "params" and
per-group options, as torch), updates ``Parameter.data`` in place from
``Parameter.grad`` on ``step()``, and skips parameters whose grad is None.
``state_dict()`` returns (arrays, meta): moment buffers as arrays (saved with
safetensors) and step counters / hyperparameters as JSON-able values.
"""
from __future__ import annotations

import math

import numpy as np

from ..nn.layers import BatchStatNorm, Embedding, LayerNorm, RMSNorm
from ..nn.module import Parameter
from ..nn.positional import LearnedPositionalEncoding


class Optimizer:
    """Base class: ``Optimizer(params, **options)``, the options being the keys of ``defaults``.

    An unknown option raises a ValueError listing the valid ones. ``step()`` updates every
    parameter that has a gradient; ``zero_grad()`` clears them; ``set_lr(lr)`` sets every group's
    learning rate (what a schedule calls before each step).
    """

    defaults: dict = {}

    def __init__(self, params, **options):
        unknown = set(options) - set(self.defaults)
        if unknown:
            raise ValueError(f"{type(self).__name__} has no option(s) {sorted(unknown)}; "
                             f"valid: {sorted(self.defaults)}")
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups = []
        seen = set()
        for g in groups:
            g = {**self.defaults, **options, **g}
            g["params"] = list(g["params"])
            for p in g["params"]:
                if not isinstance(p, Parameter):
                    raise TypeError(f"optimizer parameters must be numformer Parameters, got {type(p).__name__}")
                if id(p) in seen:
                    raise ValueError("a parameter appears in more than one group")
                seen.add(id(p))
            self.param_groups.append(g)
        self.state = {}     # id(param) -> {"step": int, buffers...}
        self._validate()

    def _validate(self):
        for g in self.param_groups:
            if not (isinstance(g["lr"], (int, float, np.number)) and not isinstance(g["lr"], bool)):
                raise TypeError(f"learning rate must be a number, got {type(g['lr']).__name__}")
            if not g["lr"] >= 0 or not math.isfinite(g["lr"]):
                raise ValueError(f"learning rate must be a finite number >= 0, got {g['lr']}")

    @property
    def params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def set_lr(self, lr):
        """Set the learning rate of every group (schedules call this before each step)."""
        for g in self.param_groups:
            g["lr"] = lr

    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                self._update(p, p.grad, g, self.state.setdefault(id(p), {"step": 0}))

    def _update(self, p, grad, group, state):  # pragma: no cover - abstract
        raise NotImplementedError

    # -- checkpoints ------------------------------------------------------------------
    _buffers: tuple = ()

    def state_dict(self):
        """(arrays, meta): arrays keyed "<param index>.<buffer>", meta with steps and group options."""
        arrays, steps = {}, {}
        for i, p in enumerate(self.params):
            st = self.state.get(id(p))
            if st is None:
                continue
            steps[str(i)] = st["step"]
            for b in self._buffers:
                if b in st:
                    arrays[f"{i}.{b}"] = st[b]
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        return arrays, {"type": type(self).__name__, "steps": steps, "groups": groups}

    def load_state_dict(self, arrays, meta):
        if meta.get("type") != type(self).__name__:
            raise ValueError(f"optimizer state is for {meta.get('type')}, not {type(self).__name__}")
        params = self.params
        if len(meta["groups"]) != len(self.param_groups):
            raise ValueError("optimizer state has a different number of parameter groups")
        for n, (g, saved) in enumerate(zip(self.param_groups, meta["groups"])):
            for key, value in saved.items():
                if key == "params" or key not in g or not _same_kind(value, g[key]):
                    raise ValueError(f"optimizer state: group {n} option {key!r} = {value!r} is not what "
                                     f"{type(self).__name__} saves")
            g.update(saved)
        self._validate()
        self.state = {}
        for i_str, step in meta["steps"].items():
            i = int(i_str)
            if i >= len(params):
                raise ValueError("optimizer state has more parameters than the model")
            st = {"step": int(step)}
            for b in self._buffers:
                key = f"{i}.{b}"
                if key in arrays:
                    if arrays[key].shape != params[i].shape:
                        raise ValueError(f"optimizer buffer {key} has shape {arrays[key].shape}, "
                                         f"parameter has {params[i].shape}")
                    st[b] = np.array(arrays[key], dtype=params[i].dtype)
            self.state[id(params[i])] = st


def _same_kind(saved, current):
    """Whether a saved group option has the kind of the current one: a flag, a finite number, or a sequence of
    as many finite numbers (betas)."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if isinstance(current, bool):
        return isinstance(saved, bool)
    if isinstance(current, (tuple, list)):
        return isinstance(saved, (tuple, list)) and len(saved) == len(current) and all(number(v) for v in saved)
    if current is None:
        return saved is None or number(saved)
    return number(saved)


class SGD(Optimizer):
    """p ← p - lr · d, with d = g + wd·p, optionally momentum (b ← μb + (1-τ)d) and Nesterov (d ← d + μb).

    SGD(params, **options): params is an iterable of Parameters or of groups
    (dicts with "params" and per-group options). Options (torch.optim.SGD's):

    - lr (1e-3): learning rate
    - momentum (0.0): μ
    - dampening (0.0): τ
    - weight_decay (0.0): wd, added to the gradient
    - nesterov (False): Nesterov momentum (needs momentum > 0 and dampening 0)
    """

    defaults = {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False}
    _buffers = ("momentum_buffer",)

    def _validate(self):
        super()._validate()
        for g in self.param_groups:
            if g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0):
                raise ValueError("Nesterov momentum needs momentum > 0 and dampening = 0")

    def _update(self, p, grad, g, st):
        st["step"] += 1
        d = grad + g["weight_decay"] * p.data if g["weight_decay"] else grad
        mu = g["momentum"]
        if mu:
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = np.array(d, copy=True)
            else:
                buf = st["momentum_buffer"]
                buf *= mu
                buf += (1.0 - g["dampening"]) * d
            buf = st["momentum_buffer"]
            d = d + mu * buf if g["nesterov"] else buf
        p.data -= g["lr"] * d


class Adam(Optimizer):
    """Adam (Kingma & Ba 2015) with torch's L2 weight decay (added to the gradient).

    m ← β₁m + (1-β₁)g,  v ← β₂v + (1-β₂)g²,
    p ← p - (lr / (1-β₁ᵗ)) · m / (√v / √(1-β₂ᵗ) + ε)

    Adam(params, **options): params is an iterable of Parameters or of groups
    (dicts with "params" and per-group options). Options (torch.optim.Adam's):

    - lr (1e-3): learning rate
    - betas ((0.9, 0.999)): (β₁, β₂), each in [0, 1)
    - eps (1e-8): ε
    - weight_decay (0.0): L2 penalty, added to the gradient
    """

    defaults = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    _buffers = ("exp_avg", "exp_avg_sq")
    decoupled = False

    def _validate(self):
        super()._validate()
        for g in self.param_groups:
            b1, b2 = g["betas"]
            if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
                raise ValueError(f"betas must be in [0, 1), got {g['betas']}")
            g["betas"] = (float(b1), float(b2))

    def _update(self, p, grad, g, st):
        beta1, beta2 = g["betas"]
        lr, wd = g["lr"], g["weight_decay"]
        if "exp_avg" not in st:
            st["exp_avg"] = np.zeros_like(p.data)
            st["exp_avg_sq"] = np.zeros_like(p.data)
        st["step"] += 1
        t = st["step"]
        if wd:
            if self.decoupled:
                p.data *= 1.0 - lr * wd
            else:
                grad = grad + wd * p.data
        m, v = st["exp_avg"], st["exp_avg_sq"]
        m += (1.0 - beta1) * (grad - m)           # torch: exp_avg.lerp_(grad, 1 - beta1)
        v *= beta2
        v += (1.0 - beta2) * (grad * grad)
        step_size = lr / (1.0 - beta1 ** t)
        denom = np.sqrt(v)
        denom /= math.sqrt(1.0 - beta2 ** t)
        denom += g["eps"]
        p.data -= step_size * (m / denom)


class AdamW(Adam):
    """AdamW (Loshchilov & Hutter 2019): weight decay decoupled from the gradient, p ← p(1 - lr·wd) first.

    AdamW(params, **options): params is an iterable of Parameters or of groups
    (dicts with "params" and per-group options; ``param_groups(model, wd)`` makes
    nanoGPT's groups). Options (torch.optim.AdamW's):

    - lr (1e-3): learning rate
    - betas ((0.9, 0.999)): (β₁, β₂), each in [0, 1)
    - eps (1e-8): ε
    - weight_decay (1e-2): wd, applied to the weights directly
    """

    defaults = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}
    decoupled = True


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


NO_DECAY_KINDS = ("bias", "norm", "embedding")


def param_groups(model, weight_decay, no_decay=("bias", "norm")):
    """Split a model's parameters into a decayed group and a group without weight decay.

    no_decay lists kinds to exclude: "bias" (every ``bias``), "norm" (LayerNorm,
    RMSNorm and batch-statistics norm parameters), "embedding" (token and
    learned position tables; a tied output layer shares the token table).
    nanoGPT's rule (decay matrices and embeddings, not biases or norms) is
    ``no_decay=("bias", "norm")``.
    """
    bad = set(no_decay) - set(NO_DECAY_KINDS)
    if bad:
        raise ValueError(f"unknown no_decay kind(s) {sorted(bad)}; choose from {list(NO_DECAY_KINDS)}")
    excluded = set()
    for _, m in model.named_modules():
        for name, p in m._parameters.items():
            if p is None:
                continue
            if ("bias" in no_decay and name == "bias") or \
               ("norm" in no_decay and isinstance(m, (LayerNorm, RMSNorm, BatchStatNorm))) or \
               ("embedding" in no_decay and isinstance(m, (Embedding, LearnedPositionalEncoding))):
                excluded.add(id(p))
    decay = [p for _, p in model.named_parameters() if id(p) not in excluded]
    keep = [p for _, p in model.named_parameters() if id(p) in excluded]
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if keep:
        groups.append({"params": keep, "weight_decay": 0.0})
    return groups
