"""Evaluation during training: the token-weighted mean loss over a split (or a fixed sample of it) and the task's
metrics.

    loss, targets = split_loss(model, task, "val", batch_size)          # the whole split
    evaluation = Evaluation(model, task, config["train"])               # a run's evaluations
    evaluation("val")     # {"val_loss": ..., "val_tokens": ..., "accuracy": ...} (or val_loss_estimate)

The loss of a split is Σ cross-entropy over its counted targets / their number (targets equal to IGNORE are
left out), computed in eval mode (no dropout): the figure every yardstick of the run (periodic evaluation,
the weights kept, the test split) uses.
"""
from __future__ import annotations

import math
import time

import numpy as np

from .. import ops
from ..data.base import IGNORE
from .bits_per_byte import byte_count


def mean_loss(model, batches, bytes_seen=None):
    """Token-weighted mean cross-entropy of ``model`` (in eval mode) over ``batches``: (loss, counted targets);
    the loss is NaN when no target is counted. A diverged model's overflows give an infinite or NaN loss,
    without NumPy's warnings. ``bytes_seen``: a ``ByteCount`` that adds up the batches' bits per byte."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for batch in batches:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                logits = model(**batch.inputs)
                loss, cache = ops.cross_entropy_forward(logits, batch.targets, ignore_index=IGNORE)
            n = cache[3]
            total += loss * n
            count += n
            if bytes_seen is not None:
                bytes_seen.add(cache)
            model.clear_cache()
    finally:
        model.train(was_training)
    return (total / count if count else math.nan), int(count)


def split_loss(model, task, split, batch_size, sample=0, seed=0, bytes_seen=None):
    """(loss, counted targets) over a split: all of its evaluation batches, or with ``sample`` a fixed sample of
    that many examples spread over the whole split (``Task.eval_sample``, drawn with ``seed``; the same at
    every call). ``bytes_seen``: a ``ByteCount`` for the bits per byte of the same batches."""
    batches = (task.eval_sample(split, batch_size, sample, seed) if sample
               else task.eval_batches(split, batch_size))
    loss, count = mean_loss(model, batches, bytes_seen)
    if count == 0:
        raise ValueError(f"the {split} split has no evaluation targets")
    return loss, count


def evaluate_loss(model, task, split, batch_size, max_batches=0, seed=0):
    """Token-weighted mean cross-entropy over a split: all of it, or with ``max_batches`` a fixed sample of
    max_batches × batch_size examples spread over the whole split (see ``split_loss``)."""
    return split_loss(model, task, split, batch_size, max_batches * batch_size, seed)[0]


class Evaluation:
    """The evaluations of one run: ``model`` on ``task`` with the run's [train] settings (``train``: eval_batches,
    eval_batch_size, eval_metrics, the seed of the fixed sample). The losses of the whole validation split are
    kept by step (``whole_val_loss``), so that the weights of a step are scored once. ``budget``: the run's
    time budget, told how long evaluations take; ``world``: the MPI world, whose rank 0 alone evaluates."""

    def __init__(self, model, task, train, budget=None, world=None):
        self.model, self.task, self.train, self.budget, self.world = model, task, train, budget, world
        self.batch_size = train["eval_batch_size"] or train["batch_size"]
        self.sizes = {}                 # split -> number of evaluation examples
        self.whole_losses = {}          # step -> whole-validation-split loss of that step's weights
        self.whole_bpb = {}             # step -> its bits per byte (language models: Task.token_bytes)
        self.reports_test = getattr(task, "report_test", False)

    def __call__(self, split="val", full=False, metrics=None):
        """The loss and the task's metrics on a split (``metrics``: whether to compute them; None = the
        ``eval_metrics`` key).

        The loss is over the whole split (``val_loss``, with ``val_tokens`` counted targets) when ``full`` or
        when eval_batches = 0; otherwise over the run's fixed sample of eval_batches × eval_batch_size examples
        spread over the whole split (``val_loss_estimate``): the same sample at every evaluation of the run
        and after a resume (drawn with the run's seed), so that successive evaluations compare like with like.
        Other splits are prefixed with their name (``test_loss``, ``test_tokens``, ``test_accuracy``).
        """
        sample = 0 if full else self.sample_size(split)
        bytes_seen = byte_count(self.task)
        loss, count = self.loss(split, sample, bytes_seen)
        result = {f"{split}_loss_estimate" if sample else f"{split}_loss": loss, f"{split}_tokens": count}
        if bytes_seen is not None:          # bits per byte, for language models (train/bits_per_byte.py)
            result[f"{split}_bpb_estimate" if sample else f"{split}_bpb"] = bytes_seen.bpb
        if self.train["eval_metrics"] if metrics is None else metrics:
            result.update({k if split == "val" else f"{split}_{k}": v for k, v in self.metrics(split).items()})
        return result

    def periodic(self, step):
        """The periodic evaluation of update ``step`` on the validation split (rank 0 evaluates, every rank gets
        its result): (result, the name of its loss: val_loss, or val_loss_estimate on the fixed sample)."""
        started = time.perf_counter()
        result = self("val") if self.world is None or self.world.is_writer else None
        if self.budget is not None:
            self.budget.timed_periodic_evaluation(time.perf_counter() - started)
        if self.world is not None:
            result = self.world.comm.bcast(result, root=0)
        key = "val_loss" if "val_loss" in result else "val_loss_estimate"
        if key == "val_loss":
            self.whole_losses[step] = result[key]
            self.whole_bpb[step] = result.get("val_bpb")
        return result, key

    def metrics(self, split):
        """The task's metrics of the model on ``split`` (in eval mode), timed for the budget."""
        was_training = self.model.training
        self.model.eval()
        started = time.perf_counter()
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # a diverging run's metrics
                metrics = self.task.evaluate(self.model, split)
        finally:
            self.model.train(was_training)
            self.model.clear_cache()
        if self.budget is not None and split == "val":     # the end's test scoring is planned at this rate
            self.budget.timed_metrics(time.perf_counter() - started, self.examples("val", whole=True))
        return metrics

    def time_test_metrics(self):
        """Seconds per example of the task's metrics on the test split scored at the end, timed on a few examples
        by the task where one forward pass per example is no fair guess (``time_metrics``: translation decodes
        word by word, with beam search); else None."""
        timer = getattr(self.task, "time_metrics", None)
        if not self.reports_test or timer is None:
            return None
        was_training = self.model.training
        self.model.eval()
        try:
            return timer(self.model, "test")
        finally:
            self.model.train(was_training)
            self.model.clear_cache()

    def loss(self, split, sample=0, bytes_seen=None):
        """(loss, counted targets) over the whole split, or over the run's fixed sample of ``sample`` examples
        (``bytes_seen``: a ``ByteCount`` of the same batches)."""
        return split_loss(self.model, self.task, split, self.batch_size, sample, self.train["seed"], bytes_seen)

    def selected_on(self):
        """The name of the loss the periodic evaluations select on: val_loss_estimate (the fixed sample) or
        val_loss (the whole split)."""
        return "val_loss_estimate" if self.sample_size("val") else "val_loss"

    def sample_size(self, split):
        """Examples in a capped evaluation's fixed sample (eval_batches × eval_batch_size), or 0 when the
        evaluation covers the whole split (eval_batches = 0, or a split no larger than the sample)."""
        n = self.train["eval_batches"] * self.batch_size
        return n if n and n < self.examples(split, whole=True) else 0

    def examples(self, split, whole=False):
        """The examples of a periodic evaluation (its fixed sample, or the whole split), or of the whole split."""
        if split not in self.sizes:
            self.sizes[split] = self.task.eval_size(split)
        return (not whole and self.sample_size(split)) or self.sizes[split]

    def whole_val_loss(self, step):
        """The loss on the whole validation split of the model's current weights, which are those of ``step``:
        that step's periodic evaluation when it covered the whole split, else computed now."""
        if step not in self.whole_losses:
            bytes_seen = byte_count(self.task)
            self.whole_losses[step] = self.loss("val", 0, bytes_seen)[0]
            self.whole_bpb[step] = None if bytes_seen is None else bytes_seen.bpb
        return self.whole_losses[step]

    def time_one_batch(self):
        """(seconds, examples) of the loss of one validation batch, after an untimed first call (which pays for
        allocations): what a time budget plans the end's evaluations with."""
        batch = next(iter(self.task.eval_batches("val", self.batch_size)))
        mean_loss(self.model, [batch])
        started = time.perf_counter()
        mean_loss(self.model, [batch])
        return time.perf_counter() - started, len(batch.targets)


def describe(result, key, improved):
    """An evaluation's figures in one line: 'val_loss_estimate 2.5012 (4,096 tokens), accuracy 0.9120 (best)'."""
    return (f"{key} {result[key]:.4f}" + (f" ({result['val_tokens']:,} tokens)" if key != "val_loss" else "")
            + "".join(f", {k} {v:.4f}" for k, v in result.items() if k != key and isinstance(v, float))
            + (" (best)" if improved else ""))
