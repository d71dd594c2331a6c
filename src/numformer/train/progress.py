"""Progress of a training run on stderr: a tqdm bar updated in place on a terminal, plain periodic lines
elsewhere (CI, a log file, a pipe). Both show the step, the latest step's training loss, tokens/s, the latest
evaluation and the time left (under a time budget: the budget's).

A line is written once per interval, never once per step or per evaluation: every tenth of the run (its
steps; under a time budget, its time), or ``LINE_EVERY_S`` seconds after the last line, whichever comes
first. An evaluation is shown in the next line (and, on a terminal, in the bar at once).
"""
from __future__ import annotations

import sys
import time

LINES_PER_RUN = 10          # plain lines: one every tenth of the run ...
LINE_EVERY_S = 30.0         # ... or after this many seconds without one, whichever comes first


def progress(total, initial, terminal, stream=None, time_left=None):
    """A ``TerminalProgress`` (a tqdm bar, ``terminal``) or a ``PlainProgress``, counting steps from ``initial``
    to ``total``; a run under a time budget has no total, and ``time_left()`` gives its seconds left."""
    stream = sys.stderr if stream is None else stream
    if terminal:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True, file=stream)
        return TerminalProgress(bar, total, initial, time_left)
    return PlainProgress(total, initial, stream, time_left)


def run_progress(world, budget, last_step, step):
    """A training run's progress from ``step``: a tqdm bar updated in place where stderr is a terminal (under MPI,
    ``world``: rank 0's, where mpiexec runs in a terminal), else plain periodic lines; under a time budget the
    steps are not known in advance and the bar counts the budget's time left."""
    terminal = sys.stderr.isatty() or (world is not None and world.launched_from_terminal())
    if budget is not None:
        return progress(None, step, terminal, time_left=budget.remaining)
    return progress(last_step, step, terminal)


def clock(seconds):
    """Seconds as h:mm:ss or m:ss, as tqdm writes them."""
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class _Progress:
    """What both forms share: the latest figures (``set_postfix``: the latest step's loss, the learning rate,
    tokens/s; ``evaluation``: the latest evaluation's line) and when the next line is due."""

    def __init__(self, total, initial, time_left=None):
        self.total, self.n, self.first = total, initial, initial
        self.time_left = time_left
        self.every = max(1, (total - initial) // LINES_PER_RUN) if total is not None else None
        span = time_left() if time_left is not None else None       # under a budget: a tenth of its time
        self.every_s = LINE_EVERY_S if span is None else min(LINE_EVERY_S, max(span, 0.0) / LINES_PER_RUN)
        self.start = self.last_line = time.perf_counter()
        self.figures = {}
        self.last_eval = self.shown_eval = None

    def set_postfix(self, **figures):
        self.figures.update({k: v for k, v in figures.items() if v is not None})

    def evaluation(self, step, text):
        """An evaluation's figures (``text``: e.g. ``val_loss 2.5012 (best)``), shown in the next line."""
        self.last_eval = (step, text)

    def _due(self, now):
        """Whether the step just counted ends an interval (never at the last step: the summary follows)."""
        if self.total is None:
            return now - self.last_line >= self.every_s
        return self.n < self.total and ((self.n - self.first) % self.every == 0 or now - self.last_line >= self.every_s)

    def _figures(self):
        """'train loss 2.4512, val_loss 2.5012 (best) at step 200, 25,120 tokens/s' from what is known."""
        f = self.figures
        parts = [f.get("loss") and f"train loss {f['loss']}"]
        if self.last_eval is not None:
            parts.append(f"{self.last_eval[1]} at step {self.last_eval[0]}")
        parts.append(f.get("tok_s") and f"{f['tok_s']} tokens/s")
        return ", ".join(p for p in parts if p)


class PlainProgress(_Progress):
    """The bar's figures as whole lines, e.g. ``step 200/2000: train loss 2.4512, val_loss 2.5012 (best) at step
    200, 25,120 tokens/s, 0:09 elapsed, 1:21 left``, once per interval. The time left extrapolates this call's
    steps per second (evaluations included), or is the time budget's. The same interface as ``TerminalProgress``
    (``set_postfix``, ``evaluation``, ``update``, ``write``, ``close``)."""

    def __init__(self, total, initial, stream, time_left=None):
        super().__init__(total, initial, time_left)
        self.stream = stream

    def update(self, steps=1):
        self.n += steps
        now = time.perf_counter()
        if not self._due(now):
            return
        self.last_line = now
        elapsed = now - self.start
        if self.total is None:
            left, count = self.time_left(), f"step {self.n}"
        else:
            left = elapsed / max(self.n - self.first, 1) * (self.total - self.n)
            count = f"step {self.n}/{self.total}"
        figures = self._figures()
        self.write(f"{count}: {figures + ', ' if figures else ''}{clock(elapsed)} elapsed, {clock(left)} left")

    def write(self, message):
        self.stream.write(message + "\n")      # one write, so that another process's line cannot split it
        self.stream.flush()

    def close(self):
        pass


class TerminalProgress(_Progress):
    """A tqdm bar with the latest figures after it (and, under a time budget, the time left, which tqdm cannot
    tell without a total); once per interval in which an evaluation ran, a line with the figures above it."""

    def __init__(self, bar, total, initial, time_left=None):
        super().__init__(total, initial, time_left)
        self.bar = bar

    def set_postfix(self, **figures):
        super().set_postfix(**figures)
        self._show()

    def evaluation(self, step, text):
        super().evaluation(step, text)
        self._show()

    def update(self, steps=1):
        self.n += steps
        now = time.perf_counter()
        if self._due(now):
            self.last_line = now
            if self.last_eval is not None and self.last_eval != self.shown_eval:
                self.shown_eval = self.last_eval
                self.write(f"step {self.n}: {self._figures()}")
        self._show()
        self.bar.update(steps)          # redraws the bar (at most every tqdm's mininterval)

    def _show(self):
        shown = dict(self.figures)
        if self.last_eval is not None:
            shown["eval"] = self.last_eval[1]
        if self.time_left is not None:
            shown["left"] = clock(self.time_left())
        self.bar.set_postfix(shown, refresh=False)

    def write(self, message):
        self.bar.write(message, file=self.bar.fp)      # above the bar, on the bar's stream

    def close(self):
        self.bar.close()
