"""``numformer train``'s work once its arguments are parsed: train one run, alone or as one of N MPI ranks.

Alone, a run that diverges exits with 2 and one line; under ``mpiexec -n N``
(``numformer.train.mpi``) a bad config is reported once, by rank 0, and a rank
that fails or is told to stop prints one line naming it and stops every rank.
"""
from __future__ import annotations

import sys

from .._runtime import set_num_threads
from .mpi import init_world
from .trainer import TrainingDiverged


def _one_line(error):
    """An exception as one line: its first line, and its last where it spans several (a worker's traceback)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def launch(build):
    """Train the Trainer ``build(world)`` makes (``world``: None alone, else this MPI rank's World); the exit code:
    0 done, 130 interrupted by Ctrl-C (128 + the signal's number for SIGTERM, SIGHUP, SIGUSR1: 143, 129, 138 on
    Linux; the last checkpoint kept; also when the signal came during the final phase), 2 a bad config or a
    diverged run."""
    world = init_world("numformer train")
    if world is None:
        return _train(build(None))
    return _run_rank(build, world)


def _train(trainer, writer=True):
    try:
        summary = trainer.train()
    except TrainingDiverged as e:            # every rank sees the same loss, so every rank stops here
        if writer:
            print(f"numformer train: error: {_one_line(e)}", file=sys.stderr)
        return 2
    return 128 + int(trainer.stop_signal) if summary["interrupted"] or trainer.stop_requested else 0


def _run_rank(build, world):
    """One MPI rank: build the trainer (a bad config is reported once, by rank 0), then train; a rank that
    fails or is told to stop prints one line naming it and stops every rank."""
    set_num_threads(world.cores_per_rank())      # the machine's cores shared among its ranks
    world.stop_on_signals("numformer train")
    trainer, error = None, None
    try:
        trainer = build(world)
    except (ValueError, OSError) as e:
        error = _one_line(e)
    error = world.agree_on_errors(error)
    if not error:                            # every rank built its trainer: each must train rank 0's run
        error = world.disagreement(trainer.config, trainer.data_files)
    if error:
        if world.is_writer:
            print(f"numformer train: error: {error}", file=sys.stderr)
        return 2
    try:
        return _train(trainer, world.is_writer)
    except BaseException as e:               # noqa: BLE001 - any failure of one rank must stop them all
        world.abort(f"numformer train: {world.label()} failed: {type(e).__name__}: {_one_line(e)}; "
                    f"stopping every rank (the last checkpoint is kept)")
