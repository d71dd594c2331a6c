"""``numformer exercises train FILE...``: a GPT trained on the learner's own ops, step for step against the library.

The files' functions that pass ``check`` replace numformer's in the model: the ops the modules call through
the dispatch table (``nn.dispatch.using_ops``, inside ``reference_mode()`` so that every other op is the
reference), the loss (``cross_entropy``) and the optimizer's update (``adamw``). Two copies of the first-GPT
configuration (``configs/shakespeare_char.toml``, or its Llama counterpart), in float64, from the same seed,
then train side by side on the same batches: one on the learner's ops, one on the library's references. In
float64 two correct implementations differ only by rounding, so the two loss curves agree to 1e-10 at every
step; an op that is wrong somewhere the checks did not look shows up as the first step where they part.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import ops
from ..config import apply_overrides, load_config, resolve_config
from ..data.base import IGNORE
from ..experiments.runner import find_config
from ..models import build_model
from ..nn.dispatch import OPS, reference_mode, using_ops
from ..optim import clip_grad_norm, train_schedule
from ..train.build import make_optimizer
from . import EXERCISES, Failure, check, format_report, load_functions, wrap
from .checker import raised

MODELS = {"gpt": "shakespeare_char", "llama": "shakespeare_char_llama"}     # configs/NAME.toml
CURVE_TOL = 1e-10          # |your loss - the library's| at every step, float64
# the ops the training loop calls itself rather than through the dispatch table
LOOP_OPS = ("cross_entropy", "adamw")


@dataclass
class Learner:
    """The learner's ops: {exercise name: {function name: function}}, and where each came from."""
    functions: dict
    files: dict

    def dispatch_entries(self):
        """The entries of nn.dispatch.OPS the learner's functions replace."""
        entries = {}
        for name, functions in self.functions.items():
            entries |= _entries(name, functions)
        return entries


def _entries(name, functions):
    """The dispatch entries exercise ``name``'s functions replace: its own ``plug``, else the functions whose
    names are entries of OPS."""
    exercise = EXERCISES[name]
    return exercise.plug(functions) if exercise.plug else {n: f for n, f in functions.items() if n in OPS}


def find_ops(paths):
    """The exercises whose functions the files define (all of an exercise's functions, in one file)."""
    functions, files = {}, {}
    for path in paths:
        try:
            namespace = load_functions(path)
        except Failure as failure:      # a file that does not run: one error line, as ``check`` reports it
            raise ValueError(str(failure)) from None
        found = [e for e in EXERCISES.values() if all(callable(namespace.get(n)) for n in e.names)]
        if not found:
            raise ValueError(f"{path} defines the functions of no exercise (e.g. layer_norm_forward and "
                             f"layer_norm_backward); `numformer exercises list` names them")
        for exercise in found:
            if exercise.name in functions:
                raise ValueError(f"{path} and {files[exercise.name]} both define {exercise.name}; give one")
            functions[exercise.name] = {n: namespace[n] for n in exercise.names}
            files[exercise.name] = path
    return Learner(functions, files)


class Run:
    """One copy of the model, its optimizer and schedule, trained one step at a time."""

    def __init__(self, config, task, learner=None):
        t = self.train = config["train"]
        model_rng, self.data_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(t["seed"]).spawn(2))
        self.model = build_model(config["model"], rng=model_rng, dtype=np.float64)
        self.optimizer = make_optimizer(self.model, t)
        self.schedule = train_schedule(t, config["model"]["d_model"])
        self.task, self.step_number = task, 0
        functions = learner.functions if learner else {}
        self.entries = learner.dispatch_entries() if learner else {}
        self.loss = functions.get("cross_entropy", {
            "cross_entropy_forward": ops.cross_entropy_forward, "cross_entropy_backward": ops.cross_entropy_backward})
        if "adamw" in functions:
            self.optimizer.step_function = functions["adamw"]["adamw_step"]

    def step(self):
        """One training step, as the trainer takes it (batch, forward, loss, backward, clipping, update); its loss."""
        self.optimizer.set_lr(self.schedule(self.step_number))
        batch = self.task.train_batch(self.train["batch_size"], self.data_rng)
        with reference_mode(), using_ops(self.entries), np.errstate(all="ignore"):
            logits = self.model(**batch.inputs)
            loss, cache = self.loss["cross_entropy_forward"](logits, batch.targets, IGNORE,
                                                             self.train["label_smoothing"])
            self.model.backward(self.loss["cross_entropy_backward"](cache, 1.0))
        clip_grad_norm(self.optimizer.params, self.train["grad_clip"])
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.step_number += 1
        return float(loss)


def configure(model="gpt", overrides=()):
    """The resolved config of the first GPT (or its Llama counterpart) in float64, and its task."""
    if model not in MODELS:
        raise ValueError(f"--model must be one of {sorted(MODELS)}, got {model!r}")
    config = apply_overrides(load_config(find_config(MODELS[model])), ["train.dtype=float64", *overrides])
    return resolve_config(config)


