"""Process-level settings that make NumPy training faster: ``numformer.set_fast_runtime()``.

Nothing here runs on import. ``set_fast_runtime()`` is called explicitly: by the
``numformer`` command before every sub-command but ``bench`` (cli.py), by the
benchmark, which sets up and compares the modes itself, and by a library user
who wants the same speed (``Trainer`` does not call it: the settings are
process-wide, so they are the application's choice). The malloc settings never
change a result; the split matrix products may change the last bits (see below).

What it does (glibc only; elsewhere it is a no-op that says so):

* Raises malloc's mmap and trim thresholds (``mallopt``). By default glibc
  serves every block over 128 KiB with a fresh ``mmap`` and gives it back with
  ``munmap`` when freed, and trims the heap top after each large free. A
  training step allocates and frees hundreds of such arrays (activations,
  gradients, temporaries), so each one costs page faults and zeroing of fresh
  pages by the kernel: more time than the arithmetic on it. With the
  thresholds raised, freed blocks stay in the heap and are reused at once.
  The price: memory freed by NumPy is kept by the process (its peak resident
  size stays reserved) instead of being returned to the operating system.

Independently, numformer splits its large elementwise kernels (GELU, layer
norm, the softmax of attention) across a small pool of threads: NumPy releases
the GIL inside each ufunc, so the pieces run on separate cores, the way
PyTorch's intra-op threads do. Each element or row is computed by exactly the
same operations whatever the split, so results are identical for any thread
count. ``set_num_threads(n)`` / ``get_num_threads()`` control it (default: the
CPUs this process may use, at most 16, or ``NUMFORMER_NUM_THREADS``); 1 turns it
off. Matrix products use the BLAS's own threads, from the calling thread only
(two threads calling a multithreaded BLAS at once would oversubscribe the
cores).

``set_fast_runtime(blas="numformer")`` (the default of that call) goes one step
further when NumPy's BLAS is OpenBLAS: it sets OpenBLAS to one thread for the
whole process and numformer splits its large matrix products by rows across
its own threads instead. Only one set of threads then shares the cores: with
OpenBLAS's threads active, its idle threads keep spinning for a while after
every product and compete with numformer's elementwise threads for the same
cores. A product split by rows equals the unsplit one up to float rounding: bit
for bit where the BLAS kernel's summation order does not depend on the number
of rows (OpenBLAS on Intel Skylake), not always otherwise (OpenBLAS's
Haswell/Zen kernels); a given split is deterministic. The catch: other NumPy
code in the same process then also runs its matrix products on one thread
(``set_fast_runtime(blas="native")`` restores the BLAS thread count).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# glibc's mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

# Blocks below this size come from the heap and are reused; glibc caps the value at 32 MiB on 64-bit
# (HEAP_MAX_SIZE / 2), so larger arrays are still mmapped.
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024 * 1024
TOP_PAD = 64 * 1024 * 1024

_state = {"applied": False, "malloc": None, "blas": None, "own_blas": False, "blas_saved": None}


@functools.cache
def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()             # only glibc has it (not musl)
        return libc
    except (OSError, AttributeError):
        return None


def release_free_memory():
    """Give the memory malloc holds free back to the operating system (glibc's ``malloc_trim``, which also
    releases the free pages inside the heap: ``set_fast_runtime``'s trim threshold keeps up to 1 GiB of them
    otherwise). For after large arrays were freed that nothing will reuse soon. Returns True where done
    (glibc), False elsewhere."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def set_fast_runtime(malloc=True, blas="numformer"):
    """Tune the process for NumPy training (see the module docstring). Idempotent; returns what was applied.

    malloc: raise glibc's mmap/trim thresholds so that large temporaries are
    reused instead of being mapped and unmapped at every step.
    blas: "numformer" — OpenBLAS on one thread, numformer splits large products
    across its own threads (when OpenBLAS's thread count can be set; else as
    "native"); "native" — the BLAS keeps (or gets back) its own threads;
    None — leave it as it is.

    Returns {"malloc": ..., "blas": ...}, each a short description.
    """
    if blas not in ("numformer", "native", None):
        raise ValueError(f"blas must be 'numformer', 'native' or None, got {blas!r}")
    if malloc and _state["malloc"] is None:
        libc = _libc()
        if libc is None:
            _state["malloc"] = "skipped (not glibc)"
        else:
            ok = (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                  and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
                  and libc.mallopt(_M_TOP_PAD, TOP_PAD) == 1)
            _state["malloc"] = (f"glibc {libc.gnu_get_libc_version().decode()} mallopt: mmap threshold "
                                f"{MMAP_THRESHOLD >> 20} MiB, trim threshold {TRIM_THRESHOLD >> 20} MiB, "
                                f"top pad {TOP_PAD >> 20} MiB" if ok else "mallopt refused the settings")
        _state["applied"] = True
    if blas is not None:
        _set_blas_mode(blas)
    return fast_runtime_status()


