"""Worker processes for int8 generation: each small-batch product's output rows shared with processes that
map the same int8 weights.

    with worker_processes(model):               # the model's int8 weights move to a shared mapping
        model.generate(prompt, 100)             # each product: this process's rows and the workers' at once

Why processes and not threads. A batch-1 product of int8 weights takes well under a millisecond (a Qwen3-0.6B
layer's five products: 0.1-0.8 ms each), and generation makes one for every linear layer of every token. On a
virtual machine a thread that waits for work sleeps, its virtual CPU halts, and waking it costs tens of
microseconds (75-80 measured on an AMD EPYC guest, ``docs/tutorials/quantization.md``); a Python thread that
polls instead must still take the GIL to start its piece, and CPython's GIL wait is itself such a sleep. A
process has its own GIL: it can poll for the next piece without sleeping, so a hand-off costs about a
microsecond. The price is a busy core while work is coming: a worker polls for ``spin_seconds`` after its
last piece, then sleeps until a byte comes on its pipe (the first product after a pause pays one wake-up).

How one product runs (``WorkerProcesses.product``): this process writes xᵀ into the shared input buffer, gives each
worker its share of the output rows (equal shares in multiples of ``kernel.ROW_UNIT``, split as the threads split
them but down to ``MIN_PIECE_WEIGHTS``, a smaller share than theirs), computes the first share itself with
``kernel.product_rows``, and waits for the workers, who run the same function on their rows of the shared mapping
and write them into the shared output. Where the threads split a matrix alike, the results are theirs bit for bit
(same shares, same blocks); elsewhere they agree to rounding. Only weights that live in the mapping take this path
(a layer made or converted after the ``with`` began runs on threads), and only batches of up to
``kernel.SMALL_BATCH`` rows; one thread at a time uses the workers (another meanwhile runs on threads).

The mapping is a file in /dev/shm (memory; a temporary folder when that lacks room), removed as soon as it is
made: the workers inherit it open, so no file outlives this process however it ends; on leaving the ``with``,
the layers get private copies of their weights back, each array's pages of the mapping freed as soon as it is
copied (``WorkerProcesses._copy_out``), so the weights are held twice one array at a time, not whole.
"""
from __future__ import annotations

import contextlib
import json
import mmap
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from .._limits import bounded_json
from .._platform import process_cpu_seconds
from .._runtime import blas_threads, get_num_threads, release_free_memory
from . import kernel
from .layer import QuantizedLinear

__all__ = ["worker_processes", "WorkerProcesses"]

SPIN_SECONDS = 0.01          # a worker polls this long after its last piece before it sleeps
ALIGN = 64                   # every array in the mapping starts on a cache line
MIN_PIECE_WEIGHTS = 1 << 16  # no process gets fewer weights (~10 us of work; a hand-off costs ~1 us)
# One worker's control words (int64), on a line of its own: the job counter this process raises, the counter
# of finished jobs the worker raises, and the job.
# ASLEEP: 1 while the worker sleeps on its pipe (a job then comes with a byte there; a polling worker needs none).
JOB, DONE, ERROR, Q_OFFSET, S_OFFSET, N_ROWS, K_COLS, GROUPS, GROUP_WIDTH, M_ROWS, LO, HI, DTYPE, ASLEEP = range(14)
CONTROL_WORDS = 16
STOP_JOB = -2                # the job number that stops a worker
START_SECONDS = 120          # a worker that has not mapped the file by then is given up
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
ERROR_BYTES = 2048
MAX_KNOWN_ARRAYS = 4096      # arrays whose offset in the mapping is remembered (two per layer), and product plans


@contextlib.contextmanager
def worker_processes(model, processes=None, spin_seconds=SPIN_SECONDS):
    """Run the model's int8 products for small batches across ``processes`` processes (this one and
    ``processes - 1`` workers; default numformer's thread count, ``numformer.set_num_threads``) inside the
    ``with``. One process, or Windows (the workers inherit the mapping's file descriptor, a POSIX feature):
    nothing changes. See the module docstring."""
    processes = get_num_threads() if processes is None else processes
    if isinstance(processes, bool) or not isinstance(processes, (int, np.integer)) or processes < 1:
        raise ValueError(f"processes must be a positive integer, got {processes!r}")
    layers = list({id(m): m for m in model.modules() if isinstance(m, QuantizedLinear)}.values())
    if not layers:
        raise ValueError("worker_processes needs a model with int8 layers: run "
                         "numformer.quantize.quantize_model(model) first")
    if processes == 1 or os.name == "nt":
        yield None
        return
    pool = WorkerProcesses(layers, processes - 1, spin_seconds)
    try:
        kernel._product_pool = pool
        yield pool
    finally:
        kernel._product_pool = None
        pool.close()


