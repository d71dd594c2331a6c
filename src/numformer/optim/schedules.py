"""Learning-rate schedules (functions of the step) and gradient clipping.

Every schedule is a callable ``lr(step)`` with step = 0, 1, 2 … the index of the
update about to be taken.
"""
from __future__ import annotations

import math

import numpy as np


def constant(lr, warmup_steps=0):
    """lr, after an optional linear warmup."""
    def schedule(step):
        return _warmup(lr, step, warmup_steps) if step < warmup_steps else lr
    return schedule


def _warmup(lr, step, warmup_steps):
    # nanoGPT's warmup: lr·(step+1)/(warmup+1), i.e. torch LinearLR(start_factor=1/(warmup+1), total_iters=warmup).
    return lr * (step + 1) / (warmup_steps + 1)


def warmup_linear(lr, warmup_steps, decay_steps, min_lr=0.0):
    """Linear warmup to lr, then linear decay to min_lr at ``decay_steps``; min_lr afterwards."""
    def schedule(step):
        if step < warmup_steps:
            return _warmup(lr, step, warmup_steps)
        if step >= decay_steps:
            return min_lr
        frac = (step - warmup_steps) / max(decay_steps - warmup_steps, 1)
        return lr + (min_lr - lr) * frac
    return schedule


def warmup_cosine(lr, warmup_steps, decay_steps, min_lr=0.0):
    """Linear warmup to lr, then half a cosine down to min_lr at ``decay_steps`` (nanoGPT's get_lr)."""
    def schedule(step):
        if step < warmup_steps:
            return _warmup(lr, step, warmup_steps)
        if step >= decay_steps:
            return min_lr
        ratio = (step - warmup_steps) / max(decay_steps - warmup_steps, 1)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)
    return schedule


def noam(d_model, warmup_steps, factor=1.0):
    """The paper's schedule (eq. 3): factor · d_model^-0.5 · min(t^-0.5, t · warmup^-1.5), t = step + 1."""
    def schedule(step):
        t = step + 1
        return factor * d_model ** -0.5 * min(t ** -0.5, t * warmup_steps ** -1.5)
    return schedule


SCHEDULES = ("constant", "linear", "cosine", "noam")


def make_schedule(name, lr, warmup_steps=0, max_steps=1, min_lr=0.0, d_model=512, decay_steps=None):
    """Build a schedule by name. For "noam", ``lr`` is the factor that scales the paper's formula."""
    decay_steps = max_steps if decay_steps is None else decay_steps
    if name == "constant":
        return constant(lr, warmup_steps)
    if name == "linear":
        return warmup_linear(lr, warmup_steps, decay_steps, min_lr)
    if name == "cosine":
        return warmup_cosine(lr, warmup_steps, decay_steps, min_lr)
    if name == "noam":
        if warmup_steps <= 0:
            raise ValueError("the noam schedule needs warmup_steps > 0")
        return noam(d_model, warmup_steps, lr)
    raise ValueError(f"unknown schedule {name!r}; choose one of {list(SCHEDULES)}")


def clip_grad_norm(params, max_norm):
    """Scale all gradients so their global L2 norm is at most max_norm (torch's clip_grad_norm_).

    Returns the norm before clipping. max_norm <= 0 or None only measures.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = math.sqrt(sum(float(np.dot(g.ravel(), g.ravel())) for g in grads))
    if max_norm and max_norm > 0:
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for g in grads:
                g *= coef
    return total
