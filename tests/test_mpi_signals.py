"""Stop signals under MPI after the last step: the final phase, and the exit code of SIGTERM.

Each test starts `mpiexec -n 2` on a small script that runs `numformer train` with one function patched to send
a signal at a chosen moment (as test_mpi.py's faults do).
"""
from __future__ import annotations

import json

import pytest

from test_mpi import _config, _launch, _script, _toml, _train_under_fault, needs_mpi

SIGNAL_AT = """
    import os, signal, sys
    from numformer.cli import main
    from numformer.train import final, trainer as trainer_module

    where = sys.argv[1]
    world = []
    finish, evaluate_step, keep = (trainer_module.Trainer._finish, trainer_module.Trainer._evaluate_step,
                                   final.keep_better_weights)

    def to_every_rank(signum):          # what mpiexec does with a Ctrl-C: every rank gets it
        for pid, _ in world[0].pids:
            os.kill(pid, signum)

    def patched_finish(self, *args):
        world.append(self.world)
        return finish(self, *args)

    def patched_evaluate_step(self):    # Ctrl-C while the last step is evaluated (after its Allreduce)
        if where == "last_evaluation" and self.step == self.train_cfg["max_steps"]:
            os.kill(os.getpid(), signal.SIGINT)
        return evaluate_step(self)

    def patched_keep(*args, **kwargs):  # Ctrl-C while rank 0 scores the kept weights
        if where == "scoring":
            to_every_rank(signal.SIGINT)
        return keep(*args, **kwargs)

    trainer_module.Trainer._finish = patched_finish
    trainer_module.Trainer._evaluate_step = patched_evaluate_step
    final.keep_better_weights = patched_keep
    sys.exit(main(["train", *sys.argv[2:]]))
"""


def _train_signalled(tmp_path, where, **train):
    toml = tmp_path / "config.toml"
    toml.write_text(_toml(_config(tmp_path, **train)))
    return _launch(2, [_script(tmp_path, SIGNAL_AT), where, str(toml), "--out", str(tmp_path / "run")])


@needs_mpi
@pytest.mark.parametrize("where", ["scoring", "last_evaluation"])
def test_ctrl_c_in_the_final_phase_ends_as_an_interrupted_run_on_every_rank(tmp_path, where):
    """As alone: the scoring is abandoned, summary.json says interrupted with the saved weights unscored, and
    the job exits with 130 (no rank aborts)."""
    result = _train_signalled(tmp_path, where, max_steps=3, eval_every=3)
    assert result.returncode == 130, result.stderr
    assert "failed" not in result.stderr and "Abort" not in result.stderr, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["stopped_by"] == "interrupted", summary
    assert summary["steps"] == 3 and summary["best_val_loss"] is None and summary["best_step"] == 3, summary


@needs_mpi
def test_sigterm_under_mpi_exits_with_128_plus_its_number(tmp_path):
    """SIGTERM to one rank stops every rank at once (test_mpi.py: its line); the job's exit code is 143, as a
    run alone exits, which Slurm scripts test."""
    result = _train_under_fault(tmp_path, 2, "SIGTERM", 3, tmp_path / "run", _config(tmp_path))
    assert result.returncode == 143, result.stderr
    assert "rank 1 of 2" in result.stderr and "stopped by SIGTERM" in result.stderr


KILL_WORKER = """
    import os, signal, sys
    from numformer.cli import main
    from numformer.train import trainer as trainer_module

    save = trainer_module.Trainer.save_checkpoint

    def patched_save(self):             # rank 1's forked worker killed (as by the OOM killer) before a checkpoint
        if self.world.rank == 1 and self.step == 2:
            worker = self.workers.dp.local._workers[0]
            os.kill(worker.pid, signal.SIGKILL)
            worker.join(5)
        return save(self)

    trainer_module.Trainer.save_checkpoint = patched_save
    sys.exit(main(["train", *sys.argv[1:]]))
"""


@needs_mpi
def test_a_killed_worker_inside_a_rank_is_named_in_the_rank_line(tmp_path):
    toml = tmp_path / "config.toml"
    toml.write_text(_toml(_config(tmp_path, processes=2, batch_size=6)))
    result = _launch(2, [_script(tmp_path, KILL_WORKER), str(toml), "--out", str(tmp_path / "run")])
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "rank 1 of 2" in line]
    assert len(lines) == 1 and "failed: DataParallelError: data-parallel worker 1 exited unexpectedly (exit " \
        "code -9); was it killed for lack of memory?" in lines[0], result.stderr
