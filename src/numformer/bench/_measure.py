"""Measurement helpers shared by the scaling benchmarks (attention, checkpointing, generate, depth).

Peak memory is measured two ways, because each misses something:

- ``tracemalloc``: NumPy reports every array buffer it allocates to Python's
  tracemalloc (``PyTraceMalloc_Track``), so the traced peak is the exact high-water
  mark of the arrays (and Python objects) allocated inside the measured region,
  independent of the allocator and of what the process held before. It does
  not see BLAS's internal work buffers (OpenBLAS allocates them once, a few MB).
- the peak resident set size of a fresh child process per measurement (``max_rss_bytes``:
  ``VmHWM`` on Linux, ``ru_maxrss`` on macOS): everything the process ever touched
  (interpreter, imported modules, BLAS buffers, allocator slack).
  It is the figure to compare with a memory budget; its growth over the RSS
  just before the measured region isolates the measured work.

Each point runs in its own child process (``run_child``) so that one point's
high-water mark or heap fragmentation cannot leak into the next.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import tracemalloc

try:                          # POSIX only; Windows' peak working set comes from psutil when it is installed
    import resource
except ImportError:
    resource = None

def rss_bytes():
    """Current resident set size of this process (Linux /proc), or None elsewhere."""
    try:
        with open("/proc/self/statm", encoding="utf-8") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def max_rss_bytes():
    """High-water resident set size of this process since it started.

    Linux: ``VmHWM`` of /proc/self/status, the high-water mark of this process image. Not ``ru_maxrss``:
    Linux carries the parent's resident size at fork over exec into the child's ru_maxrss, so a child
    started by a large parent (``numformer bench all`` after the throughput part) would report the
    parent's size. macOS: ``ru_maxrss``. Windows: psutil's peak working set when psutil is installed, else None."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if resource is not None:
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r if sys.platform == "darwin" else r * 1024
    try:
        import psutil
    except ImportError:
        return None
    return getattr(psutil.Process().memory_info(), "peak_wset", None)


def traced_peak(fn):
    """Run fn() under tracemalloc; return (result, peak bytes allocated during the call, bytes still held after)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak - base, current - base


def best_time(fn, min_total=0.3, max_repeats=5, warmup=True):
    """Smallest wall time of fn() over repeats: at least one, more while their total stays under ``min_total``,
    at most ``max_repeats``. With ``warmup`` a first, untimed call comes before; when that call alone takes
    longer than ``min_total``, its time is returned and nothing is repeated."""
    if warmup:
        t0 = time.perf_counter()
        fn()
        first = time.perf_counter() - t0
        if first > min_total:            # big points: the warm-up run is the measurement
            return first
    times = []
    while True:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= max_repeats or sum(times) >= min_total:
            return min(times)


def best_of(fn, repeats=1):
    """(the smallest wall time of ``repeats`` calls of fn(), the last call's result)."""
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def fit_exponent(xs, ys):
    """Slope of log y against log x by least squares (y ∝ x^slope); None with fewer than two points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x and y and x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return None if sxx == 0 else sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def run_child(module, function, kwargs, timeout=900, env=None):
    """Run ``numformer.bench.<module>.<function>(**kwargs)`` in a fresh Python; return its JSON result (a dict).

    The function must print one JSON line as its last output line. ``env``: variables added to the child's
    environment (e.g. settings a library reads only when it loads).
    """
    code = (f"import json, sys; from numformer.bench.{module} import {function} as f; "
            f"print(json.dumps(f(**json.loads(sys.argv[1]))))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs)], capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else {**os.environ, **env})
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"benchmark point {module}.{function}({kwargs}) failed (exit {proc.returncode}): "
                           + " | ".join(tail))
    return json.loads(proc.stdout.strip().splitlines()[-1])


THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def blas_env():
    """The BLAS thread settings in the environment (children inherit them): part of what a timing depends on."""
    return {k: os.environ[k] for k in THREAD_ENV if k in os.environ}


def mib(n):
    return None if n is None else n / 2 ** 20


def plt():
    """matplotlib.pyplot with the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot
