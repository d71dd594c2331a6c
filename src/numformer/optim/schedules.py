"""Learning-rate schedules and gradient clipping.

A schedule is a linear warmup over ``warmup_steps`` steps followed by a decay shape: the factor the
peak ``lr`` is multiplied by as the run goes from the end of warmup (progress 0) to its end (progress 1),
with ``min_lr`` the floor. For the update of index ``step``:

    lr(step) = lr · (step + 1) / (warmup_steps + 1)     for step < warmup_steps (nanoGPT's warmup; torch's
                                                        LinearLR with start_factor 1 / (warmup_steps + 1))
    lr(step) = min_lr + shape(p) · (lr - min_lr)        afterwards, p the progress (below), clipped to [0, 1]

    constant  shape(p) = 1
    linear    shape(p) = 1 - p
    cosine    shape(p) = (1 + cos(π p)) / 2                 (nanoGPT's get_lr)
    wsd       shape(p) = 1 for p < 1 - c, then 1 - d        (warmup-stable-decay, "trapezoidal": the last
                                                              fraction c = ``cooldown`` decays; d = (p - 1 + c) / c
                                                              is the cooldown's progress, 0 … 1)
              or 1 - √d with ``cooldown_shape = "sqrt"``      (Hägele et al. 2024, "1-sqrt")

The constant schedule ignores ``min_lr``. A run counted in steps has progress p = (step - warmup_steps) /
max(decay_steps - warmup_steps, 1) (decay_steps: [train] decay_steps, else max_steps), so lr is min_lr from
``decay_steps`` on; a run under a wall-clock budget (``[train] budget_minutes``) has the fraction of its
training time spent since warmup ended (``Schedule.at``, ``train.budget.Budget.progress``). ``noam`` is the
paper's schedule, with its own warmup and no end.

Every schedule is a callable ``lr(step)`` with step = 0, 1, 2 … the index of the update about to be
taken.
"""
from __future__ import annotations

import math

import numpy as np


def _warmup(lr, step, warmup_steps):
    # nanoGPT's warmup (the module docstring's formula)
    return lr * (step + 1) / (warmup_steps + 1)


COOLDOWN_DECAYS = {                        # the wsd shape through its cooldown, d its progress 0 … 1
    "linear": lambda d: 1.0 - d,
    "sqrt": lambda d: 1.0 - math.sqrt(d),
}
COOLDOWN_SHAPES = tuple(COOLDOWN_DECAYS)


def _wsd_shape(cooldown, cooldown_shape="linear"):
    if cooldown_shape not in COOLDOWN_DECAYS:
        raise ValueError(f"unknown cooldown_shape {cooldown_shape!r}; choose one of {list(COOLDOWN_SHAPES)}")
    decay = COOLDOWN_DECAYS[cooldown_shape]

    def shape(p):
        return 1.0 if p < 1.0 - cooldown else decay((p - (1.0 - cooldown)) / cooldown)
    return shape


SHAPES = {
    "constant": lambda p: 1.0,
    "linear": lambda p: 1.0 - p,
    "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
}


class Schedule:
    """Warmup, then ``min_lr + shape(progress) · (lr - min_lr)`` (the module docstring's equations); callable by
    step (``lr(step)``) or, for a run planned for a time budget, by the fraction of it done
    (``lr.at(step, progress)``).

    name: "constant", "linear", "cosine" or "wsd" (the shape); lr: the peak learning rate; warmup_steps (0);
    decay_steps (1): the step where the decay reaches min_lr (0.0; "constant" ignores it); cooldown (0.2): the
    c of "wsd"; cooldown_shape ("linear"): its decay, "linear" or "sqrt".
    """

    def __init__(self, name, lr, warmup_steps=0, decay_steps=1, min_lr=0.0, cooldown=0.2, cooldown_shape="linear"):
        self.name, self.lr, self.warmup_steps, self.decay_steps = name, lr, warmup_steps, decay_steps
        self.min_lr = lr if name == "constant" else min_lr
        self.shape = _wsd_shape(cooldown, cooldown_shape) if name == "wsd" else SHAPES[name]

    def at(self, step, progress):
        """The learning rate of update ``step`` when ``progress`` (0 … 1) of the decay is done."""
        if step < self.warmup_steps:
            return _warmup(self.lr, step, self.warmup_steps)
        p = min(max(progress, 0.0), 1.0)
        return self.min_lr + self.shape(p) * (self.lr - self.min_lr)

    def __call__(self, step):
        progress = (step - self.warmup_steps) / max(self.decay_steps - self.warmup_steps, 1)
        return self.at(step, progress)


def constant(lr, warmup_steps=0):
    """lr, after an optional linear warmup."""
    return Schedule("constant", lr, warmup_steps)


