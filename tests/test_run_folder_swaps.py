"""A run folder swapped under its writer (issue 36): replaced by a link to another run, moved, deleted and made
anew. Every write goes through the descriptor of the folder that was locked, so no swap puts this run's file in
another folder; the writer's next check stops it with one line saying what became of the folder (and where
its files are, to resume there); a write cut short leaves temporary files that the next --resume deletes."""
from __future__ import annotations

import hashlib
import os
import shutil
import sys

import numpy as np
import pytest

from numformer.train import Trainer
from numformer import run_files
from numformer.run_files import CHECKPOINT, MODEL, is_temp_of, temp_name
from numformer.train.run_folder import RUN_FILES, RunFolderBusy, RunFolderGone, lock_for_resuming, lock_for_writing

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="links, moves and /proc/self/fd are made on Linux")

TINY = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
        "data": {"task": "copy", "length": 4, "n_val": 16, "n_test": 16},
        "train": {"max_steps": 10, "batch_size": 4, "eval_every": 5, "checkpoint_every": 5, "log_every": 1,
                  "processes": 1, "dtype": "float64"}}


def snapshot(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def swap(out, how, other):
    """Make ``out`` something else than the folder locked at it; returns where the locked folder is now (None:
    deleted)."""
    moved = out.with_name(out.name + ".moved")
    if how == "deleted and made anew":
        shutil.rmtree(out)
        out.mkdir()
        return None
    os.rename(out, moved)
    if how == "link to another run":
        out.symlink_to(other, target_is_directory=True)
    elif how == "moved and replaced":
        out.mkdir()
    return moved


def _append_metrics(path):
    fd = run_files.open_in_folder(path.with_name("metrics.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, b'{"step": 1}\n')
    os.close(fd)
    return "metrics.jsonl"


class _Tiny:
    """A model and optimizer small enough to save anywhere."""

    def __init__(self):
        from numformer.models import GPT
        from numformer.optim import AdamW

        self.model = GPT(vocab_size=5, block_size=4, n_layers=1, n_heads=1, d_model=4, rng=np.random.default_rng(0))
        self.optimizer = AdamW(self.model.parameters(), lr=1e-3)


WRITERS = {
    "write_atomic": lambda path: run_files.write_atomic(path / CHECKPOINT, b"this run") or CHECKPOINT,
    "write_json_atomic": lambda path: run_files.write_json_atomic(path / "summary.json", {"run": 1}) or "summary.json",
    "save_model": lambda path: run_files.save_model(path / MODEL, _Tiny().model) or MODEL,
    "save_checkpoint": lambda path: (run_files.save_checkpoint(path / CHECKPOINT, *vars(_Tiny()).values(), {})
                                     or CHECKPOINT),
    "append metrics": lambda path: _append_metrics(path / "x"),
}


@pytest.mark.parametrize("how", ["link to another run", "moved", "moved and replaced", "deleted and made anew"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_write_lands_only_in_the_folder_that_was_locked(tmp_path, how, writer):
    """The class: whatever the locked path names when a file is written (a link to another run, a new folder,
    nothing), every writer of run_files writes into the folder that was locked, or nowhere."""
    other, out = tmp_path / "OTHER", tmp_path / "R"
    other.mkdir()
    for name in RUN_FILES:
        (other / name).write_bytes(b"the other run's " + name.encode())
    before = snapshot(other)
    lock = lock_for_writing(out)
    try:
        moved = swap(out, how, other)
        if moved is None:                         # Linux refuses a new file in a deleted folder
            with pytest.raises(ValueError, match="was replaced by another folder"):
                WRITERS[writer](out)
        else:
            name = WRITERS[writer](out)
            assert (moved / name).is_file()           # in the folder that was locked, now at its new place
        assert snapshot(other) == before              # the other run is untouched
        if how in ("moved and replaced", "deleted and made anew"):
            assert list(out.iterdir()) == []          # the new folder receives nothing
        with pytest.raises(RunFolderGone):
            lock.check()
    finally:
        lock.release()


@pytest.mark.parametrize("how, says", [
    ("link to another run", "was replaced by a link (to {other})"),
    ("moved", "was moved or renamed"),
    ("moved and replaced", "was replaced by another folder"),
    ("deleted and made anew", "was replaced by another folder")])
def test_the_check_says_what_became_of_the_folder_and_where_its_files_are(tmp_path, how, says):
    other, out = tmp_path / "OTHER", tmp_path / "R"
    other.mkdir()
    lock = lock_for_writing(out)
    try:
        moved = swap(out, how, other)
        with pytest.raises(RunFolderGone) as e:
            lock.check()
    finally:
        lock.release()
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{out} {says.format(other=other)} while this command was writing")
    if moved is None:
        assert line.endswith("The files it held are gone.")
    else:
        assert f"Every file it held is now in {moved}" in line and f"--resume --out {moved}`" in line


def test_a_link_to_another_run_swapped_in_while_a_checkpoint_is_written(tmp_path):
    """The issue's sequence: R is replaced by a link to another run between the writer's check and its write.
    The other run's checkpoint keeps its own weights; this run's checkpoint is in the folder that was locked
    (now R.moved); the next write stops with one line naming both; R.moved resumes bit for bit."""
    other, out = tmp_path / "OTHER", tmp_path / "R"
    Trainer(TINY, other, quiet=True).train()
    others = snapshot(other)
    quiet_steps = {**TINY, "train": {**TINY["train"], "log_every": 100, "eval_every": 100}}
    trainer = Trainer(quiet_steps, out, quiet=True)
    check = trainer.folder.lock.check

    def check_then_swap():                    # at step 5 the only write is the checkpoint: the swap lands between
        check()                               # its check and its write
        if trainer.step == 5:
            trainer.folder.lock.check = check
            swap(out, "link to another run", other)
    trainer.folder.lock.check = check_then_swap
    moved = tmp_path / "R.moved"
    with pytest.raises(RunFolderGone, match=f"replaced by a link .*now in {moved}"):
        trainer.train(stop_after=6)           # step 5: the checkpoint; step 6: a metrics line, refused
    trainer.close()
    assert trainer.folder.lock.check is check and trainer._checkpoint_step == 5
    assert snapshot(other) == others
    Trainer(None, moved, resume=True, quiet=True).train()
    straight = tmp_path / "straight"
    Trainer(quiet_steps, straight, quiet=True).train()
    a, b = (run_files._load_safetensors(p / CHECKPOINT, "checkpoint")[0] for p in (moved, straight))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_moved_run_folder_says_where_it_went_and_resumes_there_bit_for_bit(tmp_path):
    """`mv R R2` during training: the trainer stops saying R was moved to R2 (not "the files are gone"), and
    R2 resumes to the weights of an uninterrupted run."""
    out, moved = tmp_path / "R", tmp_path / "R2"
    trainer = Trainer(TINY, out, quiet=True)
    trainer.train(stop_after=5)               # a checkpoint at step 5
    os.rename(out, moved)
    with pytest.raises(RunFolderGone) as e:
        trainer.train(stop_after=1)
    trainer.close()
    line = str(e.value)
    assert f"{out} was moved or renamed" in line and f"now in {moved}" in line and "gone" not in line
    Trainer(None, moved, resume=True, quiet=True).train()
    straight = tmp_path / "straight"
    Trainer(TINY, straight, quiet=True).train()
    a, b = (run_files._load_safetensors(p / CHECKPOINT, "checkpoint")[0] for p in (moved, straight))
    assert all(np.array_equal(a[k], b[k]) for k in a)


# -- temporary files of writes cut short ------------------------------------------------------------------------
def test_temporary_names_are_recognised_exactly():
    for name in RUN_FILES:
        assert is_temp_of(temp_name(name), name)
    for foreign in (".checkpoint.safetensors.notes.tmp", ".checkpoint.safetensors.12.deadbeef.tmp.bak",
                    "checkpoint.safetensors.12.deadbeef.tmp", ".checkpoint.safetensors.12.DEADBEEF.tmp",
                    ".checkpoint.safetensors.x12.deadbeef.tmp", ".mine.12.deadbeef.tmp"):
        assert not any(is_temp_of(foreign, name) for name in RUN_FILES), foreign


def test_resume_deletes_the_temporary_files_of_a_killed_write_and_nothing_else(tmp_path):
    out = tmp_path / "R"
    Trainer({**TINY, "train": {**TINY["train"], "max_steps": 5}}, out, quiet=True).train()
    ours = [temp_name(name) for name in (CHECKPOINT, MODEL, "summary.json")]      # what SIGKILL leaves
    foreign = [".checkpoint.safetensors.notes.tmp", ".mine.12.deadbeef.tmp", "notes.txt"]
    for name in ours + foreign:
        (out / name).write_bytes(b"partial")
    trainer = Trainer(None, out, resume=True, quiet=True, overrides=["train.max_steps=10"])
    assert sorted(p.name for p in out.iterdir() if p.name.endswith((".tmp", ".txt"))) == sorted(foreign)
    trainer.train()
    trainer.close()


def test_temporary_files_are_deleted_only_under_the_lock(tmp_path):
    """A folder another process holds is refused before anything in it is deleted."""
    import subprocess

    out = tmp_path / "R"
    out.mkdir()
    leftover = out / temp_name(CHECKPOINT)
    leftover.write_bytes(b"partial")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()",
                               str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderBusy):
            lock_for_resuming(out)
        assert leftover.exists()
    finally:
        holder.stdin.close()
        holder.wait()
    lock_for_resuming(out).release()
    assert not leftover.exists()
