"""The signals that stop a training run at the end of its step, with a checkpoint and summary.json, as Ctrl-C does.

Besides Ctrl-C (SIGINT), what process managers and terminals send to end a process: SIGTERM (``timeout``,
``docker stop``, systemd, Slurm, ``kill``), SIGHUP (the terminal or ssh session closed) and SIGUSR1 (Slurm's
``--signal`` warning before the time limit). The first such signal asks the run to stop after its step (in its
final phase, after its last step: to stop scoring and write summary.json); a second one stops it at once (the
last checkpoint is kept). The forked data-parallel workers ignore them: the
main process stops the run and then its workers.

Under MPI each rank keeps ``train/mpi.py``'s handlers for SIGTERM, SIGHUP and SIGUSR1 (one line, every rank
stopped at once, exit code 128 + the signal's number); only Ctrl-C is handled here, in the final phase too:
rank 0, which alone scores, abandons the scoring, and the ranks agree on the stop (``final.final_scoring``).
"""
from __future__ import annotations

import signal
import threading

from .. import _platform

# The signals a run alone handles (those this platform has: Windows has neither SIGHUP nor SIGUSR1)
ALONE = _platform.signals("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1")
UNDER_MPI = _platform.signals("SIGINT")
# What a forked data-parallel worker ignores (its main process handles them)
WORKER_IGNORES = ALONE


class FinalPhaseStopped(Exception):
    """A first stop signal during a run's final scoring (of the kept weights, of the test split): the scoring,
    whose saves are atomic, is abandoned; the run ends as an interrupted one, which ``--resume`` finishes."""


def name(signum):
    """How the run's messages name a signal: Ctrl-C for SIGINT, else its name (SIGTERM ...)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def install(request, signals):
    """Call ``request(signum)`` on each of ``signals`` instead of their present handlers; returns a function that
    puts the previous handlers back. Outside the main thread (where Python cannot set handlers) nothing is
    installed."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {s: signal.signal(s, lambda signum, frame: request(signum)) for s in signals}

    def restore():
        for s, handler in previous.items():
            signal.signal(s, handler)
    return restore


def ignore_in_worker():
    """In a forked data-parallel worker: leave the stop signals to the main process."""
    for s in WORKER_IGNORES:
        signal.signal(s, signal.SIG_IGN)
