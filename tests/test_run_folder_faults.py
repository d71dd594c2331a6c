"""Faults made for real against a run folder (issue 27): a folder deleted or replaced under a running training,
export into a run folder, symbolic links inside it, Ctrl-C then --resume, divergence then the advised recovery.
Each ends with exit code 2 and one line naming the file (or the same results as without the fault), the folder
consistent (loaded and evaluated) and nothing written outside the folder the user named."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import freeze, one_error_line, tiny_copy_toml

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the faults are made with POSIX signals and links")

LONG = tiny_copy_toml(max_steps=100000, batch_size=4, eval_every=1000, checkpoint_every=1000, log_every=1,
                      processes=1)
SHORT = tiny_copy_toml(max_steps=20, batch_size=4, eval_every=10, checkpoint_every=10, processes=1)


def cli(*args):
    return [sys.executable, "-m", "numformer.cli", *map(str, args)]


def env():
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    return {**os.environ, "PYTHONPATH": os.path.abspath(src) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run(*args, timeout=300):
    done = subprocess.run(cli(*args), capture_output=True, text=True, env=env(), timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def snapshot(folder):
    """name -> sha256 of every file under ``folder`` (recursively), to show what changed."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def assert_evaluates(run_dir):
    rc, out, err = run("eval", run_dir, "--json")
    assert rc == 0, err
    return json.loads(out)