def warmup_linear(lr, warmup_steps, decay_steps, min_lr=0.0):
    """Linear warmup to lr, then linear decay to min_lr at ``decay_steps``; min_lr afterwards."""
    return Schedule("linear", lr, warmup_steps, decay_steps, min_lr)


def warmup_cosine(lr, warmup_steps, decay_steps, min_lr=0.0):
    """Linear warmup to lr, then half a cosine down to min_lr at ``decay_steps`` (nanoGPT's get_lr)."""
    return Schedule("cosine", lr, warmup_steps, decay_steps, min_lr)


def warmup_stable_decay(lr, warmup_steps, decay_steps, min_lr=0.0, cooldown=0.2, cooldown_shape="linear"):
    """Linear warmup to lr, lr held, then a decay to min_lr over the last ``cooldown`` fraction of the steps
    after warmup, reaching it at ``decay_steps`` (the trapezoidal / WSD schedule): linear, or 1 - √ of the
    cooldown's progress with ``cooldown_shape="sqrt"``."""
    return Schedule("wsd", lr, warmup_steps, decay_steps, min_lr, cooldown, cooldown_shape)


def noam(d_model, warmup_steps, factor=1.0):
    """The paper's schedule (eq. 3): factor · d_model^-0.5 · min(t^-0.5, t · warmup^-1.5), t = step + 1."""
    def schedule(step):
        t = step + 1
        return factor * d_model ** -0.5 * min(t ** -0.5, t * warmup_steps ** -1.5)
    schedule.at = lambda step, progress: schedule(step)     # no end to plan for
    return schedule


SCHEDULES = ("constant", "linear", "cosine", "wsd", "noam")


def check_decay(name, warmup_steps, decay_steps, keys=""):
    """ValueError when a decaying schedule's ``decay_steps`` (None: max_steps) is not above a ``warmup_steps``
    > 0: lr would fall from its peak to min_lr at once. ``keys``: the prefix naming them ("[train] ")."""
    if (decay_steps and name in ("linear", "cosine", "wsd") and 0 < warmup_steps >= decay_steps):
        raise ValueError(f"{keys}decay_steps = {decay_steps} is not above warmup_steps = {warmup_steps}: lr would "
                         f"drop from its peak to min_lr at once; set decay_steps above warmup_steps (or 0 for "
                         f"max_steps), or lower warmup_steps")


def make_schedule(name, lr, warmup_steps=0, max_steps=1, min_lr=0.0, d_model=512, decay_steps=None,
                  cooldown=0.2, cooldown_shape="linear"):
    """Build a schedule by name (one of ``SCHEDULES``; ValueError otherwise).

    lr: the peak learning rate (for "noam", the factor that scales the paper's formula); warmup_steps (0; "noam"
    needs > 0); decay_steps (None: max_steps, whose default is 1; given, it must exceed a warmup_steps > 0 of a
    decaying schedule): the step where the decay reaches min_lr (0.0);
    d_model (512): "noam"'s; cooldown (0.2): for "wsd", the fraction of the run (after warmup) spent decaying,
    in (0, 1]; cooldown_shape ("linear"): for "wsd", one of ``COOLDOWN_SHAPES``."""
    check_decay(name, warmup_steps, decay_steps)
    decay_steps = max_steps if decay_steps is None else decay_steps
    if name == "noam":
        if warmup_steps <= 0:
            raise ValueError("the noam schedule needs warmup_steps > 0")
        return noam(d_model, warmup_steps, lr)
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {list(SCHEDULES)}")
    if name == "wsd" and not 0 < cooldown <= 1:
        raise ValueError(f"the wsd schedule's cooldown must be in (0, 1], got {cooldown}")
    return Schedule(name, lr, warmup_steps, decay_steps, min_lr, cooldown, cooldown_shape)


def train_schedule(t, d_model=512):
    """The schedule a resolved [train] section ``t`` describes (``make_schedule`` with its keys; a time budget
    plans the decay by time, so its decay_steps is not read)."""
    return make_schedule(t["schedule"], t["lr"], t["warmup_steps"], t["max_steps"], t["min_lr"], d_model=d_model,
                         decay_steps=None if t["budget_minutes"] else t["decay_steps"] or None,
                         cooldown=t["cooldown"],
                         cooldown_shape=t["cooldown_shape"])


def clip_grad_norm(params, max_norm):
    """Scale all gradients in place so their global L2 norm is at most max_norm (torch's clip_grad_norm_).

    params: Parameters (those whose grad is None are skipped). With N = √(Σ over every gradient of Σ g²),
    each g ← g · max_norm / (N + 1e-6) when that factor is < 1. Returns N, the norm before clipping, a float
    (0.0 when no parameter has a gradient). max_norm <= 0 or None only measures (torch would zero the gradients
    for 0).
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
