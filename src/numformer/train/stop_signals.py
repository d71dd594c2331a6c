"""The signals that stop a training run at the end of its step, with a checkpoint and summary.json, as Ctrl-C does.

Besides Ctrl-C (SIGINT), what process managers and terminals send to end a process: SIGTERM (``timeout``,
``docker stop``, systemd, Slurm, ``kill``), SIGHUP (the terminal or ssh session closed) and SIGUSR1 (Slurm's
``--signal`` warning before the time limit). The first such signal asks the run to stop after its step (in its
final phase, after its last step: to stop scoring and write summary.json); a second one stops it at once (the
last checkpoint is kept). The forked data-parallel workers ignore them: the
main process stops the run and then its workers.

A closed output counts as such a signal, SIGPIPE: when the reader of the run's output goes away
(``numformer train ... | head``, a closed ``tee``), the write that fails asks the run to stop after its step,
and the output goes to the null device from then on (without this the run died at that write, losing the
steps since its last checkpoint).

Under MPI each rank keeps ``train/mpi.py``'s handlers for SIGTERM, SIGHUP and SIGUSR1 (one line, every rank
stopped at once, exit code 128 + the signal's number); only Ctrl-C is handled here, in the final phase too:
rank 0, which alone scores, abandons the scoring, and the ranks agree on the stop (``final.final_scoring``).
"""
from __future__ import annotations

import signal
import sys
import threading

from .. import _platform

# The signals a run alone handles (those this platform has: Windows has neither SIGHUP nor SIGUSR1)
ALONE = _platform.signals("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1")
UNDER_MPI = _platform.signals("SIGINT")
# What a forked data-parallel worker ignores (its main process handles them)
WORKER_IGNORES = ALONE


class Aborted(KeyboardInterrupt):
    """A second stop signal: the run stops at once (its last checkpoint kept). A KeyboardInterrupt, so that it
    unwinds as Ctrl-C does; ``signum`` gives the command's exit code, 128 + the signal's number."""

    def __init__(self, signum):
        super().__init__(name(signum))
        self.signum = int(signum)


class FinalPhaseStopped(Exception):
    """A first stop signal during a run's final scoring (of the kept weights, of the test split): the scoring,
    whose saves are atomic, is abandoned; the run ends as an interrupted one, which ``--resume`` finishes."""


def name(signum):
    """How the run's messages name a signal: Ctrl-C for SIGINT, else its name (SIGTERM ...)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def install(request, signals):
    """Call ``request(signum)`` on each of ``signals`` instead of their present handlers, and ``request(SIGPIPE)``
    on the first write to a closed stdout or stderr (``WatchedOutput``); returns a function that puts the
    previous handlers and streams back. Outside the main thread (where Python cannot set handlers) nothing is
    installed."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    asked = []                      # the signals received; a closed output after any of them asks nothing more

    def on_signal(signum, frame):
        asked.append(signum)
        request(signum)

    def output_closed():            # once, whichever stream fails (Ctrl-C also ends `| head`: not a second stop)
        if not asked:
            asked.append(signal.SIGPIPE)
            request(signal.SIGPIPE)

    previous = {s: signal.signal(s, on_signal) for s in signals}
    streams = sys.stdout, sys.stderr
    if hasattr(signal, "SIGPIPE"):                              # POSIX: a pipe's closed end
        sys.stdout, sys.stderr = (WatchedOutput(s, output_closed) for s in streams)

    def restore():
        for s, handler in previous.items():
            signal.signal(s, handler)
        sys.stdout, sys.stderr = streams
    return restore


class WatchedOutput:
    """A stream (stdout or stderr) whose writes cannot fail on a closed pipe: the first BrokenPipeError calls
    ``closed()`` and points the stream at the null device (``_platform.point_at_null_device``); every other
    attribute is the stream's."""

    def __init__(self, stream, closed):
        self._stream, self._closed, self._silent = stream, closed, False

    def write(self, text):
        if not self._silent:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._went_away()
        return len(text)

    def flush(self):
        if not self._silent:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._went_away()

    def _went_away(self):
        self._silent = True
        _platform.point_at_null_device(self._stream)
        self._closed()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def ignore_in_worker():
    """In a forked data-parallel worker: leave the stop signals to the main process."""
    for s in WORKER_IGNORES:
        signal.signal(s, signal.SIG_IGN)