def start(*args):
    return subprocess.Popen(cli(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())


def wait_for_step(proc, metrics, step, timeout=120):
    """Wait until ``metrics`` (a metrics.jsonl) logs ``step`` or later while ``proc`` runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            lines = metrics.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        if lines and json.loads(lines[-1] if lines[-1].endswith("}") else lines[-2])["step"] >= step:
            return
        time.sleep(0.005)
    raise AssertionError(f"{metrics} did not reach step {step}")


def remove(folder):
    """``rm -rf folder`` while a training may still add a file to it (then remove again)."""
    while folder.exists():
        shutil.rmtree(folder, ignore_errors=True)


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


@pytest.fixture
def cfgs(tmp_path):
    (tmp_path / "long.toml").write_text(LONG)
    (tmp_path / "short.toml").write_text(SHORT)
    return tmp_path / "long.toml", tmp_path / "short.toml"


# -- 1: a run folder deleted or replaced under a running training ----------------------------------------------
@pytest.mark.parametrize("fault", ["deleted", "replaced"])
def test_a_deleted_or_replaced_folder_stops_its_writer(tmp_path, cfgs, fault):
    long_cfg, short_cfg = cfgs
    out = tmp_path / "R"
    first = start("train", long_cfg, "--out", out, "--quiet")
    wait_for_step(first, out / "metrics.jsonl", 5)
    assert freeze(first)                   # the writer sees the folder only as deleted, or only as replaced
    try:
        remove(out)
        if fault == "replaced":
            out.mkdir()
    finally:
        os.kill(first.pid, signal.SIGCONT)
    rc, _, err = finish(first)
    line = one_error_line(rc, err, "train")
    assert str(out) in line and ("was deleted" if fault == "deleted" else "was replaced") in line
    # The first run recreated nothing: the folder is gone, or the new one is as it was made (empty).
    assert (not out.exists()) if fault == "deleted" else list(out.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["long.toml", "short.toml"]
                                                                + (["R"] if fault == "replaced" else []))
    # A second run in R is the only run there: its config, its weights, and eval works.
    rc, _, err = run("train", short_cfg, "--out", out, "--quiet", "--set", "model.d_model=32")
    assert rc == 0, err
    assert json.loads((out / "config.json").read_text())["model"]["d_model"] == 32
    assert assert_evaluates(out)["loss"] > 0


def test_a_folder_replaced_under_a_running_training_with_another_run(tmp_path, cfgs):
    """The issue's sequence: `rm -rf R` under a running training, then `train --out R --overwrite`; whichever
    writes first, R ends with run 2's files only and evaluates."""
    long_cfg, short_cfg = cfgs
    out = tmp_path / "R"
    first = start("train", long_cfg, "--out", out, "--quiet")
    wait_for_step(first, out / "metrics.jsonl", 5)
    remove(out)
    second = start("train", short_cfg, "--out", out, "--quiet", "--overwrite", "--set", "model.d_model=32")
    rc1, _, err1 = finish(first)
    rc2, _, err2 = finish(second)
    assert rc2 == 0, err2
    assert str(out) in one_error_line(rc1, err1, "train")
    assert json.loads((out / "config.json").read_text())["model"]["d_model"] == 32
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 20          # run 2's lines alone
    assert_evaluates(out)


# -- 2: export into a run folder -------------------------------------------------------------------------------
@pytest.fixture
def two_runs(tmp_path, cfgs):
    _, short_cfg = cfgs
    runs = tmp_path / "runs"
    for name in ("A", "B"):
        rc, _, err = run("train", short_cfg, "--out", runs / name, "--quiet")
        assert rc == 0, err
    return runs / "A", runs / "B"


@pytest.mark.parametrize("target", ["itself", "another run"])
def test_export_refuses_a_run_folder_as_out(two_runs, target):
    a, b = two_runs
    out = a if target == "itself" else b
    before = snapshot(a.parent)
    rc, _, err = run("export", a, "--format", "hf", "--out", out, "--overwrite")
    line = one_error_line(rc, err, "export")
    assert f"--out {out}" in line and ("run folder being exported" if target == "itself" else "holds a numformer run") in line
    assert snapshot(a.parent) == before                         # both runs untouched
    for folder in (a, b):
        assert_evaluates(folder)
    rc, _, err = run("train", "--out", out, "--resume", "--set", "train.max_steps=25", "--quiet")
    assert rc == 0, err


def test_export_into_a_folder_a_training_writes_is_refused(tmp_path, cfgs, two_runs):
    long_cfg, _ = cfgs
    a, _ = two_runs
    out = tmp_path / "busy"
    training = start("train", long_cfg, "--out", out, "--quiet")
    try:
        wait_for_step(training, out / "metrics.jsonl", 2)
        rc, _, err = run("export", a, "--format", "hf", "--out", out, "--overwrite")
        line = one_error_line(rc, err, "export")
        assert f"{out} is in use by another process (pid {training.pid}" in line
        assert not (out / "model.safetensors").exists() or "checkpoint" in " ".join(os.listdir(out))
    finally:
        training.send_signal(signal.SIGINT)
        rc, _, err = finish(training)
    assert rc == 130, err
    assert json.loads((out / "config.json").read_text())["model"]["type"] == "gpt"    # the training's own files
    assert_evaluates(out)


def test_export_then_export_again_into_its_own_hf_folder(two_runs, tmp_path):
    a, _ = two_runs
    out = tmp_path / "hf"
    assert run("export", a, "--out", out)[0] == 0
    rc, _, err = run("export", a, "--out", out, "--overwrite")        # an export folder is not a run
    assert rc == 0, err
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]


# -- 3: symbolic links inside the run folder -------------------------------------------------------------------
@pytest.mark.parametrize("name, dangling", [("metrics.jsonl", False), ("metrics.jsonl", True),
                                            ("checkpoint.safetensors", True)])
def test_a_link_inside_the_run_folder_is_refused(tmp_path, cfgs, name, dangling):
    _, short_cfg = cfgs
    out = tmp_path / "R"
    out.mkdir()
    outside = tmp_path / "outside.txt"
    if not dangling:
        outside.write_text("mine\n")
    (out / name).symlink_to(os.path.join("..", "outside.txt"))
    for args in (["train", short_cfg, "--out", out, "--quiet"], ["train", short_cfg, "--out", out, "--overwrite"]):
        rc, _, err = run(*args)
        line = one_error_line(rc, err, "train")
        assert f"{out / name} is a symbolic link" in line, line
    assert (out / name).is_symlink() and sorted(os.listdir(out)) == [name]       # nothing written in R
    assert outside.read_text() == "mine\n" if not dangling else not outside.exists()   # nor outside it


