"""A wall-clock budget for a whole training run (``[train] budget_minutes``).

The budget covers everything from the trainer's construction to the end of ``train()``: setup, training
steps, periodic evaluations and checkpoints, and the final phase (the whole-validation-split loss of the
weights kept, the last checkpoint and model.safetensors). The run is planned for it, not for a step count:

    progress = (used - used_at_warmup_end) / (budget - reserve - used_at_warmup_end)

is what the learning-rate schedule decays over (``Schedule.at``), and a step is taken only when it fits:

    used + next step + reserve <= budget

``reserve`` is the final phase's measured cost: the seconds per evaluation example (timed on one batch of the
validation split at the start) times the split's examples, once per whole-split evaluation the end runs;
for a task that scores the kept weights on its test split at the end (classification, translation), the
test examples at that rate plus the task's metrics at their rate (a task whose metrics decode, translation,
times them on a few test examples at the start: ``Task.time_metrics``; else timed at each periodic evaluation
that computes them, and before the first, one more forward pass per example); plus the measured time of
saving a checkpoint and the weights, with a margin. A periodic evaluation or checkpoint due after the next step is
counted with its own measured time.
"""
from __future__ import annotations

import time
from collections import deque

MARGIN = 1.5             # the reserve's safety factor on measured times ...
MARGIN_S = 1.0           # ... plus this many seconds
SAVE_BYTES_PER_S = 100e6  # the guess of a save's speed before one is timed


class Budget:
    """The clock of a run under a time budget of ``seconds``; ``used`` seconds were spent by earlier parts of
    a resumed run (``warmup_end``: the budget used when warmup ended, if it has)."""

    def __init__(self, seconds, used=0.0, warmup_end=None):
        self.seconds = float(seconds)
        self.used_before = float(used)
        self.warmup_end = warmup_end
        self.start = time.perf_counter()
        self.step_seconds = deque(maxlen=20)     # the latest training steps' durations
        self.eval_seconds_per_example = 0.0      # of a whole-split evaluation
        self.periodic_eval_seconds = 0.0         # of the latest periodic evaluation
        self.save_seconds = 0.0
        self.final_evaluations = 1               # whole-split evaluations the end runs
        self.val_examples = 0
        self.test_examples = 0                   # scored (loss and metrics) at the end; 0: no test scoring
        self.metric_seconds_per_example = None   # of the task's metrics, once a periodic evaluation timed them
        self.test_metric_seconds_per_example = None   # of the test split's metrics, where the task times them

    def used(self):
        """Seconds of the budget spent so far (earlier parts of a resumed run included)."""
        return self.used_before + time.perf_counter() - self.start

    def guess_save_seconds(self, n_bytes):
        """Before any save is timed: the time of writing ``n_bytes`` (checkpoint: weights and moments)."""
        self.save_seconds = max(self.save_seconds, n_bytes / SAVE_BYTES_PER_S)

    def timed_save(self, seconds):
        self.save_seconds = seconds

    def timed_evaluation(self, seconds, examples):
        """A batch of the whole-split evaluation took ``seconds`` for ``examples`` examples."""
        if examples:
            self.eval_seconds_per_example = seconds / examples

    def timed_periodic_evaluation(self, seconds):
        self.periodic_eval_seconds = seconds

    def timed_metrics(self, seconds, examples):
        """The task's metrics took ``seconds`` over a split of ``examples`` examples."""
        if examples:
            self.metric_seconds_per_example = seconds / examples

    def reserve(self):
        """Seconds kept for the final phase: its whole-split evaluations, the test split's scoring (its loss and
        the task's metrics), a checkpoint and the weights."""
        per_example = self.eval_seconds_per_example
        metrics = next(rate for rate in (self.test_metric_seconds_per_example, self.metric_seconds_per_example,
                                         per_example) if rate is not None)
        evaluations = (self.final_evaluations * self.val_examples * per_example
                       + self.test_examples * (per_example + metrics))
        return MARGIN * (evaluations + 2 * self.save_seconds) + MARGIN_S

    def progress(self, step, warmup_steps):
        """The fraction (0 … 1) of the run's decay done at update ``step``: 0 during warmup, then the share of
        the training time left after warmup that has been spent."""
        if step < warmup_steps:
            return 0.0
        used = self.used()
        if self.warmup_end is None:
            self.warmup_end = used
        end = self.seconds - self.reserve()
        return min(1.0, max(0.0, (used - self.warmup_end) / max(end - self.warmup_end, 1e-9)))

    def fits(self, extra=0.0):
        """Whether one more training step (and ``extra`` seconds of evaluation or checkpoint after it) ends
        before the reserve: the step's time is the slowest of the latest steps."""
        step = max(self.step_seconds) if self.step_seconds else 0.0
        return self.used() + step + extra + self.reserve() <= self.seconds

    def remaining(self):
        return max(0.0, self.seconds - self.used())

    def plan(self, evaluation, restore_best, save_bytes):
        """Before the first step: measure what the end costs (``evaluation``: the run's ``Evaluation``): the
        seconds per evaluation example, on one batch; the whole-split evaluations the end runs (two with
        ``restore_best``, which scores two sets of weights), the test split it scores; a first guess of a
        save's time (``save_bytes``: the checkpoint's weights and moments); the test metrics' rate where the task
        times it (``Evaluation.time_test_metrics``)."""
        self.val_examples = evaluation.examples("val", whole=True)
        self.final_evaluations = 2 if restore_best else 1
        self.test_examples = evaluation.examples("test", whole=True) if evaluation.reports_test else 0
        self.guess_save_seconds(save_bytes)
        self.timed_evaluation(*evaluation.time_one_batch())
        if self.test_examples:
            self.test_metric_seconds_per_example = evaluation.time_test_metrics()

    def after_step(self, evaluates, examples, checkpoints):
        """The seconds the next step adds beyond its update: its evaluation (``evaluates``, of ``examples``
        examples: before the first, at the whole split's rate) and its checkpoint (``checkpoints``) when due."""
        extra = (self.periodic_eval_seconds or self.eval_seconds_per_example * examples) if evaluates else 0.0
        return extra + (self.save_seconds if checkpoints else 0.0)


def budget_for(train, world, clock_start):
    """The clock of a run planned for [train] budget_minutes, started at ``clock_start``; None without one."""
    if not train["budget_minutes"]:
        return None
    if world is not None:
        raise ValueError("[train] budget_minutes is not available under MPI (the ranks would have to agree on the "
                         "clock); use max_steps, or max_minutes for a time limit")
    budget = Budget(60 * train["budget_minutes"])
    budget.start = clock_start
    return budget