def used_by(model_config, learner):
    """(used, unused): the learner's exercises a model of this config runs, and those it never calls."""
    called = _called(model_config)
    used = sorted(name for name, functions in learner.functions.items()
                  if name in LOOP_OPS or set(_entries(name, functions)) & called)
    return used, sorted(set(learner.functions) - set(used))


def _called(model_config):
    """The dispatch names a model of this config calls in a training step (recorded on a one-layer copy)."""
    names = set()
    model = build_model({**model_config, "n_layers": 1}, rng=np.random.default_rng(0), dtype=np.float64)
    with reference_mode(), using_ops({n: _recording(n, names) for n in OPS}):
        model.backward(np.ones(model(np.zeros((1, 4), dtype=np.int64)).shape))
    return names


def _recording(name, names):
    reference = OPS[name][0]

    def recorded(*args, **kwargs):
        names.add(name)
        return reference(*args, **kwargs)
    return recorded


class LearnerStepFailed(Exception):
    """A training step on the learner's ops raised where the library's copy took the same step."""


def side_by_side(yours, library, steps, every, out):
    """Train both copies ``steps`` steps, printing the losses at step 1, every ``every`` steps, at the last and at
    the first step where they part; returns (that step or None, the largest difference). LearnerStepFailed when a
    step on the learner's ops raises and the library's copy takes the step (else the error is numformer's own)."""
    out(f"{'step':>6}  {'your loss':>18}  {'library loss':>18}  {'difference':>10}")
    first_bad, worst = None, 0.0
    for n in range(1, steps + 1):
        try:
            a = yours.step()
        except Exception as e:          # noqa: BLE001 -- an error in the learner's ops, unless the library's fails too
            library.step()
            raise LearnerStepFailed(
                f"Training on your ops stopped at step {n}: {raised('the step', e)}. The library's copy took that "
                f"step, so one of your ops fails on inputs the checks did not try, or returns what the model cannot "
                f"use there (a missing gradient, another shape): train with each file alone to find which.") from e
        b = library.step()
        diff = abs(a - b) if math.isfinite(a) else math.inf
        worst = max(worst, diff)
        if first_bad is None and not diff <= CURVE_TOL:
            first_bad = n
        if n == 1 or n % every == 0 or n == steps or n == first_bad:
            out(f"{n:>6}  {a:>18.12f}  {b:>18.12f}  {diff:>10.1e}")
    return first_bad, worst


def train(paths, steps=300, model="gpt", every=25, overrides=(), out=print):
    """Check the learner's files, then train both copies ``steps`` steps (``overrides``: ``--set`` items of the
    config); returns 0 when the curves agree to CURVE_TOL at every step, 1 otherwise (or when a check fails)."""
    learner = find_ops(paths)
    for name, path in learner.files.items():
        report = check(EXERCISES[name], learner.functions[name])
        if not report.ok:
            out(format_report(report, path))
            out(wrap(f"Fix {name} first: `numformer exercises train` runs ops that pass their check."))
            return 1
    config, task = configure(model, overrides)
    used, unused = used_by(config["model"], learner)
    if not used:
        other = [n for n in unused if EXERCISES[n].in_model and EXERCISES[n].model != model]
        routed = [n for n in unused if EXERCISES[n].route]
        raise ValueError(f"the {model} model calls none of your ops ({', '.join(unused)}), so training would compare "
                         f"the library with itself"
                         + (f"; {', '.join(other)}: train with --model {EXERCISES[other[0]].model}" if other else
                            f"; {routed[0]}: train with --set {EXERCISES[routed[0]].route}" if routed else
                            "; these exercises are checked, not trained"))
    out(wrap(f"Your ops in the model: {', '.join(used) or 'none'}"
             + (f"; not called by this model: {', '.join(unused)}" if unused else "")))
    out(wrap(f"Training {MODELS[model]} (configs/{MODELS[model]}.toml) in float64 for {steps} steps, your ops "
             f"against numformer's references, from the same seed on the same batches:"))
    try:
        first_bad, worst = side_by_side(Run(config, task, learner), Run(config, task), steps, every, out)
    except LearnerStepFailed as e:
        out(wrap(str(e)))
        return 1
    if first_bad is None:
        out(wrap(f"Your ops trained the GPT: its loss equals the library's to {worst:.1e} at every one of the "
                 f"{steps} steps (tolerance {CURVE_TOL:g})."))
        return 0
    random = sorted({"dropout", "scaled_dot_product_attention"} & set(used))
    if config["model"].get("dropout") and random:       # two correct ops draw their masks differently
        out(wrap(f"The curves part at step {first_bad} (difference above {CURVE_TOL:g}) with dropout on: your "
                 f"{', '.join(random)} draw(s) random masks of their own, which need not be numformer's draws "
                 f"(numformer draws float32 uniforms) even when correct. Train with dropout 0 to compare the curves; "
                 f"`numformer exercises check` grades the random part."))
        return 1
    out(wrap(f"The curves part at step {first_bad} (difference above {CURVE_TOL:g}): one of your ops differs from "
             f"numformer's on inputs the checks did not try. Train with each file alone to find which."))
    return 1