def test_a_link_placed_in_a_run_folder_refuses_resume(tmp_path, cfgs):
    _, short_cfg = cfgs
    out = tmp_path / "R"
    assert run("train", short_cfg, "--out", out, "--quiet")[0] == 0
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to(tmp_path / "outside.txt")     # dangling
    before = snapshot(out)
    rc, _, err = run("train", "--out", out, "--resume", "--set", "train.max_steps=30", "--quiet")
    assert f"{out / 'metrics.jsonl'} is a symbolic link" in one_error_line(rc, err, "train")
    assert snapshot(out) == before and not (tmp_path / "outside.txt").exists()
    assert_evaluates(out)


# -- 4 and 6: Ctrl-C, then --resume, gives the uninterrupted run's files ---------------------------------------
# early_stopping_min_delta = 0.5 makes step 120 the last selection (no later evaluation improves by 0.5) while
# the loss keeps falling: the weights of the step where Ctrl-C lands (after 120) are better than the selected ones.
RESUMED = tiny_copy_toml(max_steps=300, batch_size=4, eval_every=40, checkpoint_every=40, log_every=7, lr=0.01,
                         early_stopping_min_delta=0.5, processes=1)
STOP_AT = 125


def tensors(path):
    from safetensors.numpy import load_file

    return load_file(str(path))


@pytest.fixture(scope="module")
def interrupted_and_uninterrupted(tmp_path_factory):
    """(uninterrupted run, run stopped by a real SIGINT at step STOP_AT or later then resumed, the step it stopped
    at)."""
    tmp = tmp_path_factory.mktemp("resume")
    cfg = tmp / "cfg.toml"
    cfg.write_text(RESUMED)
    whole, cut = tmp / "whole", tmp / "cut"
    assert run("train", cfg, "--out", whole, "--quiet")[0] == 0
    proc = start("train", cfg, "--out", cut, "--quiet")
    wait_for_step(proc, cut / "metrics.jsonl", STOP_AT)
    proc.send_signal(signal.SIGINT)
    rc, _, err = finish(proc)
    assert rc == 130, err
    stopped = json.loads((cut / "summary.json").read_text())["steps"]
    assert STOP_AT <= stopped < 300
    rc, _, err = run("train", "--out", cut, "--resume", "--quiet")
    assert rc == 0, err
    return whole, cut, stopped


def test_interrupt_then_resume_keeps_the_uninterrupted_weights(interrupted_and_uninterrupted):
    whole, cut, stopped = interrupted_and_uninterrupted
    for name in ("model.safetensors", "checkpoint.safetensors"):
        a, b = tensors(whole / name), tensors(cut / name)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), (name, stopped)
    s_whole, s_cut = (json.loads((d / "summary.json").read_text()) for d in (whole, cut))
    for key in ("best_step", "selected_step", "best_val_loss", "selected_val_loss", "weights", "last_val_loss"):
        assert s_whole[key] == s_cut[key], (key, stopped)
    assert s_cut["selected_step"] == 120                     # evaluated at step 120: never the stopped step
    assert assert_evaluates(cut) == assert_evaluates(whole)


def test_resumed_metrics_lines_are_the_uninterrupted_ones(interrupted_and_uninterrupted):
    whole, cut, stopped = interrupted_and_uninterrupted

    def lines(folder):
        keep = ("step", "train_loss", "lr", "grad_norm", "val_loss", "val_tokens", "exact_match")
        return [{k: v for k, v in json.loads(line).items() if k in keep}
                for line in (folder / "metrics.jsonl").read_text().splitlines()]

    assert lines(cut) == lines(whole), stopped


def test_an_interrupt_keeps_the_selected_weights(tmp_path):
    """Ctrl-C after a selection: model.safetensors holds the evaluated weights, never the unevaluated last ones."""
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(RESUMED)
    out = tmp_path / "R"
    proc = start("train", cfg, "--out", out, "--quiet")
    wait_for_step(proc, out / "metrics.jsonl", STOP_AT)
    proc.send_signal(signal.SIGINT)
    rc, _, err = finish(proc)
    assert rc == 130, err
    summary = json.loads((out / "summary.json").read_text())
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="np") as f:
        step = int(f.metadata()["step"])
    evaluated = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
                 if "val_loss" in line]
    assert step == summary["best_step"] == summary["selected_step"] and step in evaluated
    assert summary["interrupted"] and summary["last_step"] == summary["steps"] > step


