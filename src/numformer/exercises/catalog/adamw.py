"""Exercise ``adamw``: one AdamW update, in place, as torch.optim.AdamW computes it."""
from __future__ import annotations

import numpy as np

from ... import optim
from ..checker import STANDARD_STEPS, Exercise, Failure, Function, Step, call, difference

SHAPE = (3, 4)


def _state(rng, moments=False):
    """Fresh (param, exp_avg, exp_avg_sq): zero moments (a first step) or moments of earlier steps."""
    param = rng.standard_normal(SHAPE)
    if not moments:
        return param, np.zeros(SHAPE), np.zeros(SHAPE)
    return param, rng.standard_normal(SHAPE) * 0.1, rng.random(SHAPE) * 0.01


def _steps(exercise, learner, reference, grads, first_step=1, moments=False, what="", **options):
    """Run the learner's and the reference's updates from the same state; fail at the first difference."""
    name = exercise.names[0]
    ours = _state(np.random.default_rng(0), moments)
    theirs = tuple(a.copy() for a in ours)
    for n, grad in enumerate(grads):
        t = first_step + n
        call(name, learner[name], *ours[:1], grad.copy(), *ours[1:], t, **options)
        reference[name](theirs[0], grad.copy(), *theirs[1:], t, **options)
        for label, got, want in zip(("param", "exp_avg", "exp_avg_sq"), ours, theirs):
            message = difference(label, got, want)
            if message:
                settings = "".join(f", {k}={v!r}" for k, v in options.items())
                raise Failure(f"{what}after {name}(param, grad, exp_avg, exp_avg_sq, step={t}{settings}):\n"
                              f"{message}")


def _grads(n, seed=1, scale=1.0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE) * scale for _ in range(n)]


def step_in_place(exercise, learner, reference):
    """param, exp_avg and exp_avg_sq are updated in place (same arrays, same dtype); grad is left alone."""
    name = exercise.names[0]
    arrays = _state(np.random.default_rng(0))
    before = tuple(a.copy() for a in arrays)
    grad = _grads(1)[0]
    kept = grad.copy()
    call(name, learner[name], arrays[0], grad, arrays[1], arrays[2], 1)
    if not np.array_equal(grad, kept):
        raise Failure(f"{name} changed grad; it reads the gradient and updates the three other arrays")
    for label, after, old in zip(("param", "exp_avg", "exp_avg_sq"), arrays, before):
        if np.array_equal(after, old):
            raise Failure(f"{name} left {label} unchanged: update the caller's array in place ({label} -= ..., "
                          f"{label} *= ..., or {label}[...] = ...); a new array assigned to the name {label} "
                          f"inside the function is not seen by the caller")
        if after.dtype != np.float64 or after.shape != SHAPE:
            raise Failure(f"{name} changed {label}'s dtype or shape")


def step_one(exercise, learner, reference):
    _steps(exercise, learner, reference, _grads(1))


def step_five(exercise, learner, reference):
    _steps(exercise, learner, reference, _grads(5))


def step_constant_gradient(exercise, learner, reference):
    """Without weight decay, a constant gradient g moves every entry by lr·g / (|g| + ε) at every step: the
    bias corrections undo the moments' start at 0."""
    name, lr, eps = exercise.names[0], 1e-2, 1e-8
    param, m, v = _state(np.random.default_rng(0))
    g = _grads(1)[0]
    for t in range(1, 31):
        before = param.copy()
        call(name, learner[name], param, g.copy(), m, v, t, lr=lr, weight_decay=0.0)
        message = difference("the step", param - before, -lr * g / (np.abs(g) + eps), tol=1e-9)
        if message:
            raise Failure(f"{name} with a constant gradient, weight_decay=0, at step={t}: {message}\n(with moments "
                          f"that start at 0, m̂ = g and v̂ = g² exactly at every step)")


def step_edge_cases(exercise, learner, reference):
    _steps(exercise, learner, reference, [np.zeros(SHAPE)] * 3, what="edge case 'zero gradient' (only the decay "
           "and the moments' decay act): ")
    _steps(exercise, learner, reference, _grads(2), first_step=10_000, moments=True,
           what="edge case 'a late step' (step 10000, moments from earlier steps): ")
    mixed = [g * np.logspace(-6, 3, 12).reshape(SHAPE) for g in _grads(3)]
    _steps(exercise, learner, reference, mixed, what="edge case 'gradients from 1e-6 to 1e3': ")


KEYWORDS = ({"lr": 0.1}, {"betas": (0.8, 0.95)}, {"eps": 1e-3}, {"weight_decay": 0.0},
            {"weight_decay": 0.5, "lr": 0.1})


def step_keywords(exercise, learner, reference):
    for options in KEYWORDS:
        grads = _grads(3, scale=0.01) if "eps" in options else _grads(3)
        _steps(exercise, learner, reference, grads, what=f"keyword case {options}: ", **options)


EXERCISE = Exercise(
    name="adamw",
    summary="one AdamW update in place, as torch.optim.AdamW",
    functions=(
        Function("adamw_step", """\
One AdamW update of ``param``, in place (Loshchilov & Hutter 2019), as
torch.optim.AdamW computes it.

param, grad, exp_avg (m), exp_avg_sq (v): float arrays of one shape. m and v start
at zero before the first update and are updated in place, like param; grad is only
read. step: t, the number of this update (1 for the first).
    θ ← θ (1 - lr·λ)            λ = weight_decay: decoupled, applied first
    m ← β₁ m + (1 - β₁) g,      v ← β₂ v + (1 - β₂) g²
    θ ← θ - lr · m̂ / (√v̂ + ε),  m̂ = m / (1 - β₁ᵗ),  v̂ = v / (1 - β₂ᵗ)
Returns nothing: the caller's arrays hold the result.""",
                 todos=("the decoupled weight decay", "the two moments, in place", "the bias corrections",
                        "the update of param, in place"),
                 positional=5),         # param ... step: by position from the optimizer and the grader
    ),
    reference=optim,
    page="tutorials/block-by-block.md#adamw",
    hints=(
        "In place means the caller's arrays change: param -= ..., param *= ... or param[...] = ... . "
        "param = param - ... only rebinds the local name.",
        "Decoupled weight decay multiplies θ by (1 - lr·λ); it is not added to the gradient (that is Adam's L2 "
        "penalty, torch.optim.Adam's weight_decay).",
        "m and v start at 0, so early on they are too small by the factors (1 - β₁ᵗ) and (1 - β₂ᵗ): divide "
        "them out. Without the corrections the first step is (1 - β₁) / √(1 - β₂) ≈ 3.2 times too large.",
        "ε is added to √v̂, outside the square root.",
    ),
    steps=(STANDARD_STEPS[0],
           Step("in place, shapes and dtype", step_in_place),
           Step("one step against the reference", step_one),
           Step("five steps against the reference", step_five),
           Step("a constant gradient moves by lr·g/(|g| + ε)", step_constant_gradient),
           Step("edge cases", step_edge_cases),
           Step("keyword arguments", step_keywords)),
)
