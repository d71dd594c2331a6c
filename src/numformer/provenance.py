"""Where a figure came from: the source commit and the machine, recorded with every result and summary."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import numpy as np

from ._runtime import openblas_core

_PACKAGE = Path(__file__).resolve().parent


_first_commit = {}      # this process's first answer of git_commit()


def git_commit():
    """The source commit of the code this process runs (with "+dirty" when src/ or configs/ have uncommitted
    changes), or None outside a git checkout.

    A process runs the code it loaded when it started, so the first answer is kept: a later call returns that
    commit again, with "+dirty" added when the checkout has moved since (another commit checked out, files
    edited), because the figures of this process can then no longer be tied to one commit. A run therefore
    asks once at its start (``Trainer.__init__``, each experiment's plan) and records the answer at its end."""
    now = _checkout_commit()
    if "first" not in _first_commit:
        _first_commit["first"] = now
    first = _first_commit["first"]
    if now != first:
        _first_commit["moved"] = True       # once moved, files of either commit may have been loaded
    if first is None or first.endswith("+dirty") or not _first_commit.get("moved"):
        return first
    return first + "+dirty"


def _checkout_commit():
    """The commit the checkout holding numformer's source is at now (see git_commit), or None."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=_PACKAGE)
        commit = out.stdout.strip()
        if not commit:
            return None
        # uncommitted changes to the library or the configs: the commit alone does not say what ran
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=5,
                             cwd=_PACKAGE).stdout.strip() or str(_PACKAGE)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "configs"], capture_output=True,
                               text=True, timeout=5, cwd=top)
        return commit + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info():
    """What the figures depend on (JSON-able): CPU model, core count, platform, Python, NumPy and its BLAS."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "platform": platform.platform()}
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["blas"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # pragma: no cover - depends on the NumPy build
        pass

    core = openblas_core()
    if core:
        info["blas_core"] = core          # OpenBLAS's kernels for this CPU: small products' speed depends on them
    return info
