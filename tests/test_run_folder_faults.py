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

from conftest import one_error_line, tiny_copy_toml

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
    remove(out)
    if fault == "replaced":
        out.mkdir()
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
