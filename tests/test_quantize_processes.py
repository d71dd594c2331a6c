"""numformer.quantize.worker_processes: the int8 products' rows shared with worker processes, the same numbers
as the threads (bit for bit: same shares, same blocks), generation unchanged, a sleeping worker woken, every
failure reported, nothing left behind (no worker, no file, no view of the mapping in the layers)."""
from __future__ import annotations

import ctypes
import glob
import mmap
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from numformer import GPT, _runtime
from numformer.nn import Linear, Module
from numformer.quantize import QuantizedLinear, kernel, quantize_model, quantized_linear_forward, worker_processes
from numformer.quantize import processes

TOL = {np.float32: 1e-5, np.float64: 1e-12}


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


class Layers(Module):
    """A bag of QuantizedLinear layers (worker_processes takes a model and finds its int8 layers)."""

    def __init__(self, layers):
        super().__init__()
        for i, layer in enumerate(layers):
            setattr(self, f"layer{i}", layer)


def int8_layer(rng, N, K, group_size=None, dtype=np.float32):
    linear = Linear(K, N, bias=True, rng=rng)
    linear.weight.data = rng.standard_normal((N, K)).astype(dtype)
    linear.bias.data = rng.standard_normal(N).astype(dtype)
    return QuantizedLinear.from_linear(linear, 8, group_size)


