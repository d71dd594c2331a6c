"""Progress of a training run on stderr: a tqdm bar updated in place on a terminal, plain periodic lines
elsewhere (CI, a log file, a pipe). Both show the step, the training loss, tokens/s and the time left."""
from __future__ import annotations

import sys
import time

LINES_PER_RUN = 10          # plain lines: one every tenth of the run's steps ...
LINE_EVERY_S = 30.0         # ... or after this many seconds without one, whichever comes first


def progress(total, initial, terminal, stream=None):
    """A tqdm bar (``terminal``) or a ``PlainProgress``, counting steps from ``initial`` to ``total``."""
    stream = sys.stderr if stream is None else stream
    if terminal:
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True, file=stream)
    return PlainProgress(total, initial, stream)


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

    def __init__(self, total, initial, stream):
        self.total, self.n, self.first = total, initial, initial
        self.stream = stream
        self.every = max(1, (total - initial) // LINES_PER_RUN)
        self.start = self.last_line = time.perf_counter()
        self.figures = {}

    def set_postfix(self, loss=None, tok_s=None, **_):
        self.figures = {"loss": loss, "tok_s": tok_s}

    def update(self, steps=1):
        self.n += steps
        now = time.perf_counter()
        if self.n < self.total and ((self.n - self.first) % self.every == 0 or now - self.last_line >= LINE_EVERY_S):
            self.last_line = now
            elapsed = now - self.start
            left = elapsed / max(self.n - self.first, 1) * (self.total - self.n)
            figures = "".join(part + ", " for part in (
                self.figures.get("loss") and f"train loss {self.figures['loss']}",
                self.figures.get("tok_s") and f"{self.figures['tok_s']} tokens/s") if part)
            self.write(f"step {self.n}/{self.total}: {figures}{clock(elapsed)} elapsed, {clock(left)} left")

    def write(self, message):
        self.stream.write(message + "\n")      # one write, so that another process's line cannot split it
        self.stream.flush()

    def close(self):
        pass
