"""SGD, Adam and AdamW, numerically equal to ``torch.optim`` given the same gradients; Muon for the hidden
layers' matrices (with an AdamW for the other parameters).

Each optimizer takes parameters or parameter groups (dicts with "params" and
per-group options, as torch), updates ``Parameter.data`` in place from
``Parameter.grad`` on ``step()``, and skips parameters whose grad is None.
``state_dict()`` returns (arrays, meta): moment buffers as arrays (saved with
safetensors) and step counters / hyperparameters as JSON-able values.
"""
from __future__ import annotations

import math

import numpy as np

from .._runtime import blas_threads, get_num_threads, owns_blas, parallel_for
from ..nn.module import Parameter


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
        name = type(self).__name__
        if isinstance(params, Parameter) or hasattr(params, "named_parameters"):
            raise TypeError(f"{name} takes an iterable of Parameters or of groups (dicts with 'params'), got a "
                            f"{type(params).__name__}: pass model.parameters() (or [param])")
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        if any(not isinstance(g, dict) or "params" not in g for g in groups):
            raise ValueError(f"{name}'s parameter groups are dicts with a 'params' key (and options), got "
                             f"{[sorted(g) if isinstance(g, dict) else type(g).__name__ for g in groups]}")
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
            if not (g.get("weight_decay", 0.0) >= 0 and math.isfinite(g.get("weight_decay", 0.0))):
                raise ValueError(f"weight_decay must be a finite number >= 0, got {g['weight_decay']}")

    @property
    def params(self):
        """Every parameter this optimizer updates (what gradient clipping sees)."""
        return self._own_params()

    def _own_params(self):
        """The parameters of this optimizer's own groups, in order (indices of ``state_dict``)."""
        return [p for g in self.param_groups for p in g["params"]]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def set_lr(self, lr):
        """Set the learning rate of every group (schedules call this before each step)."""
        for g in self.param_groups:
            g["lr"] = lr

    def step(self):
        for p, g, st in self._stepping():
            self._update(p, p.grad, g, st)

    def _stepping(self):
        """(parameter, its group, its state) for every parameter that has a gradient, in group order; a
        parameter's state starts as {"step": 0} the first time."""
        return [(p, g, self.state.setdefault(id(p), {"step": 0}))
                for g in self.param_groups for p in g["params"] if p.grad is not None]

    def _update(self, p, grad, group, state):  # pragma: no cover - abstract
        raise NotImplementedError

    # -- checkpoints ------------------------------------------------------------------
    _buffers: tuple = ()

    def state_dict(self):
        """(arrays, meta): arrays keyed ``"<param index>.<buffer>"``, meta with steps and group options."""
        arrays, steps = {}, {}
        for i, p in enumerate(self._own_params()):
            st = self.state.get(id(p))
            if st is None:
                continue
            steps[str(i)] = st["step"]
            for b in self._buffers:
                if b in st:
                    arrays[f"{i}.{b}"] = st[b]
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        return arrays, {"type": type(self).__name__, "steps": steps, "groups": groups}

    def load_state_dict(self, arrays, meta, keep_options=False):
        """Restore the state saved by ``state_dict``: the moments and step counts, and (as torch does) each
        group's options, such as lr and betas; with ``keep_options`` the groups keep the options this optimizer
        was built with (a resumed run's config decides them), the saved ones being checked all the same.
        ValueError naming the first value that is not what ``state_dict`` writes."""
        if meta.get("type") != type(self).__name__:
            raise ValueError(f"optimizer state is for {meta.get('type')}, not {type(self).__name__}")
        params = self._own_params()
        if len(meta["groups"]) != len(self.param_groups):
            raise ValueError("optimizer state has a different number of parameter groups")
        built = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        for n, (g, saved) in enumerate(zip(self.param_groups, meta["groups"])):
            for key, value in saved.items():
                if key == "params" or key not in g or not _same_kind(value, g[key]):
                    raise ValueError(f"optimizer state: group {n} option {key!r} = {value!r} is not what "
                                     f"{type(self).__name__} saves")
            g.update(saved)
        try:
            self._validate()
        finally:
            if keep_options:
                for g, options in zip(self.param_groups, built):
                    g.update(options)
        self.state = {}
        for i_str, step in meta["steps"].items():
            i = int(i_str)
            if not 0 <= i < len(params):
                raise ValueError(f"optimizer state names parameter {i_str}, the model has {len(params)}")
            if type(step) is not int or step < 0:
                raise ValueError(f"optimizer state: the step count of parameter {i} is {step!r}, not a count")
            st = {"step": step}
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
    """Stochastic gradient descent with torch.optim.SGD's momentum, dampening, Nesterov and L2 weight decay.

    For each parameter p with gradient g (the buffer b only when μ > 0):

        d ← g + wd·p                                  (weight decay added to the gradient)
        b ← d at the first step, then b ← μ·b + (1 - τ)·d
        d ← d + μ·b   (nesterov)   or   d ← b
        p ← p - lr·d

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
            if not (0.0 <= g["momentum"] and 0.0 <= g["dampening"] <= 1.0):
                raise ValueError(f"SGD momentum must be >= 0 and dampening in [0, 1], got {g['momentum']}, "
                                 f"{g['dampening']}")
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


def adam_step(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """One Adam update of ``param``, in place: the equations of ``Adam`` (weight decay added to the gradient).

    param, grad, exp_avg (m), exp_avg_sq (v): arrays of one shape; m and v start at 0 and are updated in place;
    step: t, the number of this update (1 for the first); lr, betas, eps, weight_decay: as Adam's options."""
    if weight_decay:
        grad = grad + weight_decay * param
    _adam_moments_and_update(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps)


def adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
    """One AdamW update of ``param``, in place: the equations of ``AdamW`` (decoupled weight decay).

    param, grad, exp_avg (m), exp_avg_sq (v): arrays of one shape; m and v start at 0 and are updated in place;
    step: t, the number of this update (1 for the first); lr, betas, eps, weight_decay: as AdamW's options."""
    if weight_decay:
        param *= 1.0 - lr * weight_decay
    _adam_moments_and_update(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps)


def _adam_moments_and_update(param, grad, m, v, t, lr, betas, eps):
    beta1, beta2 = betas
    m += (1.0 - beta1) * (grad - m)           # torch: exp_avg.lerp_(grad, 1 - beta1)
    v *= beta2
    v += (1.0 - beta2) * (grad * grad)
    step_size = lr / (1.0 - beta1 ** t)
    denom = np.sqrt(v)
    denom /= math.sqrt(1.0 - beta2 ** t)      # √v̂ = √v / √(1 - β₂ᵗ)
    denom += eps
    param -= step_size * (m / denom)


def _adam_update_in_place(param, grad, m, v, t, lr, betas, eps, scratch):
    """``_adam_moments_and_update`` with its temporaries in one ``scratch`` array of param's shape: the same
    operations on each number in the same order (identical results), without allocating four arrays the size
    of the parameter per update (fresh memory is slower to write than a reused, cached buffer)."""
    beta1, beta2 = betas
    np.subtract(grad, m, out=scratch)           # m += (1 - β₁)(g - m)
    scratch *= 1.0 - beta1
    m += scratch
    v *= beta2                                  # v += (1 - β₂) g²  after  v *= β₂
    np.multiply(grad, grad, out=scratch)
    scratch *= 1.0 - beta2
    v += scratch
    np.sqrt(v, out=scratch)                     # denom = √v / √(1 - β₂ᵗ) + ε
    scratch /= math.sqrt(1.0 - beta2 ** t)
    scratch += eps
    np.divide(m, scratch, out=scratch)          # θ -= lr / (1 - β₁ᵗ) · m / denom
    scratch *= lr / (1.0 - beta1 ** t)
    param -= scratch