def leftover_files():
    """This process's mapping files (another test process's come and go meanwhile)."""
    name = f"numformer-int8-{os.getpid()}-*"
    return set(glob.glob(os.path.join("/dev/shm", name))) | set(glob.glob(os.path.join(tempfile.gettempdir(), name)))


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setitem(_runtime._threads, "n", 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_products_are_the_threads_bit_for_bit(dtype, rng, monkeypatch, two_threads):
    """Per channel and per group, batch 1 and 5, a row count that is not a multiple of 8, a slice of rows (as
    cross-attention's project_parts takes): the pool's result is the two threads' exactly when they split the
    rows alike (the same smallest share), and the reference's to rounding."""
    monkeypatch.setattr(kernel, "MIN_PIECE_WEIGHTS", processes.MIN_PIECE_WEIGHTS)
    layers = [int8_layer(rng, 1003, 256, None, dtype), int8_layer(rng, 1024, 200, 64, dtype)]
    xs = {m: rng.standard_normal((m, 256)).astype(dtype) for m in (1, 5)}
    xs.update({(m, 200): rng.standard_normal((m, 200)).astype(dtype) for m in (1, 5)})

    def products():
        out = []
        for m in (1, 5):
            out.append(layers[0](xs[m]))
            out.append(layers[1](xs[(m, 200)]))
            rows = slice(128, 1024)
            out.append(layers[1]._product(xs[(m, 200)], layers[1].qweight[rows], layers[1].scales[rows], None))
        return out

    threads = products()
    before = leftover_files()
    with worker_processes(Layers(layers)) as pool:
        assert pool.n_workers == 1 and kernel._product_pool is pool
        assert pool._offset(layers[0].qweight) is not None            # the weights live in the mapping
        assert leftover_files() == before                               # whose file is gone once mapped
        shared = products()
        assert int(pool.control[0, processes.DONE]) == pool._job == 6   # every product went through the worker
    assert kernel._product_pool is None and leftover_files() <= before
    for a, b in zip(shared, threads):
        assert a.dtype == dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    layer = layers[1]
    x = xs[(5, 200)]
    ref = quantized_linear_forward(x, layer.qweight, layer.scales, 64, layer.bias.data)
    assert rel_err(shared[4], ref) < TOL[dtype]


def test_generation_is_unchanged_and_the_weights_come_back_private(rng, monkeypatch, two_threads):
    """Greedy generation (prefill of 2 × 7 rows, then batch-2 steps) gives the same tokens and logits; after
    the with, every layer holds a private copy of the same weights and no worker is left. Inside it, the
    private copies' memory went back to the system as each layer moved into the mapping."""
    released = []
    monkeypatch.setattr(processes, "release_free_memory", lambda: released.append(
        sum(isinstance(m, QuantizedLinear) and m.qweight.flags.owndata for m in model.modules())))
    monkeypatch.setattr(processes, "MIN_PIECE_WEIGHTS", 1)          # split even this small model's products
    monkeypatch.setattr(kernel, "MIN_PIECE_WEIGHTS", 1)             # and the threads' alike
    model = GPT(vocab_size=97, block_size=32, n_layers=2, n_heads=4, d_model=64, rng=rng).eval()
    quantize_model(model, group_size=16)
    prompt = rng.integers(0, 97, (2, 7))
    expected, logits = model.generate(prompt, 10, greedy=True, return_logits=True)
    weights = {n: m.qweight.copy() for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    with worker_processes(model, processes=2) as pool:
        got, got_logits = model.generate(prompt, 10, greedy=True, return_logits=True)
        workers = list(pool._workers)
        assert pool._job > 0
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got_logits, logits)
    n_layers = len(weights)
    assert released == list(range(n_layers - 1, -1, -1))             # one layer fewer private at each release
    assert all(w.poll() is not None for w in workers)
    for name, m in model.named_modules():
        if isinstance(m, QuantizedLinear):
            assert m.qweight.flags.owndata and m.scales.flags.owndata and m.qweight.flags.writeable
            np.testing.assert_array_equal(m.qweight, weights[name])


def test_a_sleeping_worker_wakes_for_each_product(rng, two_threads):
    """spin_seconds=0: the worker sleeps on its pipe before every job; the numbers are the same."""
    layer = int8_layer(rng, 512, 256)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    expected = layer(x)
    with worker_processes(layer, spin_seconds=0) as pool:
        for _ in range(5):
            np.testing.assert_array_equal(layer(x), expected)
        assert pool._job == 5


def test_a_polling_worker_gets_its_jobs_without_a_byte(rng, monkeypatch, two_threads):
    """A worker that polls (within spin_seconds of its last job) is not marked asleep, and the products write
    nothing to its pipe (only ``_wait``'s fallback, for a hand-off slower than its polls, may)."""
    layer = int8_layer(rng, 512, 256)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    expected = layer(x)
    with worker_processes(layer, spin_seconds=60) as pool:
        waiting, wakes = [], []
        wait, wake = pool._wait, pool._wake

        def counted_wait(*args, **kwargs):
            waiting.append(True)
            try:
                return wait(*args, **kwargs)
            finally:
                waiting.pop()

        monkeypatch.setattr(pool, "_wait", counted_wait)
        monkeypatch.setattr(pool, "_wake", lambda i, what: (None if waiting else wakes.append(what), wake(i, what)))
        for _ in range(5):
            np.testing.assert_array_equal(layer(x), expected)
            assert pool.control[0, processes.ASLEEP] == 0
        assert pool._job == 5 and wakes == []


def test_more_processes_share_the_rows(rng, monkeypatch):
    """Three processes on a matrix of 1003 rows: three shares, the threads' numbers (three threads)."""
    monkeypatch.setitem(_runtime._threads, "n", 3)
    monkeypatch.setattr(kernel, "MIN_PIECE_WEIGHTS", processes.MIN_PIECE_WEIGHTS)
    layer = int8_layer(rng, 1003, 256, 32)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    expected = layer(x)
    with worker_processes(layer) as pool:
        assert pool.n_workers == 2
        np.testing.assert_array_equal(layer(x), expected)
        assert [int(pool.control[i, processes.DONE]) for i in range(2)] == [1, 1]


def test_what_cannot_take_the_path_runs_on_threads(rng, two_threads):
    """A layer made inside the with, a float64 input to float32 weights and a batch above SMALL_BATCH run as
    before, without the workers."""
    layer = int8_layer(rng, 512, 256)
    with worker_processes(layer) as pool:
        other = int8_layer(rng, 512, 256)
        x = rng.standard_normal((1, 256))
        ref = quantized_linear_forward(x.astype(np.float32), other.qweight, other.scales, None, other.bias.data)
        assert rel_err(other(x.astype(np.float32)), ref) < TOL[np.float32]
        assert layer(x).dtype == np.float64
        big = rng.standard_normal((kernel.SMALL_BATCH + 1, 256)).astype(np.float32)
        layer(big)
        assert pool._job == 0


def test_a_worker_error_and_a_dead_worker_are_reported(rng, two_threads):
    """An exception in the worker comes back as a RuntimeError with its text; a killed worker is named; the
    with still cleans up."""
    layer = int8_layer(rng, 512, 256)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    before = leftover_files()
    with pytest.raises(RuntimeError, match="worker process 1 stopped"):
        with worker_processes(layer) as pool:
            q_offset = pool._offset(layer.qweight)
            with pytest.raises(RuntimeError, match="worker process 1 failed: ValueError"):
                pool._product(x, layer.qweight, layer.scales, 256, q_offset, pool.layout["size"])
            ref = quantized_linear_forward(x, layer.qweight, layer.scales, None, layer.bias.data)
            assert rel_err(layer(x), ref) < TOL[np.float32]             # the next product works again
            pool._workers[0].kill()
            pool._workers[0].wait()
            layer(x)
    assert kernel._product_pool is None and leftover_files() <= before
    assert pool._workers == [] and layer.qweight.flags.owndata


def test_a_worker_that_does_not_start_in_time_is_given_up(rng, monkeypatch, two_threads):
    """No wait without end: a worker not started within START_SECONDS is an error naming it, and nothing is
    left behind (the worker stopped, no file, the layer's weights private). The mapping file is gone before the
    first worker starts: a kill of this process at any moment leaves none."""
    monkeypatch.setattr(processes, "START_SECONDS", 0)
    layer = int8_layer(rng, 512, 256)
    before = leftover_files()
    started, files_seen = [], []

    def popen(*args, popen=processes.subprocess.Popen, **kwargs):
        files_seen.append(leftover_files() - before)        # the file is removed before any worker starts
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(processes.subprocess, "Popen", popen)
    with pytest.raises(RuntimeError, match="worker process 1 did not start within 0 s"):
        with worker_processes(layer):
            pass
    assert started and all(w.poll() is not None for w in started) and files_seen == [set()]
    assert kernel._product_pool is None and leftover_files() <= before and layer.qweight.flags.owndata


def test_arguments(rng):
    layer = int8_layer(rng, 64, 32)
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="processes must be a positive integer"):
            with worker_processes(layer, processes=bad):
                pass
    with pytest.raises(ValueError, match=r"run numformer.quantize.quantize_model\(model\) first"):
        with worker_processes(GPT(vocab_size=11, block_size=4, n_layers=1, n_heads=2, d_model=8)):
            pass
    with worker_processes(layer, processes=1) as pool:         # one process: nothing changes
        assert pool is None and kernel._product_pool is None


