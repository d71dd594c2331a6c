"""The trainer's own state in checkpoint.safetensors (beside the model and the optimizer): the counters, the
random generators, early stopping, the divergence guard, the time budget's clock and the losses since the last
metrics line. ``check_state`` checks what a checkpoint holds before a resumed run uses any of it."""
from __future__ import annotations

import math
import time

import numpy as np


def resumable_step(step, max_steps, run_dir):
    """``step``, the step a checkpoint of ``run_dir`` reached, when a run resumed there can go on to ``max_steps``
    (or, at ``max_steps``, is scored again); a ValueError when ``max_steps`` was set below it."""
    if step > max_steps:
        raise ValueError(f"{run_dir} is at step {step}, past max_steps = {max_steps}: resuming would train nothing; "
                         f"give --set train.max_steps=N with N >= {step}")
    return step


def check_state(state):
    """A checkpoint's trainer state has the fields, types and ranges ``Trainer._state`` writes: counts are
    integers >= 0, times and losses finite numbers (TypeError or KeyError naming the first that is not)."""
    def number(v, none=False, lo=-math.inf):
        return (v is None and none) or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                        and math.isfinite(v) and v >= lo)

    def count(v, none=False):
        return (v is None and none) or (type(v) is int and v >= 0)

    def rng_list(v):
        return v is None or (isinstance(v, list) and all(isinstance(s, (dict, list)) or s is None for s in v))

    early = state["early_stopping"]
    checks = {"step": count(state["step"]), "tokens_seen": count(state["tokens_seen"]),
              "train_seconds": number(state["train_seconds"], lo=0),
              "model_rng": isinstance(state["model_rng"], dict), "data_rng": isinstance(state["data_rng"], dict),
              "early_stopping": isinstance(early, dict) and number(early["best"], none=True)
              and count(early["best_step"], none=True) and count(early["bad_evals"]),
              "worker_rngs": rng_list(state.get("worker_rngs")), "mpi_rngs": rng_list(state.get("mpi_rngs")),
              "metrics_step": count(state.get("metrics_step"), none=True),
              "metrics_digest": state.get("metrics_digest") is None or (
                  isinstance(state["metrics_digest"], str) and len(state["metrics_digest"]) == 64),
              "commits": state.get("commits") is None or (isinstance(state["commits"], list) and all(
                  c is None or isinstance(c, str) for c in state["commits"]))}
    if "divergence" in state:
        d = state["divergence"]
        checks["divergence"] = isinstance(d, dict) and number(d["first_loss"], none=True) and count(d["steps_above"])
    if state.get("budget") is not None:
        b = state["budget"]
        checks["budget"] = (isinstance(b, dict) and number(b["used"], lo=0)
                            and number(b["warmup_end"], none=True, lo=0))
    if "log_window" in state:
        w = state["log_window"]
        checks["log_window"] = (isinstance(w, dict) and isinstance(w["losses"], list)
                                and all(number(x) for x in w["losses"]) and count(w["tokens"]))
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        raise TypeError(f"{bad[0]} is not what a checkpoint holds")


def commits_after_resume(recorded, current, step, say):
    """The commits whose code trained a run resumed by code at ``current``: ``recorded`` (the checkpoint's list;
    None from a checkpoint written before numformer kept it), then ``current`` when it is another. ``say`` gets a
    note when the code changed: the run's figures then come from more than one version of numformer, and
    summary.json lists them (``numformer reproduce`` reuses no such run)."""
    commits = list(recorded or [current])
    if commits[-1] != current:
        say(f"note: this run was trained to step {step} by commit {commits[-1] or 'unknown'} and goes on with "
            f"commit {current or 'unknown'} (the code changed): summary.json lists both")
        commits.append(current)
    return commits