class Adam(Optimizer):
    """Adam (Kingma & Ba 2015) with L2 weight decay added to the gradient, as torch.optim.Adam.

    For each parameter p with gradient g, at its t-th update (t = 1, 2 …; m and v start at 0):

        g ← g + wd·p                                  (L2 weight decay, only when wd > 0)
        m ← β₁·m + (1 - β₁)·g,   v ← β₂·v + (1 - β₂)·g²
        p ← p - lr · m̂ / (√v̂ + ε),   m̂ = m / (1 - β₁ᵗ),   v̂ = v / (1 - β₂ᵗ)

    The bias corrections undo the start at 0: after t steps of a constant gradient g, m = (1 - β₁ᵗ)·g.
    The update of one parameter is ``step_function`` (``adam_step``).

    Adam(params, **options): params is an iterable of Parameters or of groups
    (dicts with "params" and per-group options). Options (torch.optim.Adam's):

    - lr (1e-3): learning rate
    - betas ((0.9, 0.999)): (β₁, β₂), each in [0, 1)
    - eps (1e-8): ε
    - weight_decay (0.0): L2 penalty, added to the gradient
    """

    defaults = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    _buffers = ("exp_avg", "exp_avg_sq")
    # the update of one parameter, in place: (param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, wd)
    step_function = staticmethod(adam_step)
    _scratch = np.empty(0, np.float32)      # the built-in update's temporaries (see _builtin_update)

    def _validate(self):
        super()._validate()
        for g in self.param_groups:
            if np.ndim(g["betas"]) != 1 or len(g["betas"]) != 2:
                raise ValueError(f"betas must be a pair (beta1, beta2), got {g['betas']!r}")
            b1, b2 = g["betas"]
            if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
                raise ValueError(f"betas must be in [0, 1), got {g['betas']}")
            if not g["eps"] > 0:
                raise ValueError(f"eps must be > 0, got {g['eps']}")
            g["betas"] = (float(b1), float(b2))

    def _update(self, p, grad, g, st):
        if "exp_avg" not in st:
            st["exp_avg"] = np.zeros_like(p.data)
            st["exp_avg_sq"] = np.zeros_like(p.data)
        st["step"] += 1
        if self.step_function in (adam_step, adamw_step) and grad.dtype == p.data.dtype and p.data.flags.c_contiguous:
            self._builtin_update(p.data, grad, st, g)
            return
        self.step_function(p.data, grad, st["exp_avg"], st["exp_avg_sq"], st["step"], g["lr"], g["betas"], g["eps"],
                           g["weight_decay"])

    def _builtin_update(self, param, grad, st, g):
        """``adam_step`` / ``adamw_step`` (the class's own, not one put in its place), their temporaries in a
        scratch buffer kept for all parameters: the same results."""
        lr, wd = g["lr"], g["weight_decay"]
        if wd and self.step_function is adamw_step:
            param *= 1.0 - lr * wd
        elif wd:
            grad = grad + wd * param
        if self._scratch.size < param.size or self._scratch.dtype != param.dtype:
            self._scratch = np.empty(max(param.size, self._scratch.size), param.dtype)
        scratch = self._scratch[:param.size].reshape(param.shape)
        _adam_update_in_place(param, grad, st["exp_avg"], st["exp_avg_sq"], st["step"], lr, g["betas"], g["eps"],
                              scratch)


class AdamW(Adam):
    """AdamW (Loshchilov & Hutter 2019): Adam with weight decay decoupled from the gradient, as torch.optim.AdamW.

    For each parameter p with gradient g, at its t-th update (t = 1, 2 …; m and v start at 0):

        p ← p · (1 - lr·wd)                           (decoupled weight decay, before the Adam step)
        m ← β₁·m + (1 - β₁)·g,   v ← β₂·v + (1 - β₂)·g²
        p ← p - lr · m̂ / (√v̂ + ε),   m̂ = m / (1 - β₁ᵗ),   v̂ = v / (1 - β₂ᵗ)

    The update of one parameter is ``step_function`` (``adamw_step``).

    AdamW(params, **options): params is an iterable of Parameters or of groups
    (dicts with "params" and per-group options; ``param_groups(model, wd)`` makes
    nanoGPT's groups). Options (torch.optim.AdamW's):

    - lr (1e-3): learning rate
    - betas ((0.9, 0.999)): (β₁, β₂), each in [0, 1)
    - eps (1e-8): ε
    - weight_decay (1e-2): wd, applied to the weights directly
    """

    defaults = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}
    step_function = staticmethod(adamw_step)


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)     # (a, b, c) of Muon's quintic Newton-Schulz iteration