def running(pid):
    """Whether process ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_process_leaves_no_file_and_no_worker(tmp_path):
    """SIGKILL of the process that made the workers (nothing of its own cleanup runs): no mapping file of it
    is left, and its workers end (their pipe closes)."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "hold.py"
    script.write_text(
        "import sys, time\n"
        "import numpy as np\n"
        "from numformer.nn import Linear\n"
        "from numformer.quantize import QuantizedLinear, worker_processes\n"
        "layer = QuantizedLinear.from_linear(Linear(256, 512, rng=np.random.default_rng(0)))\n"
        "with worker_processes(layer, processes=2) as pool:\n"
        "    print(' '.join(str(w.pid) for w in pool._workers), flush=True)\n"
        "    time.sleep(60)\n", encoding="utf-8")
    holder = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(pid) for pid in holder.stdout.readline().split()]
        assert len(workers) == 1
        name = f"numformer-int8-{holder.pid}-*"
        assert not glob.glob(os.path.join("/dev/shm", name)) + glob.glob(os.path.join(tempfile.gettempdir(), name))
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(map(running, workers)):
            time.sleep(0.05)
        assert not any(map(running, workers))
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def process_state(pid):
    return Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0]


def test_a_wake_without_its_job_and_a_job_without_its_wake(rng, two_threads):
    """The pipe's bytes only wake a worker. A byte without a job (Ctrl-C between writing it and raising the
    job's counter) leaves the worker asleep again after its poll, not polling for ever; a job raised while
    the worker sleeps without its byte (a hand-off slower than the poll) is found after the waiting process
    wakes it again. The products stay right."""
    layer = int8_layer(rng, 512, 256)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    expected = layer(x)
    with worker_processes(layer, spin_seconds=0.001) as pool:
        np.testing.assert_array_equal(layer(x), expected)
        worker = pool._workers[0]
        pool._wake(0, "product")                                   # a byte, and no job
        states = []
        for _ in range(400):                                       # asleep for 5 looks in a row (at most ~4 s)
            states = (states + [process_state(worker.pid)])[-5:]
            if states == ["S"] * 5:
                break
            time.sleep(0.01)
        assert states == ["S"] * 5
        c = pool.control[0]                                         # a job, and no byte: the empty rows 0:0
        pool._job += 1
        c[processes.Q_OFFSET:processes.DTYPE + 1] = (pool._offset(layer.qweight), pool._offset(layer.scales), 512,
                                                     256, 1, 256, 1, 0, 0, 0)
        c[processes.JOB] = pool._job
        pool._wait(0, pool._job, "product")
        np.testing.assert_array_equal(layer(x), expected)


