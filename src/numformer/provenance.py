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
    commit again, with "+dirty" added when the code has moved since (another commit checked out whose src/ or
    configs/ differ, files edited), because the figures of this process can then no longer be tied to one
    commit. A commit that changes neither (docs, results, tests) moves nothing. A run therefore asks once at its
    start (``Trainer.__init__``, each experiment's plan) and records the answer at its end."""
    now = _checkout_commit()
    if "first" not in _first_commit:
        _first_commit["first"] = now
    first = _first_commit["first"]
    if now != first and not same_source(first, now):
        _first_commit["moved"] = True       # once moved, files of either commit may have been loaded
    if first is None or first.endswith("+dirty") or not _first_commit.get("moved"):
        return first
    return first + "+dirty"


def same_source(first, now):
    """Whether the commits ``first`` and ``now`` (both without uncommitted changes) hold the same src/ and
    configs/, so that a figure of one is a figure of the other; False when either is dirty or unknown, or git
    cannot compare them (a commit not in this checkout)."""
    if not first or not now or "+dirty" in first + now:
        return False
    try:
        return _git("diff", "--quiet", first, now, "--", "src", "configs", at_top=True).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _checkout_commit():
    """The commit the checkout holding numformer's source is at now (see git_commit), or None."""
    try:
        commit = _git("rev-parse", "--short", "HEAD").stdout.strip()
        if not commit:
            return None
        # uncommitted changes to the library or the configs: the commit alone does not say what ran
        dirty = _git("status", "--porcelain", "--", "src", "configs", at_top=True)
        return commit + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _git(*args, at_top=False):
    """``git args`` in the folder of numformer's source (``at_top``: its checkout's top folder).

    git runs with GIT_OPTIONAL_LOCKS=0: ``git status`` then does not refresh the index, so it never takes
    .git/index.lock, for which the ranks of an MPI run (each asks) and the user's own git commands would race."""
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")
    where = _PACKAGE
    if at_top:
        where = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=5,
                               cwd=_PACKAGE, env=env).stdout.strip() or _PACKAGE
    return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=where, env=env)


CPUINFO = "/proc/cpuinfo"          # Linux's; macOS and Windows have none (machine_info then names less)


def _models(*spans):
    """The model numbers of the inclusive ranges ``spans`` ((first, last), ...)."""
    return frozenset(m for lo, hi in spans for m in range(lo, hi + 1))


# The microarchitecture by (vendor, cpu family, models), where family and model identify it. AMD: Linux's
# arch/x86/kernel/cpu/amd.c (bsp_init_amd, "Figure out Zen generations"; for family 0x1a only the models every
# kernel version since Zen 5's addition agrees on). Intel: Linux's arch/x86/include/asm/intel-family.h
# (INTEL_HASWELL_X 0x3F, BROADWELL_X 0x4F, SKYLAKE_X 0x55, ICELAKE_X 0x6A, ICELAKE_D 0x6C,
# SAPPHIRERAPIDS_X 0x8F, GRANITERAPIDS_X 0xAD, EMERALDRAPIDS_X 0xCF). Other CPUs are named by family and model.
MICROARCHITECTURES = (
    ("AuthenticAMD", 0x17, _models((0x00, 0x2F), (0x50, 0x5F)), "Zen/Zen+"),
    ("AuthenticAMD", 0x17, _models((0x30, 0x4F), (0x60, 0x7F), (0x90, 0x91), (0xA0, 0xAF)), "Zen 2"),
    ("AuthenticAMD", 0x19, _models((0x00, 0x0F), (0x20, 0x5F)), "Zen 3"),
    ("AuthenticAMD", 0x19, _models((0x10, 0x1F), (0x60, 0xAF)), "Zen 4"),
    ("AuthenticAMD", 0x1A, _models((0x00, 0x0F), (0x20, 0x2F), (0x40, 0x4F), (0x70, 0x7F)), "Zen 5"),
    ("GenuineIntel", 6, _models((0x3F, 0x3F)), "Haswell-EP"),
    ("GenuineIntel", 6, _models((0x4F, 0x4F)), "Broadwell-EP"),
    ("GenuineIntel", 6, _models((0x55, 0x55)), "Skylake-SP/Cascade Lake"),
    ("GenuineIntel", 6, _models((0x6A, 0x6A)), "Ice Lake-SP"),
    ("GenuineIntel", 6, _models((0x6C, 0x6C)), "Ice Lake-D"),
    ("GenuineIntel", 6, _models((0x8F, 0x8F)), "Sapphire Rapids"),
    ("GenuineIntel", 6, _models((0xAD, 0xAD)), "Granite Rapids"),
    ("GenuineIntel", 6, _models((0xCF, 0xCF)), "Emerald Rapids"),
)


