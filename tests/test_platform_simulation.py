"""numformer on a simulated Windows: every module imports, the README's "A taste" runs, and a tiny training
runs, resumes and generates, with the run-folder lock refusing a second writer.

The simulation (tests/windows_sim/sitecustomize.py, first on PYTHONPATH of each subprocess) hides what
Windows lacks: the modules fcntl, resource, pwd, grp, termios; every signal but Windows' six (so SIGHUP,
SIGUSR1); os.fork, os.register_at_fork, os.fchmod, os.major and more. numformer's lock then takes its Windows
branch (msvcrt byte-range locks on a lock file) through a stand-in msvcrt with Windows' contract. This is how
Windows is checked: by simulation, not on a Windows machine (docs/reference/install.md).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "tests" / "windows_sim"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the stand-in msvcrt uses Linux's OFD locks")

TINY = ["--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.n_heads=2",
        "--set", "data.block_size=16", "--set", "train.batch_size=4", "--set", "train.eval_every=10",
        "--set", "train.eval_batches=1", "--set", "train.eval_batch_size=8", "--set", "train.warmup_steps=2",
        "--set", "train.checkpoint_every=10", "--set", "train.log_every=5"]


def simulated(args, preload=(), **kwargs):
    """Run ``python ARGS`` as on Windows (see the module docstring); returns the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SIM), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               NUMFORMER_SIM_PRELOAD=",".join(preload), PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600, **kwargs)


def cli(*args, cwd=None):
    return simulated(["-m", "numformer.cli", *args], cwd=cwd)


def test_the_simulation_hides_what_windows_lacks():
    done = simulated(["-c", textwrap.dedent("""
        import importlib, os, signal, sys
        for name in ("fcntl", "resource", "pwd"):
            try:
                importlib.import_module(name)
            except ImportError:
                pass
            else:
                raise SystemExit(f"{name} imports")
        assert not any(hasattr(signal, s) for s in ("SIGHUP", "SIGUSR1", "SIGKILL"))
        assert not any(hasattr(os, f) for f in ("fork", "register_at_fork", "fchmod"))
        assert "msvcrt" not in sys.modules
        from numformer import _platform
        assert _platform.fcntl is None and _platform.msvcrt.__name__ == "_msvcrt_standin"
        print("ok")
        """)])
    assert done.stdout.strip() == "ok", done.stderr


def test_every_module_imports():
    # torch picks its code by sys.platform ("linux" here) and would need os.register_at_fork: imported first.
    preload = ("torch",) if _has("torch") else ()
    done = simulated(["-c", textwrap.dedent("""
        import importlib, importlib.util, pkgutil, numformer
        from sitecustomize import HIDDEN_MODULES
        names = ["numformer"] + [m.name for m in pkgutil.walk_packages(numformer.__path__, "numformer.")]
        failed = []
        for name in names:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as e:
                # an optional library that is not installed here (torch for bench.torch_reference) is no failure
                if e.name in HIDDEN_MODULES or e.name.startswith("numformer") or importlib.util.find_spec(e.name):
                    failed.append(f"{name}: {e!r}")
            except Exception as e:
                failed.append(f"{name}: {e!r}")
        print(len(names), "modules")
        print("\\n".join(failed))
        """)], preload=preload)
    assert done.returncode == 0, done.stderr
    count, *failed = done.stdout.strip().splitlines()
    assert not failed, "modules that fail to import on simulated Windows:\n" + "\n".join(failed)
    assert int(count.split()[0]) > 100                  # every subpackage was walked (train's too)


def test_readme_taste_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    taste = re.search(r"## A taste\s+```python\n(.*?)```", readme, re.S).group(1)
    done = simulated(["-c", taste])
    assert done.returncode == 0, done.stderr
    loss = float(re.search(r"loss (\S+)", done.stdout).group(1))
    assert loss < 0.1, done.stdout


def test_train_resume_generate_and_the_lock(tmp_path):
    run = tmp_path / "run"
    config = str(ROOT / "configs" / "shakespeare_char.toml")
    done = cli("train", config, "--out", str(run), "--quiet", *TINY, "--set", "train.max_steps=20")
    assert done.returncode == 0, done.stderr
    assert (run / ".numformer.lock").is_file()          # the Windows branch held the lock (on its lock file)

    # A second writer is refused while a process holds the folder, with one line and exit 2 ...
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from numformer.train.run_folder import lock_for_resuming
        lock = lock_for_resuming({str(run)!r})
        print("locked", flush=True)
        input()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(SIM), str(ROOT / "src"),
                                                         os.environ.get("PYTHONPATH", "")])))
    try:
        assert holder.stdout.readline().strip() == "locked"
        refused = cli("train", "--out", str(run), "--resume", "--quiet", "--set", "train.max_steps=30")
        assert refused.returncode == 2, refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "is in use by another process" in lines[0], refused.stderr
        # ... and a crashed holder's lock does not block the next run.
        holder.kill()
        holder.wait()
    finally:
        holder.kill()
        holder.wait()

    done = cli("train", "--out", str(run), "--resume", "--quiet", "--set", "train.max_steps=30")
    assert done.returncode == 0, done.stderr
    steps = [line for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if '"step": 30' in line]
    assert steps, "the resumed run did not reach step 30"

    done = cli("generate", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "20", "--seed", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ROMEO:") and len(done.stdout.strip()) >= len("ROMEO:") + 10, done.stdout


def _has(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_forked_workers_are_refused_with_one_line(tmp_path):
    done = cli("train", str(ROOT / "configs" / "shakespeare_char.toml"), "--out", str(tmp_path / "run"), "--quiet",
               *TINY, "--set", "train.max_steps=2", "--set", "train.processes=2")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no fork" in lines[0] and "MPI" in lines[0], done.stderr