linux = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_REMOVE"),
                           reason="the pages are freed with MADV_REMOVE and looked at with mincore: Linux")


def span(array):
    """(address, nbytes) of an array: where it lies, without holding it (a reference would keep its pages)."""
    return array.ctypes.data, array.nbytes


def page_range(address, nbytes):
    """(first, end) addresses of the whole pages inside bytes [address, address + nbytes)."""
    first = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    return first, max(first, (address + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE)


def resident(address, nbytes):
    """For each whole page inside bytes [address, address + nbytes) of this process: whether it is in memory
    (mincore)."""
    first, end = page_range(address, nbytes)
    pages = (ctypes.c_ubyte * ((end - first) // mmap.PAGESIZE))()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mincore(ctypes.c_void_p(first), ctypes.c_size_t(end - first), pages) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return [bool(p & 1) for p in pages]


@linux
def test_copying_a_weight_out_frees_its_pages(rng, monkeypatch, two_threads):
    """Once a weight is copied out of the mapping, the mapping's pages wholly inside it are freed (not in
    memory, reading zeros), while the bytes it shares pages with and every other weight keep their values,
    and their products (through the worker) their numbers; leaving the with frees every weight's pages."""
    monkeypatch.setattr(kernel, "MIN_PIECE_WEIGHTS", processes.MIN_PIECE_WEIGHTS)
    layers = [int8_layer(rng, 1003, 200), int8_layer(rng, 777, 96, 32), int8_layer(rng, 515, 300)]
    weights = [(m.qweight.copy(), m.scales.copy()) for m in layers]
    xs = [rng.standard_normal((1, m.qweight.shape[1])).astype(np.float32) for m in layers]
    expected = [m(x) for m, x in zip(layers, xs)]
    with worker_processes(Layers(layers)) as pool:
        spans = [span(a) for m in layers for a in (m.qweight, m.scales)]
        start = spans[0][0]                         # mapping[i]: the byte at start + i; held, the mapping stays
        mapping = pool._base[start - pool._address:]
        assert all(all(resident(*s)) for s in spans) and len(resident(*spans[2])) > 0
        pool._copy_out(layers[1], "qweight")
        assert layers[1].qweight.flags.owndata and not any(resident(*spans[2]))
        offset, end = spans[2][0] - start, spans[2][0] + spans[2][1] - start
        first, last = (a - start for a in page_range(*spans[2]))
        q = weights[1][0].ravel()                   # its bytes on pages shared with its neighbours: kept
        np.testing.assert_array_equal(mapping[offset:first].view(np.int8), q[:first - offset])
        np.testing.assert_array_equal(mapping[last:end].view(np.int8), q[last - offset:])
        for m, (qweight, scales) in zip(layers, weights):
            np.testing.assert_array_equal(m.qweight, qweight)
            np.testing.assert_array_equal(m.scales, scales)
        for m, x, y in zip(layers, xs, expected):
            np.testing.assert_array_equal(m(x), y)
        assert pool._offset(layers[0].qweight) is not None and pool._job > 0
    assert not any(any(resident(*s)) for s in spans)
    for s in spans:                                 # read only now: reading a freed page brings one back
        first, last = (a - start for a in page_range(*s))
        assert not mapping[first:last].any()
    for m, (qweight, scales) in zip(layers, weights):
        assert m.qweight.flags.owndata and m.scales.flags.owndata
        np.testing.assert_array_equal(m.qweight, qweight)
        np.testing.assert_array_equal(m.scales, scales)
    del mapping


@linux
@pytest.mark.parametrize("view", ["the array", "a slice"])
def test_a_view_still_alive_keeps_its_weight_s_pages(view, rng, two_threads):
    """A view of a weight held past the with (the array itself, or a slice of it) keeps that weight's pages
    and values; the other weights' pages are freed all the same."""
    layers = [int8_layer(rng, 1003, 200), int8_layer(rng, 515, 300)]
    weights = [m.qweight.copy() for m in layers]
    with worker_processes(Layers(layers)):
        held = layers[0].qweight if view == "the array" else layers[0].qweight[3:]
        other = span(layers[1].qweight)
    assert layers[0].qweight.flags.owndata                          # held keeps the mapping in this process
    np.testing.assert_array_equal(held, weights[0] if view == "the array" else weights[0][3:])
    assert all(resident(*span(held))) and len(resident(*span(held))) > 0
    assert not any(resident(*other))
    np.testing.assert_array_equal(layers[0].qweight, weights[0])
