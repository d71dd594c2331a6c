"""Concurrency: one run folder, one writer. Real processes race for a folder; exactly one proceeds and the
other gets one line naming the folder and the process that holds it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from numformer.train.run_folder import RunLock

from conftest import one_error_line, tiny_copy_toml

TINY = tiny_copy_toml(max_steps=300, batch_size=4, eval_every=100, checkpoint_every=100, processes=1)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="flock and /proc are Linux's")


def cli(*args):
    return [sys.executable, "-m", "numformer.cli", *map(str, args)]


def env():
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    return {**os.environ, "PYTHONPATH": os.path.abspath(src) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


@pytest.mark.parametrize("trial", range(2))
def test_two_trainings_race_for_one_folder(tmp_path, cfg, trial):
    out = tmp_path / "run"
    procs = [subprocess.Popen(cli("train", cfg, "--out", out, "--quiet", *extra), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env())
             for extra in ([], ["--set", "model.d_model=48"])]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    assert sorted(rc for rc, _ in results) == [0, 2], results
    rc, err = next(r for r in results if r[0] == 2)
    line = one_error_line(rc, err, "train")
    assert str(out) in line and ("in use by another process (pid " in line or "already holds a run" in line)
    # The folder is the winner's alone: its config, its weights, its metrics, and eval works.
    winner = 0 if results[0][0] == 0 else 1
    d_model = json.loads((out / "config.json").read_text())["model"]["d_model"]
    assert d_model == (16, 48)[winner]
    done = subprocess.run(cli("eval", out, "--json"), capture_output=True, text=True, env=env(), timeout=120)
    assert done.returncode == 0, done.stderr
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 300         # one run's lines, in order


@pytest.fixture
def holder(tmp_path):
    """Start a process that locks a folder (exclusive or shared) until it is killed; yields start(path, ...)."""
    procs = []

    def start(path, exclusive=True):
        code = ("import sys; from numformer.train.run_folder import RunLock; "
                f"lock = RunLock(sys.argv[1], exclusive={exclusive}); print('locked', flush=True); sys.stdin.read()")
        p = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env())
        assert p.stdout.readline().strip() == "locked"
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        p.stdin.close()
        p.stdout.close()


def test_busy_folder_names_the_other_process(tmp_path, cfg, holder, cli_error, run_cli):
    out = tmp_path / "run"
    assert run_cli("train", cfg, "--out", out, "--quiet", "--set", "train.max_steps=3")[0] == 0
    p = holder(out)                                          # a writer holds the folder
    for args in (["train", cfg, "--out", out, "--overwrite"], ["train", "--out", out, "--resume"], ["eval", out],
                 ["generate", out, "--max-new-tokens", "2"], ["analyze", out]):
        line = cli_error(*args)
        assert f"{out} is in use by another process (pid {p.pid}: " in line, line
    p.kill()
    p.wait()                                                 # a killed holder leaves no stale lock
    assert run_cli("eval", out)[0] == 0


def test_readers_share_a_folder_but_a_writer_waits_for_them(tmp_path, cfg, holder, cli_error, run_cli):
    out = tmp_path / "run"
    assert run_cli("train", cfg, "--out", out, "--quiet", "--set", "train.max_steps=3")[0] == 0
    p = holder(out, exclusive=False)                         # a reader (eval, analyze ...) holds it
    assert run_cli("eval", out)[0] == 0                       # another reader may read meanwhile
    line = cli_error("train", "--out", out, "--resume", "--set", "train.max_steps=6")
    assert f"in use by another process (pid {p.pid}" in line
    p.send_signal(signal.SIGTERM)
    p.wait()
    assert run_cli("train", "--out", out, "--resume", "--set", "train.max_steps=6", "--quiet")[0] == 0


def test_the_same_process_may_lock_again(tmp_path):
    """Locks are per process: a library user's second Trainer on a folder the same process holds is allowed."""
    a = RunLock(tmp_path)
    b = RunLock(tmp_path, exclusive=False)
    b.release()
    a.release()
    with RunLock(tmp_path):
        pass