class WorkerProcesses:
    """The shared mapping (control words, input, output, the layers' int8 weights and scales) and the worker
    processes; ``product`` runs one product across them. Made and closed by ``worker_processes``."""

    def __init__(self, layers, n_workers, spin_seconds=SPIN_SECONDS):
        self.layers, self.n_workers = layers, n_workers
        self._lock, self._job, self._workers, self._fd = threading.Lock(), 0, [], None
        self._offsets = {}          # id(array) -> (array, its offset or None): ``_known_offset``
        self._plans = {}            # a product's shape and weights -> its views, shares and job words: ``_plan``
        x_bytes = max(m.qweight.shape[1] for m in layers) * kernel.SMALL_BATCH * 8     # float64 at most
        y_bytes = max(m.qweight.shape[0] for m in layers) * kernel.SMALL_BATCH * 8
        self.layout = _layout(n_workers, x_bytes, y_bytes, layers)
        try:
            self._map_file(self.layout["size"])
            self._move_weights_in()
            self._start_workers(spin_seconds)
        except BaseException:
            self.close()
            raise

    def _map_file(self, size):
        folder = "/dev/shm" if _room("/dev/shm", size) else tempfile.gettempdir()
        if not _room(folder, size):
            raise MemoryError(f"worker_processes needs {size / 2**20:,.0f} MiB of shared memory for the int8 "
                              f"weights, and neither /dev/shm nor {folder} has that much room: free some, or run "
                              f"on one process (NUMFORMER_NUM_THREADS=1)")
        self._fd, path = tempfile.mkstemp(prefix=f"numformer-int8-{os.getpid()}-", dir=folder)   # whose it is
        os.unlink(path)             # at once: the workers map the open file, and no kill of this process leaves it
        os.ftruncate(self._fd, size)
        self._mmap = mmap.mmap(self._fd, size)
        self._base = np.frombuffer(self._mmap, np.uint8)
        self._address = self._base.ctypes.data
        words = self._view(self.layout["control"], np.int64, self.n_workers * CONTROL_WORDS)
        self.control = words.reshape(self.n_workers, CONTROL_WORDS)
        self._x = self._view(self.layout["x"], np.uint8, self.layout["x_bytes"])
        self._y = self._view(self.layout["y"], np.uint8, self.layout["y_bytes"])

    def _view(self, offset, dtype, count):
        return np.frombuffer(self._mmap, dtype, count, offset)

    def _move_weights_in(self):
        """Each layer's qweight and scales become views of their place in the mapping (copied there). The
        memory of each private copy goes back to the system once it is freed (``release_free_memory``): the
        weights are held twice one layer at a time, not whole."""
        for layer, (q_offset, s_offset) in zip(self.layers, self.layout["weights"]):
            q = self._view(q_offset, np.int8, layer.qweight.size).reshape(layer.qweight.shape)
            s = self._view(s_offset, layer.scales.dtype, layer.scales.size).reshape(layer.scales.shape)
            q[...], s[...] = layer.qweight, layer.scales
            layer.qweight, layer.scales = q, s
            release_free_memory()

    def _start_workers(self, spin_seconds):
        """Start the workers (fresh interpreters: nothing of this process is copied or re-run; each inherits the
        open, already removed file) and wait until each has mapped it. A worker sleeps on its stdin between jobs:
        a byte there wakes it, and the end of the pipe (this process gone) stops it."""
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root,
                                                                            os.environ.get("PYTHONPATH")]))}
        shared = {key: self.layout[key] for key in ("size", "control", "errors", "x", "y")}
        for i in range(self.n_workers):
            command = [sys.executable, "-c", "from numformer.quantize.processes import _worker_main; "
                       "_worker_main()", str(self._fd), json.dumps(shared), str(i), repr(float(spin_seconds))]
            self._workers.append(subprocess.Popen(command, stdin=subprocess.PIPE, env=env, bufsize=0,
                                                  pass_fds=(self._fd,),
                                                  start_new_session=True))   # Ctrl-C is this process's to handle
        for i in range(self.n_workers):                         # each worker marks DONE -1 once mapped
            self._wait(i, -1, "start", poll_seconds=0.001, timeout=START_SECONDS)
        os.close(self._fd)                                      # the mappings stay
        self._fd = None

    def product(self, x2, q, scales, g):
        """x2 Ŵᵀ as ``kernel._small_batch``, the rows shared with the workers; None when this product cannot
        take the path (weights outside the mapping, another dtype, a larger batch, the workers busy)."""
        m, K = x2.shape
        N = q.shape[0]
        q_offset, s_offset = self._known_offset(q), self._known_offset(scales)
        if (q_offset is None or s_offset is None or x2.dtype not in DTYPES or scales.dtype != x2.dtype
                or m * K * 8 > self.layout["x_bytes"] or m * N * 8 > self.layout["y_bytes"]):
            return None
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._product(x2, q, scales, g, q_offset, s_offset)
        finally:
            self._lock.release()

    def _product(self, x2, q, scales, g, q_offset, s_offset):
        m, K = x2.shape
        N = q.shape[0]
        xT, yT, bounds, words = self._plan(m, N, K, x2.dtype, q_offset, s_offset, scales.shape[1], g)
        xT[...] = x2[0] if m == 1 else x2.T
        workers = len(words)
        if workers:
            self._job += 1
        for i in range(workers):
            c = self.control[i]
            c[Q_OFFSET:DTYPE + 1] = words[i]
            c[JOB] = self._job
            if c[ASLEEP]:                                       # a polling worker finds its job without a byte
                self._wake(i, "product")
        with kernel._one_blas_thread():
            kernel.product_rows(q, scales, g, xT, yT, bounds[0], bounds[1])
        for i in range(workers):
            self._wait(i, self._job, "product")
        return yT.reshape(1, N).copy() if m == 1 else np.ascontiguousarray(yT.T)

    def _plan(self, m, N, K, dtype, q_offset, s_offset, G, g):
        """(xT and yT: views of the shared input and output, the row bounds of each process's share, each worker's
        job words) of a product, remembered by its shape and weights (the same products come back every token).
        The shares are the threads' split (``kernel.ROW_UNIT``), down to ``MIN_PIECE_WEIGHTS``."""
        key = (m, N, K, dtype, q_offset, s_offset, G, g)
        plan = self._plans.get(key)
        if plan is None:
            xT = self._x[:m * K * dtype.itemsize].view(dtype).reshape((K,) if m == 1 else (K, m))
            yT = self._y[:m * N * dtype.itemsize].view(dtype).reshape((N,) if m == 1 else (N, m))
            units = -(-N // kernel.ROW_UNIT)
            pieces = max(1, min(self.n_workers + 1, units // max(1, -(-MIN_PIECE_WEIGHTS // (K * kernel.ROW_UNIT)))))
            bounds = [min(units * i // pieces * kernel.ROW_UNIT, N) for i in range(pieces + 1)]
            words = [np.array([q_offset, s_offset, N, K, G, g, m, bounds[i + 1], bounds[i + 2], DTYPES.index(dtype)],
                              np.int64) for i in range(pieces - 1)]
            if len(self._plans) >= MAX_KNOWN_ARRAYS:
                self._plans.clear()
            plan = self._plans[key] = (xT, yT, bounds, words)
        return plan

    def cpu_seconds(self):
        """CPU seconds (user + system) the workers have used so far (0.0 for a worker that cannot be read)."""
        return sum(process_cpu_seconds(worker.pid) or 0.0 for worker in self._workers)

    def _wait(self, i, job, what, poll_seconds=0.0, timeout=None):
        """Poll until worker i has finished ``job`` (sleeping ``poll_seconds`` between looks); raise if it
        reported an error, stopped, or (with a ``timeout`` in seconds) took longer."""
        control, polls, deadline = self.control[i], 0, None if timeout is None else time.monotonic() + timeout
        while control[DONE] != job:
            polls += 1
            if poll_seconds:
                time.sleep(poll_seconds)
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(f"numformer's int8 worker process {i + 1} did not {what} within {timeout:g} s; "
                                   f"leave worker_processes and run on threads")
            if poll_seconds or polls % 4096 == 0:                   # every ~0.5 ms of polling
                if self._workers[i].poll() is not None:
                    raise self._stopped(i, what)
                if not poll_seconds:
                    self._wake(i, what)     # a worker asleep before its job's counter was raised (a slow hand-off)
        if control[ERROR]:
            control[ERROR] = 0
            raise RuntimeError(f"numformer's int8 worker process {i + 1} failed: {self._error_text(i)}")

    def _wake(self, i, what):
        """Write a byte to worker i's pipe: a sleeping worker wakes and polls for its job."""
        try:
            self._workers[i].stdin.write(b"j")
        except OSError:                                         # its pipe is closed: the worker is gone
            self._workers[i].wait()
            raise self._stopped(i, what) from None

    def _stopped(self, i, what):
        return RuntimeError(f"numformer's int8 worker process {i + 1} stopped (exit code "
                            f"{self._workers[i].returncode}) during a {what}; leave worker_processes and run on "
                            f"threads")

    def _error_text(self, i):
        raw = self._view(self.layout["errors"] + i * ERROR_BYTES, np.uint8, ERROR_BYTES).tobytes()
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    def _known_offset(self, a):
        """``_offset(a)``, remembered for the array object (a layer's weights come back every token; finding the
        address of an array costs microseconds)."""
        known = self._offsets.get(id(a))
        if known is None or known[0] is not a:
            if len(self._offsets) >= MAX_KNOWN_ARRAYS:
                self._offsets.clear()
            known = self._offsets[id(a)] = (a, self._offset(a))
        return known[1]

    def _offset(self, a):
        """Offset of array ``a`` in the mapping if it is a C-contiguous array inside it, else None."""
        if not a.flags.c_contiguous:
            return None
        offset = a.ctypes.data - self._address
        return offset if 0 <= offset and offset + a.nbytes <= self.layout["size"] else None

    def close(self):
        """Stop the workers, give the layers private copies of their weights, release the mapping."""
        for i, worker in enumerate(self._workers):              # the end of its stdin stops a worker, and so
            with contextlib.suppress(OSError):                  # does STOP_JOB (one that polls for a job)
                worker.stdin.close()
            self.control[i, JOB] = STOP_JOB
        for worker in self._workers:
            try:
                worker.wait(timeout=5)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        self._workers = []
        self._offsets, self._plans = {}, {}                     # their arrays are views of the mapping
        if getattr(self, "_mmap", None) is not None:
            for layer in self.layers:
                self._copy_out(layer, "qweight")
                self._copy_out(layer, "scales")
            self.control = self._x = self._y = self._base = None
            with contextlib.suppress(BufferError):               # a view someone still holds keeps it mapped
                self._mmap.close()
            self._mmap = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _copy_out(self, layer, name):
        """Give ``layer`` a private copy of its array ``name`` (qweight or scales) if that lives in the mapping,
        then free the mapping's pages that lie wholly inside it (``MADV_REMOVE``, Linux: the file's memory goes
        back to the system, not only this process's view of it; elsewhere, or on a file system that cannot make
        holes, nothing), so that closing holds the weights twice one array at a time. Pages shared with a
        neighbouring array are kept, and so is every page while anything else still refers to the array:
        freed pages read zeros. The layer's array is a view of a flat one over its bytes
        (``_move_weights_in``), and numpy makes every view of it refer to that flat array (a view's base is the
        first array up the chain that is not a view); so once this frame's reference to the layer's array is
        dropped, the flat array's count of references must equal that of an array nothing else refers to,
        counted the same way."""
        shared = getattr(layer, name)
        offset = self._offset(shared)
        if offset is None:
            return
        setattr(layer, name, shared.copy())
        flat, nbytes = shared.base, shared.nbytes
        del shared
        alone = np.empty(0)
        if (not hasattr(mmap, "MADV_REMOVE") or not isinstance(flat, np.ndarray) or flat.nbytes != nbytes
                or self._offset(flat) != offset or sys.getrefcount(flat) != sys.getrefcount(alone)):
            return
        start = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
        stop = (offset + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if start < stop:
            with contextlib.suppress(OSError):
                self._mmap.madvise(mmap.MADV_REMOVE, start, stop - start)


def _room(folder, size):
    """Whether ``folder`` exists and has ``size`` bytes free (and a margin of 64 MiB)."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize >= size + (64 << 20)


def _layout(n_workers, x_bytes, y_bytes, layers):
    """Offsets in the mapping: control words, error texts, input, output, then each layer's (qweight, scales)."""
    def aligned(n):
        return -(-n // ALIGN) * ALIGN
    layout = {"control": 0, "errors": aligned(n_workers * CONTROL_WORDS * 8), "x_bytes": x_bytes,
              "y_bytes": y_bytes}
    layout["x"] = aligned(layout["errors"] + n_workers * ERROR_BYTES)
    layout["y"] = aligned(layout["x"] + x_bytes)
    end, layout["weights"] = aligned(layout["y"] + y_bytes), []
    for layer in layers:
        q_offset = end
        s_offset = aligned(q_offset + layer.qweight.nbytes)
        end = aligned(s_offset + layer.scales.nbytes)
        layout["weights"].append((q_offset, s_offset))
    layout["size"] = end
    return layout


def _worker_main():
    """A worker process (argv: the open file's descriptor, the layout as JSON, its index, spin seconds): map the
    file, then run each job given in its control words until its stdin ends."""
    fd, index, spin_seconds = int(sys.argv[1]), int(sys.argv[3]), float(sys.argv[4])
    layout = bounded_json(sys.argv[2], "the worker's layout")
    shared = mmap.mmap(fd, layout["size"])
    os.close(fd)
    control = np.frombuffer(shared, np.int64, CONTROL_WORDS, layout["control"] + index * CONTROL_WORDS * 8)
    error = np.frombuffer(shared, np.uint8, ERROR_BYTES, layout["errors"] + index * ERROR_BYTES)
    wake_fd, parent = sys.stdin.fileno(), os.getppid()
    os.set_blocking(wake_fd, False)
    control[DONE] = -1
    seen, views = 0, {}
    with blas_threads(1):
        while True:
            seen = _next_job(control, wake_fd, seen, spin_seconds, parent)
            if seen is None:
                return
            try:
                _run_job(shared, layout, control, views)
            except Exception as e:                              # reported to the process that waits for it
                text = f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:ERROR_BYTES - 1]
                error[:len(text)] = np.frombuffer(text, np.uint8)
                error[len(text)] = 0
                control[ERROR] = 1
            control[DONE] = seen


def _next_job(control, wake_fd, seen, spin_seconds, parent):
    """Poll the job counter for ``spin_seconds``; without a new job, mark the worker ``ASLEEP`` and sleep until
    a byte comes on ``wake_fd`` (the process that gives a job writes one when it sees the mark; one that waits
    for a job that does not start writes another), read every byte there, and poll again. Returns the new job's
    number, or None to stop: ``STOP_JOB``, the end of the pipe, or the ``parent`` process gone. The bytes only
    wake: a byte left from a job found by polling costs one more round of polling later."""
    while True:
        deadline = time.perf_counter() + spin_seconds
        while control[JOB] == seen and time.perf_counter() < deadline:
            pass
        if control[JOB] != seen:
            break
        control[ASLEEP] = 1
        if control[JOB] == seen:                                # a job raised meanwhile may have come without a byte
            select.select([wake_fd], [], [])
            if not _read_all(wake_fd) or os.getppid() != parent:
                return None
        control[ASLEEP] = 0
    job = int(control[JOB])
    return None if job == STOP_JOB else job


def _read_all(fd):
    """Read every byte waiting on the non-blocking ``fd``; False at the end of the pipe (this process's parent
    closed it or is gone)."""
    while True:
        try:
            if not os.read(fd, 4096):
                return False
        except BlockingIOError:
            return True


def _run_job(shared, layout, control, views):
    """This worker's rows of one product: yT[lo:hi] = Ŵ[lo:hi] xT from the mapping (``views``: the arrays of
    the jobs seen so far, by their words)."""
    q_offset, s_offset, N, K, G, g, m, lo, hi, code = control[Q_OFFSET:DTYPE + 1].tolist()
    key = (q_offset, s_offset, N, K, G, m, code)
    arrays = views.get(key)
    if arrays is None:
        dtype = DTYPES[code]
        arrays = (np.frombuffer(shared, np.int8, N * K, q_offset).reshape(N, K),
                  np.frombuffer(shared, dtype, N * G, s_offset).reshape(N, G),
                  np.frombuffer(shared, dtype, K * m, layout["x"]).reshape((K,) if m == 1 else (K, m)),
                  np.frombuffer(shared, dtype, N * m, layout["y"]).reshape((N,) if m == 1 else (N, m)))
        if len(views) >= MAX_KNOWN_ARRAYS:
            views.clear()
        views[key] = arrays
    q, scales, xT, yT = arrays
    kernel.product_rows(q, scales, g, xT, yT, lo, hi)