class LogWindow:
    """The training steps since the last regular metrics line (every log_every steps, step 1, max_steps): their
    losses and tokens, when the window began (that line, or this process's start of training), and ``last``,
    the learning rate and gradient norm of the latest step this process added (None before one).

    A train() call that stops between two regular lines (early stopping, the time limit or budget, Ctrl-C,
    ``stop_after``, a divergence) ends metrics.jsonl with a line for its last step over the window, averaged as
    the regular lines are, and marked ``"partial": true`` (``log_stop``). The window stays: the checkpoint of the
    stop holds its losses and tokens, so a run resumed there (or a further train() call) drops that line at its
    first step (``drop_partial``) and logs those steps again in its next line, as an uninterrupted run does: the
    same lines, never two for one step. A resumed run that takes no step (its budget spent, say) keeps the line,
    the record of its last step. ``partial_step``: the step of such a line, ending metrics.jsonl.

    tokens/s is over the tokens of the steps timed since ``start`` (``timed_tokens``): a window restored from a
    checkpoint holds tokens of steps taken before the stop, which this process did not time."""

    def __init__(self, losses=(), tokens=0):
        self.losses, self.tokens = list(losses), tokens
        self.last = None
        self.partial_step = None
        self.restart_clock()

    def restart_clock(self):
        """Time the window from now (a new window, or the start of a train() call)."""
        self.start, self.timed_tokens = time.perf_counter(), 0

    def add(self, loss, tokens, lr, grad_norm):
        self.losses.append(loss)
        self.tokens += tokens
        self.timed_tokens += tokens
        self.last = (lr, grad_norm)

    def line(self, step, elapsed_s, partial=False):
        """The training line of update ``step`` (the latest added): the mean loss of the window's steps and the
        tokens/s of those timed here, that step's learning rate and gradient norm (before clipping), the
        training seconds so far."""
        lr, grad_norm = self.last
        record = {"step": step, "train_loss": float(np.mean(self.losses)), "lr": lr, "grad_norm": grad_norm,
                  "tokens_per_s": self.timed_tokens / max(time.perf_counter() - self.start, 1e-9),
                  "elapsed_s": round(elapsed_s, 3)}
        return {**record, "partial": True} if partial else record

    def log_stop(self, folder, step, elapsed_s):
        """At the end of a train() call (``folder``: its RunWriter): the partial line of ``step``, the last step
        taken, unless a line already logs it or no step was taken since the window was restored."""
        if self.last is not None and self.partial_step != step:
            folder.log(self.line(step, elapsed_s, partial=True))
            self.partial_step = step

    def drop_partial(self, folder):
        """At a step after a stop: remove the stop's partial line from metrics.jsonl; this window logs its steps."""
        if self.partial_step is not None:
            folder.truncate_metrics(self.partial_step, keep_partial=False)
            self.partial_step = None

    def state_dict(self):
        return {"losses": list(self.losses), "tokens": self.tokens}


DIVERGENCE_FACTOR = 3.0     # the training loss above this multiple of its first value ...
DIVERGENCE_STEPS = 20       # ... for this many steps in a row stops the run as diverged


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became NaN or infinite, or the loss stayed far above its start."""


class DivergenceGuard:
    """Stops a run whose training loss stays above DIVERGENCE_FACTOR times its first value for DIVERGENCE_STEPS
    steps in a row (a learning rate far too high can explode the loss without a NaN). ``steps_above``: the
    steps in a row so far (a periodic checkpoint is not written while it is > 0)."""

    def __init__(self, first_loss=None, steps_above=0):
        self.first_loss, self.steps_above = first_loss, steps_above

    def check(self, loss, step):
        """Count update ``step``'s training loss; TrainingDiverged when the run has diverged."""
        if self.first_loss is None:
            self.first_loss = loss
        self.steps_above = self.steps_above + 1 if loss > DIVERGENCE_FACTOR * self.first_loss else 0
        if self.steps_above >= DIVERGENCE_STEPS:
            raise TrainingDiverged(f"the training loss diverged: {loss:.4g} at step {step}, above "
                                   f"{DIVERGENCE_FACTOR:g} times its first value ({self.first_loss:.4g}) for "
                                   f"{DIVERGENCE_STEPS} steps")

    def state_dict(self):
        return {"first_loss": self.first_loss, "steps_above": self.steps_above}
