"""Early stopping on the validation loss."""
from __future__ import annotations

import math


class EarlyStopping:
    """Stop after ``patience`` evaluations without an improvement larger than ``min_delta``.

    patience = 0 never stops (but still tracks the best value and step).
    """

    def __init__(self, patience=0, min_delta=0.0):
        self.patience, self.min_delta = patience, min_delta
        self.best = math.inf
        self.best_step = None
        self.bad_evals = 0

    def update(self, value, step):
        """Record an evaluation; returns True when ``value`` is below the best by more than min_delta (it is then
        the new best, of ``step``)."""
        if value < self.best - self.min_delta:
            self.best, self.best_step, self.bad_evals = value, step, 0
            return True
        self.bad_evals += 1
        return False

    @property
    def should_stop(self):
        """Whether the last ``patience`` evaluations (patience > 0) brought no improvement."""
        return self.patience > 0 and self.bad_evals >= self.patience

    def stop_reason(self, step):
        """Why a run stops early at ``step``, for its messages."""
        return f"the run stopped early at step {step} (no improvement for {self.patience} evaluations)"

    def state_dict(self):
        return {"best": None if math.isinf(self.best) else self.best, "best_step": self.best_step,
                "bad_evals": self.bad_evals}

    def load_state_dict(self, state):
        self.best = math.inf if state["best"] is None else state["best"]
        self.best_step, self.bad_evals = state["best_step"], state["bad_evals"]