# -- 5: divergence keeps the checkpoint from before it began, and the advised recovery works -------------------
def test_divergence_keeps_the_checkpoint_before_it_and_resume_with_a_lower_lr_recovers(tmp_path):
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(tiny_copy_toml(max_steps=10, batch_size=4, eval_every=5, checkpoint_every=5, processes=1))
    out = tmp_path / "R"
    assert run("train", cfg, "--out", out, "--quiet")[0] == 0
    good = (out / "checkpoint.safetensors").read_bytes()
    # lr 10 explodes the loss (finite, far above its start) for 20 steps: checkpoints 15 ... 30 fall inside
    rc, _, err = run("train", "--out", out, "--resume", "--set", "train.lr=10", "--set", "train.max_steps=100")
    line = one_error_line(rc, err, "train")
    assert "diverged" in line and f"the checkpoint of step 10, written before the loss began to diverge, is kept in " \
                                  f"{out / 'checkpoint.safetensors'}" in line and "--resume --set train.lr=" in line
    assert "a smaller grad_clip (it was 1)" in line                 # the default clip was on: a smaller one
    assert (out / "checkpoint.safetensors").read_bytes() == good
    # the advised recovery: the same command with a lower learning rate
    rc, _, err = run("train", "--out", out, "--resume", "--set", "train.lr=1e-3", "--quiet")
    assert rc == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 100 and summary["stopped_by"] == "max_steps" and summary["best_val_loss"] < 3
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 100
    assert assert_evaluates(out)["loss"] < 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["R", "cfg.toml"]


def test_divergence_before_any_checkpoint_says_to_train_again(tmp_path):
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(tiny_copy_toml(max_steps=100, batch_size=4, eval_every=5, checkpoint_every=5, lr=1e6,
                                  processes=1, grad_clip=0.0))
    out = tmp_path / "R"
    rc, _, err = run("train", cfg, "--out", out)
    line = one_error_line(rc, err, "train")
    assert "no checkpoint had been written yet" in line and "train again with --overwrite" in line
    assert "lower lr" in line and "or a grad_clip" in line           # no clip was on: a clip
    assert not (out / "checkpoint.safetensors").exists()


def test_a_write_between_the_check_and_a_replacement_never_reaches_the_new_folder(tmp_path):
    """The instant between a writer's identity check and its write: the folder is deleted and made anew there.
    The file is created relative to the locked folder's descriptor, so it never lands in the new folder: the
    write stops with one error naming the folder, and so does the next check."""
    from numformer.run_files import write_atomic
    from numformer.train.run_folder import RunFolderGone, lock_for_writing

    out = tmp_path / "R"
    lock = lock_for_writing(out)
    try:
        lock.check()
        remove(out)
        out.mkdir()                                        # made anew under the same name (ext4 may reuse the inode
        with pytest.raises(ValueError, match="was replaced by another folder"):  # number of a freed folder; the
            write_atomic(out / "config.json", b"{}\n")                        # lock's descriptor pins it)
        assert list(out.iterdir()) == []
        with pytest.raises(RunFolderGone, match="replaced"):
            lock.check()
    finally:
        lock.release()


@pytest.mark.parametrize("fails", ["create", "fsync"])
def test_a_failed_write_names_the_file_not_its_temporary(tmp_path, monkeypatch, fails):
    """A read-only file system (creating the temporary file) or a full disk (fsync) is reported about the file
    being written: the temporary's name (.metrics.jsonl.PID.RANDOM.tmp) told a user nothing of where it was."""
    import errno

    from numformer import run_files

    target = tmp_path / "metrics.jsonl"
    if fails == "create":
        def refuse(folder_fd, path, flags):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        monkeypatch.setattr(run_files, "_open_at", refuse)
    else:
        def full(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(run_files.os, "fsync", full)
    with pytest.raises(OSError) as raised:
        run_files.write_atomic(target, b"{}\n")
    assert raised.value.filename == str(target) and raised.value.errno in (errno.EROFS, errno.ENOSPC)
    assert list(tmp_path.iterdir()) == []