def _cpuinfo_fields(text):
    """{field: value} of the first processor in /proc/cpuinfo's ``text`` (every processor of a machine is the
    same model)."""
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break                     # the end of the first processor's block
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _simd(flags):
    """The widest x86 vector instructions in a cpuinfo "flags" field: AVX-512, AVX2, AVX or "no AVX"."""
    flags = set(flags.split())
    return next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX")) if flag in flags),
                "no AVX")


def cpu_from_cpuinfo(text, fallback):
    """(name, label) of the CPU /proc/cpuinfo's ``text`` describes: the model name (``fallback`` when the text has
    none, e.g. on ARM), and a label that tells CPU models apart whose name is the same, e.g.
    "AMD EPYC (Zen 3, family 25 model 1, AVX2)": the microarchitecture where family and model identify it
    (``MICROARCHITECTURES``), the family and model, and the widest vector instructions the flags list."""
    fields = _cpuinfo_fields(text)
    name = fields.get("model name") or fallback
    details = []
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        pass
    else:
        vendor = fields.get("vendor_id")
        details += [arch for v, f, models, arch in MICROARCHITECTURES if (v, f) == (vendor, family) and model in models]
        details.append(f"family {family} model {model}")
    if "flags" in fields:
        details.append(_simd(fields["flags"]))
    return name, (f"{name} ({', '.join(details)})" if details else name)


def cpu_label(machine):
    """The CPU label of a recorded ``machine`` (a machine_info() dict): its "cpu_label", or for a record written
    before labels were (only "cpu", and "blas_core" when it has one) e.g.
    "AMD EPYC (model not recorded; OpenBLAS Haswell kernels)"."""
    if machine.get("cpu_label"):
        return machine["cpu_label"]
    core = machine.get("blas_core")
    return f"{machine.get('cpu', '?')} (model not recorded" + (f"; OpenBLAS {core} kernels)" if core else ")")


def machine_info():
    """What the figures depend on (JSON-able): CPU model, core count, platform, Python, NumPy and its BLAS.
    "cpu" is the CPU's model name; "cpu_label" adds what tells apart CPU models of the same name
    (``cpu_from_cpuinfo``; where there is no /proc/cpuinfo, the name alone) and, when the environment sets
    OPENBLAS_CORETYPE, the kernel family it forces (``label_with_coretype``)."""
    cpu = label = platform.processor() or platform.machine()
    try:
        with open(CPUINFO, encoding="utf-8", errors="replace") as f:
            cpu, label = cpu_from_cpuinfo(f.read(), cpu)
    except OSError:
        pass
    info = {"cpu": cpu, "cpu_label": label, "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "platform": platform.platform()}
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["blas"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # pragma: no cover - depends on the NumPy build
        pass

    core = openblas_core()
    if core:
        info["blas_core"] = core          # OpenBLAS's kernels for this CPU: small products' speed depends on them
        forced = os.environ.get("OPENBLAS_CORETYPE", "").strip()
        if forced:                        # kernels chosen by the environment, not by OpenBLAS for this CPU
            info["blas_coretype"] = forced
            info["cpu_label"] = label_with_coretype(label, forced)
    return info


def label_with_coretype(label, coretype):
    """``label`` marked with the OPENBLAS_CORETYPE that forced OpenBLAS's kernels, e.g. "AMD EPYC (Zen 5, family 26
    model 2, AVX-512; OPENBLAS_CORETYPE=Haswell)": the kernel family sets the products' speed (on a Zen 5 core,
    about half with AVX2 kernels what it is with AVX-512 ones), so figures under a forced family are a machine of
    their own."""
    mark = f"OPENBLAS_CORETYPE={coretype}"
    return f"{label[:-1]}; {mark})" if label.endswith(")") else f"{label} ({mark})"
