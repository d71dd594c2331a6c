"""Progress of a training run on stderr: a tqdm bar updated in place on a terminal, plain periodic lines
elsewhere (CI, a log file, a pipe). Both show the step, the training loss, tokens/s and the time left."""
from __future__ import annotations

import sys
import time

LINES_PER_RUN = 10          # plain lines: one every tenth of the run's steps ...
LINE_EVERY_S = 30.0         # ... or after this many seconds without one, whichever comes first


def progress(total, initial, terminal, stream=None, time_left=None):
    """A tqdm bar (``terminal``) or a ``PlainProgress``, counting steps from ``initial`` to ``total``; a run
    under a time budget has no total, and ``time_left()`` gives its seconds left."""
    stream = sys.stderr if stream is None else stream
    if terminal:
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True, file=stream)
    return PlainProgress(total, initial, stream, time_left)


def clock(seconds):
    """Seconds as h:mm:ss or m:ss, as tqdm writes them."""
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class PlainProgress:
    """The bar's figures as whole lines, e.g. ``step 200/2000: train loss 2.4512, 25,120 tokens/s, 0:09
    elapsed, 1:21 left``: every tenth of the steps, or ``LINE_EVERY_S`` seconds after the last line. The time
    left extrapolates this call's steps per second (evaluations included). The same interface as the tqdm
    bar where the trainer uses it (``set_postfix``, ``update``, ``write``, ``close``)."""

    def __init__(self, total, initial, stream, time_left=None):
        self.total, self.n, self.first = total, initial, initial
        self.stream = stream
        self.time_left = time_left
        self.every = max(1, (total - initial) // LINES_PER_RUN) if total is not None else None
        self.start = self.last_line = time.perf_counter()
        self.figures = {}

    def set_postfix(self, loss=None, tok_s=None, **_):
        self.figures = {"loss": loss, "tok_s": tok_s}

    def update(self, steps=1):
        self.n += steps
        now = time.perf_counter()
        if self.total is None:      # a time budget: a line every LINE_EVERY_S seconds
            due = now - self.last_line >= LINE_EVERY_S
        else:
            due = self.n < self.total and ((self.n - self.first) % self.every == 0
                                           or now - self.last_line >= LINE_EVERY_S)
        if due:
            self.last_line = now
            elapsed = now - self.start
            if self.total is None:
                left, count = self.time_left(), f"step {self.n}"
            else:
                left, count = elapsed / max(self.n - self.first, 1) * (self.total - self.n), f"step {self.n}/{self.total}"
            figures = "".join(part + ", " for part in (
                self.figures.get("loss") and f"train loss {self.figures['loss']}",
                self.figures.get("tok_s") and f"{self.figures['tok_s']} tokens/s") if part)
            self.write(f"{count}: {figures}{clock(elapsed)} elapsed, {clock(left)} left")

    def write(self, message):
        self.stream.write(message + "\n")      # one write, so that another process's line cannot split it
        self.stream.flush()

    def close(self):
        pass