def _set_blas_mode(mode):
    fns = _openblas_thread_functions()
    if mode == "numformer" and fns is not None:
        get, set_ = fns
        if not _state["own_blas"]:
            _state["blas_saved"] = get()
            set_(1)
            _state["own_blas"] = True
        _state["blas"] = "OpenBLAS on 1 thread; numformer splits large products across its threads"
    else:
        if _state["own_blas"] and fns is not None:
            fns[1](_state["blas_saved"] or 1)
        _state["own_blas"] = False
        _state["blas"] = ("the BLAS's own threads" if mode == "native" or fns is None else "unchanged")


def fast_runtime_status():
    """What set_fast_runtime() has applied in this process, and the thread count (for benchmark reports)."""
    return {"malloc": _state["malloc"] or "default (set_fast_runtime() not called)",
            "blas": _state["blas"] or "the BLAS's own threads (default)",
            "threads": get_num_threads()}


def owns_blas():
    """Whether numformer splits matrix products itself (set_fast_runtime(blas="numformer") with OpenBLAS)."""
    return _state["own_blas"]


# -- intra-op threads ----------------------------------------------------------------------------------

def usable_cores():
    """The CPUs this process may run on (its affinity; where that cannot be read, the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _default_threads():
    """NUMFORMER_NUM_THREADS if set (a positive integer, else a ValueError), else the usable CPUs, at most 16."""
    env = os.environ.get("NUMFORMER_NUM_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"NUMFORMER_NUM_THREADS must be a positive integer, got {env!r} (unset it for one "
                             f"thread per usable core, at most 16)")
        return n
    return max(1, min(usable_cores(), 16))


_threads = {"n": None, "pool": None, "pool_size": 0}


def _blas_single_thread_limit():
    """Largest m·n·k for which the BLAS computes a matrix product on the calling thread alone.

    Kernels split across threads may call BLAS inside their pieces only below
    this size: two threads calling a multithreaded BLAS at once oversubscribe
    the cores (OpenBLAS's threads spin while they wait), which is many times
    slower. OpenBLAS runs a GEMM single-threaded when m·n·k <= 65536 · 4
    (interface/gemm.c, GEMM_MULTITHREAD_THRESHOLD = 4); for any other BLAS the
    limit is 0, so those kernels keep every BLAS call on the calling thread.
    """
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = str(blas.get("name", "")).lower()
    except Exception:  # pragma: no cover - depends on the NumPy build
        name = ""
    return 65536 * 4 if "openblas" in name else 0


BLAS_SINGLE_THREAD_MNK = _blas_single_thread_limit()
_pool_lock = threading.Lock()
_in_worker = threading.local()


def get_num_threads():
    """Threads numformer's elementwise kernels may use (1 = no splitting)."""
    if _threads["n"] is None:
        _threads["n"] = _default_threads()
    return _threads["n"]


def set_num_threads(n):
    """Use ``n`` threads (>= 1) for numformer's elementwise kernels. Results do not depend on ``n``."""
    n = int(n)
    if n < 1:
        raise ValueError(f"the number of threads must be >= 1, got {n}")
    _threads["n"] = n


def _pool(size):
    with _pool_lock:
        if _threads["pool"] is None or _threads["pool_size"] < size:
            old = _threads["pool"]
            _threads["pool"] = ThreadPoolExecutor(max_workers=size, thread_name_prefix="numformer")
            _threads["pool_size"] = size
            if old is not None:
                old.shutdown(wait=False)
        return _threads["pool"]


def _forget_pool_after_fork():
    """A forked child has the pool object but not its threads: start a fresh one on first use."""
    _threads["pool"] = None
    _threads["pool_size"] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def _run_in_worker(fn, start, stop, errors):
    """``fn(start, stop)`` on a pool thread, under the caller's floating-point error handling (``np.errstate``
    is per thread: a caller that ignores overflow must not get warnings from its pieces)."""
    _in_worker.active = True
    try:
        with np.errstate(**errors):
            return fn(start, stop)
    finally:
        _in_worker.active = False


def parallel_for(n, fn, grain):
    """Run ``fn(start, stop)`` over a split of range(n) into contiguous pieces of at least ``grain`` items.

    One piece per thread (see set_num_threads); the calling thread runs the
    first piece. ``fn`` must write disjoint outputs for disjoint ranges, and
    may call the BLAS only for products below ``BLAS_SINGLE_THREAD_MNK`` (larger
    ones belong on the calling thread, outside the pieces). Runs
    ``fn(0, n)`` directly when there is a single piece, or when called from
    inside a piece (no nested splitting).
    """
    pieces = min(get_num_threads(), n // max(int(grain), 1))
    if pieces <= 1 or getattr(_in_worker, "active", False):
        fn(0, n)
        return
    bounds = [n * i // pieces for i in range(pieces + 1)]
    pool = _pool(pieces - 1)
    errors = np.geterr()
    futures = [pool.submit(_run_in_worker, fn, bounds[i], bounds[i + 1], errors) for i in range(1, pieces)]
    error = None
    try:
        _in_worker.active = True
        fn(bounds[0], bounds[1])
    except BaseException as e:  # wait for the other pieces before raising
        error = e
    finally:
        _in_worker.active = False
    for f in futures:
        try:
            f.result()
        except BaseException as e:
            error = error or e
    if error is not None:
        raise error


# -- BLAS threads (for measurements) -------------------------------------------------------------------

_openblas_fns = []


def _openblas_thread_functions():
    """(get, set) of the OpenBLAS loaded by NumPy, or None (another BLAS, or symbols not found); looked up once."""
    if not _openblas_fns:
        found = _find_openblas_function("get_num_threads")
        fns = None
        if found:
            lib, symbol = found
            fns = getattr(lib, symbol), getattr(lib, symbol.replace("get_num_threads", "set_num_threads"))
            fns[0].restype = ctypes.c_int
            fns[1].argtypes = (ctypes.c_int,)
        _openblas_fns.append(fns)
    return _openblas_fns[0]


@functools.lru_cache(maxsize=None)
def openblas_core():
    """The kernel family the OpenBLAS loaded by NumPy chose for this CPU at start-up (e.g. "Haswell", "SkylakeX",
    "Zen"; set by OPENBLAS_CORETYPE), or None for another BLAS. The speed of small products depends on it."""
    found = _find_openblas_function("get_corename")
    if not found:
        return None
    fn = getattr(found[0], found[1])
    fn.restype = ctypes.c_char_p
    return fn().decode(errors="replace")


def _find_openblas_function(name):
    """(library, symbol) of OpenBLAS's ``name`` (openblas_NAME, or scipy-openblas's prefixed / 64-bit forms) in
    the OpenBLAS shared library this process loaded, or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = {line.split()[-1] for line in f
                     if len(line.split()) >= 6 and "openblas" in line.split()[-1].lower() and ".so" in line.split()[-1]}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for suffix in ("64_", "_64_", ""):
            for prefix in ("scipy_openblas", "openblas"):
                if hasattr(lib, f"{prefix}_{name}{suffix}"):
                    return lib, f"{prefix}_{name}{suffix}"
    return None


class blas_threads:
    """Context manager: run the enclosed code with the OpenBLAS thread count set to ``n`` (process-wide),
    then restore it. Used by the benchmark's single-core comparison; a no-op (``.applied`` False) when NumPy's
    BLAS is not an OpenBLAS whose thread count can be set."""

    def __init__(self, n):
        self.n = int(n)
        self.applied = False
        self._saved = None

    def __enter__(self):
        fns = _openblas_thread_functions()
        if fns is not None:
            get, set_ = fns
            self._saved = (set_, get())
            set_(self.n)
            self.applied = True
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            set_, n = self._saved
            set_(n)
        return False


def single_threaded_blas():
    """Set the BLAS (OpenBLAS) to one thread for the rest of the process, as a data-parallel worker does."""
    fns = _openblas_thread_functions()
    if fns is not None:
        fns[1](1)


class single_threaded:
    """Context manager: numformer's kernels and the BLAS on the calling thread only, restored afterwards.

    Each process of data-parallel training computes its share of a batch this way (the other cores are
    busy with the other shares)."""

    def __enter__(self):
        self._threads = _threads["n"]
        _threads["n"] = 1
        self.blas = blas_threads(1).__enter__()                 # .applied: whether the BLAS could be set
        return self

    def __exit__(self, *exc):
        _threads["n"] = self._threads
        return self.blas.__exit__(*exc)


# -- matrix products ------------------------------------------------------------------------------------
# Speed only: ``matmul`` and ``matmul_pair`` compute ``a @ b`` (the reference) with numformer's threads.

def products_in_pieces(m, n, k):
    """Whether pieces of a parallel_for may compute m×k by k×n products themselves (see parallel_for)."""
    return _state["own_blas"] or m * n * k <= BLAS_SINGLE_THREAD_MNK


# Multiply-adds per thread below which a product is not split.
MATMUL_GRAIN = 1 << 21
# Products with at most this many rows in ``a`` (a decoding step's batch) are split by the columns of ``b``: split
# by rows, every thread would read all of b (the weights), and such products take their time reading b.
FEW_ROWS = 16
# OpenBLAS's small-matrix kernels multiply without first copying (packing) the operands into its own layout.
# Its SkylakeX family (SkylakeX, Cooperlake, SapphireRapids: AVX-512) has them, and takes them for products of
# m·n·k <= 100³ multiply-adds (and, with the first operand transposed in its column-major terms, m·n <= 1200).
# A few rows of x times a weight matrix are far larger, and packing the weights then costs more than the
# products: cut into column blocks below those limits, x Wᵀ with 2-16 rows of x runs several times faster on
# one thread (docs/tutorials/fast-numpy.md, "A few rows times the weights"). The other kernel families have no
# small-matrix kernel, and there the blocks gain nothing.
SMALL_MNK, SMALL_MN = 100 ** 3, 1200
SMALL_KERNEL_CORES = ("skylakex", "cooperlake", "sapphirerapids")


@functools.lru_cache(maxsize=None)
def small_kernels():
    """Whether the BLAS has small-matrix kernels (OpenBLAS's SkylakeX family; see ``SMALL_MNK``)."""
    return (openblas_core() or "").lower() in SMALL_KERNEL_CORES


def few_rows_columns(m, k):
    """Columns of b per product when a (m, k) has 2 to FEW_ROWS rows, so that each takes the BLAS's small-matrix
    kernel (``SMALL_MNK``): a multiple of 8, or 0 where there is no such kernel or a block would be narrower."""
    if not 2 <= m <= FEW_ROWS or not small_kernels():
        return 0
    cols = min(SMALL_MNK // (m * k), SMALL_MN // m) // 8 * 8
    return cols if cols >= 8 else 0


def column_blocks(a, b, out, lo, hi, cols):
    """out[:, lo:hi] = a @ b[:, lo:hi], in products of ``cols`` columns of b (``few_rows_columns``)."""
    for c0 in range(lo, hi, cols):
        c1 = min(c0 + cols, hi)
        np.matmul(a, b[:, c0:c1], out=out[:, c0:c1])


def matmul(a, b, out=None):
    """a @ b for 2-D operands: the fast version of ``np.matmul(a, b)`` (the reference, which this returns
    whenever the product is small or numformer does not own the BLAS threads). When numformer owns the BLAS
    threads (see set_fast_runtime), a large product is split by rows of ``a`` across numformer's threads, or
    by columns of ``b`` when ``a`` has at most ``FEW_ROWS`` rows; with 2 to ``FEW_ROWS`` rows each thread's
    columns are multiplied in blocks that the BLAS's small-matrix kernels take, where it has them
    (``few_rows_columns``), on one thread too. Each block computes the same sums as the whole product;
    whether it rounds them identically depends on the BLAS kernel (see the module docstring).
    tests/test_kernels.py compares the two."""
    m, k = a.shape
    n = b.shape[1]
    cols = few_rows_columns(m, k) if _state["own_blas"] else 0      # with one BLAS thread, few rows of a
    cols = cols if cols < n else 0
    split = _state["own_blas"] and get_num_threads() > 1 and m * n * k >= 2 * MATMUL_GRAIN
    if not split and not cols:
        return np.matmul(a, b, out=out)
    if out is None:
        out = np.empty((m, n), np.result_type(a, b))
    if m <= FEW_ROWS:          # a decoding step: each thread reads its own columns of b (the weights) once
        def columns(lo, hi):
            column_blocks(a, b, out, lo, hi, cols or max(hi - lo, 1))

        if split:
            parallel_for(n, columns, max(1, MATMUL_GRAIN // max(m * k, 1)))
        else:
            columns(0, n)
        return out
    rows = max(1, MATMUL_GRAIN // max(n * k, 1))
    parallel_for(m, lambda lo, hi: np.matmul(a[lo:hi], b, out=out[lo:hi]), rows)
    return out


def matmul_pair(a1, b1, a2, b2):
    """(a1 @ b1, a2 @ b2). When numformer owns the BLAS threads and has two or more threads, two large products
    of similar size run at the same time, one per thread (a linear layer's backward: dx = dy W and
    dW = dyᵀ x have the same cost); otherwise each goes through ``matmul``."""
    m1, k1 = a1.shape
    m2, k2 = a2.shape
    w1, w2 = m1 * k1 * b1.shape[1], m2 * k2 * b2.shape[1]
    if (not _state["own_blas"] or get_num_threads() < 2 or min(w1, w2) < MATMUL_GRAIN
            or max(w1, w2) > 2 * min(w1, w2)):
        return matmul(a1, b1), matmul(a2, b2)
    out1 = np.empty((m1, b1.shape[1]), np.result_type(a1, b1))
    out2 = np.empty((m2, b2.shape[1]), np.result_type(a2, b2))
    pairs = ((a1, b1, out1), (a2, b2, out2))

    def piece(lo, hi):
        for a, b, out in pairs[lo:hi]:
            np.matmul(a, b, out=out)

    parallel_for(2, piece, 1)
    return out1, out2