def newton_schulz(g, steps=5, eps=1e-7):
    """An approximately orthogonal matrix with the singular vectors of ``g`` (m, n): Muon's quintic iteration.

    X₀ = G / (‖G‖_F + eps);  X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ,  (a, b, c) = NS_COEFFICIENTS,
    ``steps`` times. On G = U·S·Vᵀ each step maps every singular value σ to φ(σ) = aσ + bσ³ + cσ⁵, so the
    result is U·φ^steps(S/‖G‖_F)·Vᵀ: the coefficients are tuned for speed, not convergence, and after 5
    steps every singular value of at least 0.003·‖G‖_F lies in [0.68, 1.21] instead of at exactly 1. The
    iteration runs on the wide orientation (a tall G is transposed, m > n, so A is the smaller n×n Gram
    matrix, and the result transposed back) in G's dtype. Returns an (m, n) array.
    """
    a, b, c = NS_COEFFICIENTS
    x = np.asarray(g)
    if x.ndim != 2:
        raise ValueError(f"newton_schulz orthogonalizes a matrix, got shape {x.shape}")
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (np.linalg.norm(x) + eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.T if tall else x


def newton_schulz_many(matrices, steps):
    """``[newton_schulz(g, s) for g, s in zip(matrices, steps)]``: the speed path of Muon's step.

    The matrices are divided among numformer's threads (``set_num_threads``), each orthogonalized whole on
    one thread with the BLAS on one thread, so every result is computed by the same operations as
    ``newton_schulz`` on one thread. At Muon's sizes (a few hundred rows) a product is too small for the
    BLAS to gain from threads of its own; whole matrices per thread do. Runs one after another when there
    is one thread, or when the BLAS's thread count cannot be set (two threads calling a multithreaded BLAS
    would oversubscribe the cores). tests/test_muon.py compares it with the reference.
    """
    out = [None] * len(matrices)

    def piece(lo, hi):
        for i in range(lo, hi):
            out[i] = newton_schulz(matrices[i], steps[i])

    if get_num_threads() > 1 and len(matrices) > 1:
        with blas_threads(1) as blas:
            if blas.applied or owns_blas():
                parallel_for(len(matrices), piece, 1)
                return out
    piece(0, len(matrices))
    return out


class Muon(Optimizer):
    """Muon (Keller Jordan 2024): momentum orthogonalized by Newton-Schulz, for 2-D weight matrices.

    For each matrix W (rows, cols) = (out, in) with gradient G:

        M ← μ·M + G                                   (momentum buffer, M₀ = 0)
        U = G + μ·M   (nesterov)   or   U = M
        O = newton_schulz(U, ns_steps)                singular values ≈ 1 (newton_schulz: 0.68 … 1.21)
        W ← W - lr · (√max(1, rows/cols) · O + wd · W)

    The weight decay is decoupled, as AdamW's (lr·wd·W, with Muon's lr), and applied with the W before
    the step. The factor √max(1, rows/cols) keeps the update's RMS size alike for tall matrices.

    Muon(params, adamw=None, **options): params are 2-D Parameters (or groups of them); ``adamw`` an
    optional AdamW over the model's other parameters (embeddings, output head, norms, biases), which
    ``step``, ``zero_grad``, ``params`` and the state dict then include, so that one object serves a
    training loop. ``set_lr(lr)`` sets the AdamW's learning rate to lr and Muon's to lr · lr_ratio, the
    ratio of the two learning rates given at construction (a schedule scales both by one factor);
    without an AdamW, the ratio of lr to ``base_lr`` (the learning rate the schedule's values are relative to;
    None: lr itself, a ratio of 1). Options:

    - lr (0.02): learning rate
    - momentum (0.95): μ, in [0, 1)
    - nesterov (True): Nesterov momentum (U = G + μ·M) rather than U = M
    - ns_steps (5): Newton-Schulz iterations
    - weight_decay (0.0): wd, decoupled
    """

    defaults = {"lr": 0.02, "momentum": 0.95, "nesterov": True, "ns_steps": 5, "weight_decay": 0.0}
    _buffers = ("momentum_buffer",)

    def __init__(self, params, adamw=None, base_lr=None, **options):
        if adamw is not None and not isinstance(adamw, AdamW):
            raise TypeError(f"Muon's adamw must be an AdamW, got {type(adamw).__name__}")
        self.adamw = adamw
        super().__init__(params, **options)
        if adamw is not None and {id(p) for p in self._own_params()} & {id(p) for p in adamw.params}:
            raise ValueError("a parameter is given to both Muon and its AdamW")
        base = adamw.param_groups[0]["lr"] if adamw is not None else base_lr     # what set_lr's lr is relative to
        if base is not None and not base > 0:
            raise ValueError(f"Muon's {'AdamW learning rate' if adamw is not None else 'base_lr'} must be > 0 "
                             f"(set_lr scales Muon's learning rate by the same factor), got {base}")
        for g in self.param_groups:
            g["lr_ratio"] = 1.0 if base is None else g["lr"] / base

    def _validate(self):
        super()._validate()
        for g in self.param_groups:
            if not 0.0 <= g["momentum"] < 1.0:
                raise ValueError(f"Muon momentum must be in [0, 1), got {g['momentum']}")
            if "lr_ratio" in g and not (g["lr_ratio"] > 0 and math.isfinite(g["lr_ratio"])):
                raise ValueError(f"Muon lr_ratio (its learning rate over the AdamW's) must be a finite number > 0, "
                                 f"got {g['lr_ratio']}")
            steps = g["ns_steps"]
            if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
                raise ValueError(f"Muon ns_steps must be an integer >= 1, got {steps!r}")
            for p in g["params"]:
                if p.data.ndim != 2:
                    raise ValueError(f"Muon updates 2-D weight matrices, got a parameter of shape {p.shape}; "
                                     f"give it to the AdamW instead")

    @property
    def params(self):
        return self._own_params() + (self.adamw.params if self.adamw is not None else [])

    def set_lr(self, lr):
        """Muon's groups get lr · lr_ratio, the AdamW's groups lr."""
        for g in self.param_groups:
            g["lr"] = lr * g["lr_ratio"]
        if self.adamw is not None:
            self.adamw.set_lr(lr)

    def step(self):
        """Every matrix's direction U (momentum), their Newton-Schulz together (``newton_schulz_many``, the
        matrices divided among the threads), then the weights; then the AdamW's step."""
        todo = self._stepping()
        directions = [self._direction(p, p.grad, g, st) for p, g, st in todo]
        orthogonal = newton_schulz_many(directions, [g["ns_steps"] for _, g, _ in todo])
        for (p, g, _), o in zip(todo, orthogonal):
            self._apply(p, o, g)
        if self.adamw is not None:
            self.adamw.step()

    @staticmethod
    def _direction(p, grad, g, st):
        """M ← μ·M + G, and the direction U = G + μ·M (nesterov) or M, in p's dtype."""
        st["step"] += 1
        mu = g["momentum"]
        if "momentum_buffer" not in st:
            st["momentum_buffer"] = np.zeros_like(p.data)
        m = st["momentum_buffer"]
        m *= mu
        m += grad
        u = grad + mu * m if g["nesterov"] else m
        return u.astype(p.dtype, copy=False)

    @staticmethod
    def _apply(p, o, g):
        """W ← W - lr · (√max(1, rows/cols) · O + wd · W), the decay applied with the W before the step."""
        rows, cols = p.shape
        scale = math.sqrt(max(1.0, rows / cols))
        if g["weight_decay"]:
            p.data *= 1.0 - g["lr"] * g["weight_decay"]
        p.data -= (g["lr"] * scale) * o

    def state_dict(self):
        """(arrays, meta): Muon's momentum buffers keyed ``"<index>.momentum_buffer"``, the AdamW's arrays keyed
        ``"adamw.<index>.<buffer>"``, its meta under meta["adamw"] (None without an AdamW)."""
        arrays, meta = super().state_dict()
        meta["adamw"] = None
        if self.adamw is not None:
            adamw_arrays, meta["adamw"] = self.adamw.state_dict()
            arrays.update({f"adamw.{k}": v for k, v in adamw_arrays.items()})
        return arrays, meta

    def load_state_dict(self, arrays, meta, keep_options=False):
        """``Optimizer.load_state_dict`` for Muon's groups, then the AdamW's from its part of the state; a
        ValueError when one of the state and this Muon has an AdamW and the other has none."""
        if meta.get("type") == type(self).__name__ and (meta.get("adamw") is None) != (self.adamw is None):
            raise ValueError("optimizer state is for Muon with an AdamW for the other parameters, this Muon has none"
                             if self.adamw is None else
                             "optimizer state is for Muon alone, this Muon has an AdamW for the other parameters")
        super().load_state_dict({k: v for k, v in arrays.items() if not k.startswith("adamw.")}, meta, keep_options)
        if self.adamw is not None:
            self.adamw.load_state_dict({k[len("adamw."):]: v for k, v in arrays.items() if k.startswith("adamw.")},
                                       meta["adamw"], keep_options)


def hidden_matrices(model):
    """The parameters Muon updates: the trainable weight matrices of the hidden layers, in model order, as the
    model's modules answer ``Module.hidden_matrices()`` (a Transformer block: its attention and feed-forward
    matrices). Token embeddings, output heads (tied or not), position tables, norms, biases and frozen
    parameters are not among them."""
    return [p for p in model.hidden_matrices() if p.requires_grad]


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "muon": Muon}


NO_DECAY_KINDS = ("bias", "norm", "embedding")


def param_groups(model, weight_decay, no_decay=("bias", "norm")):
    """A model's trainable parameters as optimizer groups: ``[{"params": decayed, "weight_decay": weight_decay},
    {"params": the others, "weight_decay": 0.0}]`` (the second group only when it has parameters).

    no_decay lists kinds to exclude: "bias" (every ``bias``), "norm" (LayerNorm,
    RMSNorm and batch-statistics norm parameters), "embedding" (token and
    learned position tables; a tied output layer shares the token table); each
    module says which kind its parameters are (``Module.parameter_kind``).
    nanoGPT's rule (decay matrices and embeddings, not biases or norms) is
    ``no_decay=("bias", "norm")``. Frozen parameters (``requires_grad`` False)
    are in no group: no optimizer updates them or keeps state for them.
    """
    bad = set(no_decay) - set(NO_DECAY_KINDS)
    if bad:
        raise ValueError(f"unknown no_decay kind(s) {sorted(bad)}; choose from {list(NO_DECAY_KINDS)}")
    excluded = set()
    for _, m in model.named_modules():
        for name, p in m._parameters.items():
            if p is None:
                continue
            if ("bias" in no_decay and name == "bias") or m.parameter_kind in no_decay:
                excluded.add(id(p))
    trainable = [p for _, p in model.named_parameters() if p.requires_grad]     # frozen ones: no optimizer at all
    decay = [p for p in trainable if id(p) not in excluded]
    keep = [p for p in trainable if id(p) in excluded]
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if keep:
        groups.append({"params": keep, "weight_decay": 0.0})
    return groups
