"""Data parallelism across processes: each training batch is split over forked workers, one per core.

Speed only: the reference is one process computing the forward and backward
pass of the whole batch; tests/test_parallel.py checks that the split batch
gives the single-process gradient (float64).

    with DataParallel(model, processes=2, seed=1337) as dp:
        loss, n_targets = dp.forward_backward(batch.inputs, batch.targets)
        clip_grad_norm(...); optimizer.step()           # in the main process, as usual

Each process runs the reference training step, ``train.step.loss_and_backward``
(forward, cross-entropy, backward), on its share; this module only splits the
batch and adds up the gradients.

Why processes and not threads: one NumPy call on one core is already close to
what that core can do, and splitting every elementwise op and matrix product
across threads costs a synchronisation per op (about 80 per training step of
the nanoGPT model), which on small models costs more than it saves. Threads
that each run a whole forward and backward pass instead contend for the GIL
between NumPy calls. Processes have neither cost: each computes the forward
and backward pass of its share of the batch, from start to end, on its own
core, and the processes meet twice per step (the shares go out, the losses
come back), like PyTorch's DistributedDataParallel.

How it works:

* The parameters live in one block of shared memory (an anonymous shared
  ``mmap`` made before the workers are forked): every process's
  ``Parameter.data`` is a view into it, so the optimizer's in-place update in
  the main process is what the workers compute with at the next step.
* Each worker has a shared gradient block of the same layout; after its
  backward pass it copies its gradients there, and the main process adds them,
  in worker order, to the gradients of its own share (deterministic).
* Shares are weighted so that their gradients add up to the gradient of the
  whole batch's mean loss: share i's cross-entropy, a mean over its n_i counted
  targets, is scaled by n_i / N (N = the batch's counted targets). The result
  equals the single-process gradient up to float rounding (the sums are
  grouped differently).
* Dropout: worker i reseeds the model's random generators once from
  (seed, i), so the shares draw independent masks. ``rng_states()`` and
  ``set_rng_states()`` let the trainer checkpoint them, so a resumed run is
  exact.

Across machines, ``train/mpi.py`` (``MPIDataParallel``) does the same one level
up, with the same interface (``forward_backward`` on a global batch, token-
weighted shares, generator states for the checkpoint, one writer of the run
folder) plus ``combine``, the one Allreduce of a step; inside each MPI rank a
``DataParallel`` splits that rank's share across the machine's cores.

Every process runs its kernels and its BLAS on one thread while it computes a
share; outside ``forward_backward`` (evaluation, the optimizer) the main process
keeps its threads. Linux only (``fork``); models whose normalization mixes
examples of a batch (``norm = "batch"``) cannot be split.
"""
from __future__ import annotations

import mmap
import os
import signal
import traceback

import numpy as np

from .. import _platform
from .._runtime import get_num_threads, set_num_threads, single_threaded, single_threaded_blas
from ..data.base import IGNORE
from ..nn.layers import BatchStatNorm
from . import stop_signals
from .step import loss_and_backward


class DataParallelError(RuntimeError):
    """A data-parallel worker failed or died; the message says which and what to try."""


def usable_processes(model, batch_size, requested=0):
    """How many processes to train with: ``requested``, or for 0 (auto) one per usable core, at most one per
    example of a batch; 1 where data parallelism is unavailable (not Linux, batch-statistics norm)."""
    reason = unavailable_reason(model)
    if requested < 0:
        raise ValueError(f"[train] processes must be 0 (one per core) or a positive count, got {requested}")
    if requested == 0:
        return 1 if reason else max(1, min(get_num_threads(), batch_size))
    if requested > 1 and reason:
        raise ValueError(f"[train] processes = {requested}: {reason}; set [train] processes = 1")
    return requested


def unavailable_reason(model):
    """Why this model cannot be trained data-parallel here, or None."""
    reason = _platform.forked_workers_unavailable()
    if reason:
        return reason
    if any(isinstance(m, BatchStatNorm) for m in model.modules()):
        return "norm = \"batch\" normalizes over the whole batch, so the batch cannot be split across processes"
    return None


def _generators(model):
    """The distinct numpy Generators the model's modules hold (dropout masks), in module order."""
    seen, gens = set(), []
    for m in model.modules():
        for value in vars(m).values():
            if isinstance(value, np.random.Generator) and id(value) not in seen:
                seen.add(id(value))
                gens.append(value)
    return gens


def _shares(n, parts):
    """Contiguous slices splitting range(n) into ``parts`` nearly equal pieces."""
    bounds = [n * i // parts for i in range(parts + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(parts)]


def share_text(n, parts):
    """How ``parts`` processes split a batch of ``n`` examples, for the line a run starts with: "1/4 of every
    batch" when the shares are equal, else "its share of every batch of 7 (3 and 4 examples)"."""
    sizes = [s.stop - s.start for s in _shares(n, parts)]
    if len(set(sizes)) == 1:
        return f"1/{parts} of every batch"
    listed = ", ".join(map(str, sizes[:-1])) + f" and {sizes[-1]}"
    return f"its share of every batch of {n} ({listed} examples)"


def _take(inputs, share, batch_size):
    """The share of every batched input (arrays whose first axis is the batch); anything else as it is."""
    return {k: v[share] if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == batch_size else v
            for k, v in inputs.items()}


class ClosesOnExit:
    """A context manager for a class with ``close()``: ``with obj: ...`` closes it at the end."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class DataParallel(ClosesOnExit):
    """Train ``model`` on ``processes`` processes (this one and processes - 1 forked workers); see the module
    docstring. Use as a context manager, or call ``close()``: the workers are stopped and the parameters
    moved back to private memory."""

    def __init__(self, model, processes, seed=0):
        processes = int(processes)
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        if processes > 1:
            reason = unavailable_reason(model)
            if reason:
                raise ValueError(reason)
        self.model = model
        self.processes = processes
        self.params = [p for _, p in model.named_parameters()]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"data-parallel training needs parameters of one dtype, got {sorted(map(str, dtypes))}")
        self.dtype = dtypes.pop()
        self._offsets = np.cumsum([0] + [p.size for p in self.params])
        self._workers, self._conns, self._grad_views = [], [], []
        self._views = None
        if processes == 1:
            return
        self._views = self._shared_block()
        self._check_shared()                    # every parameter's data moves into the shared block
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        try:
            for rank in range(1, processes):
                grads = self._shared_block()
                parent_end, child_end = ctx.Pipe()
                proc = ctx.Process(target=_worker_main, name=f"numformer-dp-{rank}", daemon=True,
                                   args=(rank, model, self.params, grads, child_end, parent_end, seed,
                                         os.getpid()))
                proc.start()
                child_end.close()
                self._workers.append(proc)
                self._conns.append(parent_end)
                self._grad_views.append(grads)
        except BaseException:
            self.close()
            raise

    # -- shared memory ----------------------------------------------------------------------------------------
    def _shared_block(self):
        """Views, one per parameter, into a fresh block of shared memory."""
        n = int(self._offsets[-1])
        block = np.frombuffer(mmap.mmap(-1, max(n, 1) * self.dtype.itemsize), dtype=self.dtype)[:n]
        return [block[a:b].reshape(p.shape) for p, a, b in zip(self.params, self._offsets[:-1], self._offsets[1:])]

    def _check_shared(self):
        """Parameters not (or no longer: ``p.data = ...``) in the shared block are copied into it and rebound."""
        for p, view in zip(self.params, self._views):
            if p.data is not view:
                view[...] = p.data
                p.data = view

    # -- a step -----------------------------------------------------------------------------------------------
    def forward_backward(self, inputs, targets, label_smoothing=0.0, grad_scale=1.0):
        """Forward and backward of one batch, split by examples over the processes.

        inputs: the model's keyword arguments, batched on axis 0; targets: (B, ...) ids, IGNORE left out.
        Adds grad_scale × the gradient of the batch's mean cross-entropy to the parameters' ``.grad`` and
        returns (that mean loss, the number of counted targets).
        """
        targets = np.asarray(targets)
        batch = targets.shape[0]
        counted = int(np.count_nonzero(targets != IGNORE))
        parts = min(self.processes, batch)
        if parts <= 1:
            return loss_and_backward(self.model, inputs, targets, label_smoothing, grad_scale), counted
        self._check_shared()
        shares = _shares(batch, parts)
        weights = [int(np.count_nonzero(targets[s] != IGNORE)) / max(counted, 1) for s in shares]
        dead = {}
        for rank, (conn, share, w) in enumerate(zip(self._conns, shares[1:], weights[1:]), start=1):
            try:
                conn.send((_take(inputs, share, batch), targets[share], label_smoothing, grad_scale * w,
                           self.model.training))
            except OSError:
                dead[rank] = self._died(rank)
        loss = None
        try:
            with single_threaded():
                loss = weights[0] * loss_and_backward(self.model, _take(inputs, shares[0], batch),
                                                           targets[shares[0]], label_smoothing,
                                                           grad_scale * weights[0])
        finally:            # collect every worker's answer even if this share failed, so the pipes stay in step
            results = [(None, dead[rank]) if rank in dead else self._receive(rank) for rank in range(1, parts)]
        for (share_loss, error), grads, w in zip(results, self._grad_views, weights[1:]):
            if error:
                raise DataParallelError(error)
            loss += w * share_loss
            for p, g in zip(self.params, grads):
                if not p.requires_grad:         # frozen: no gradient in any process
                    continue
                if p.grad is None:
                    p.grad = g.copy()
                else:
                    p.grad += g
        return loss, counted

    def _receive(self, rank):
        try:
            return self._conns[rank - 1].recv()
        except (EOFError, OSError):
            return None, self._died(rank)

    def _died(self, rank):
        proc = self._workers[rank - 1]
        proc.join(timeout=1)
        return (f"data-parallel worker {rank} exited unexpectedly (exit code {proc.exitcode}); was it killed for "
                f"lack of memory? Train with [train] processes = 1 to see the error")

    # -- random generators ------------------------------------------------------------------------------------
    def _ask(self, rank, message):
        """Send ``message`` to worker ``rank`` and return its answer; a worker gone (killed) raises
        DataParallelError naming it (``_died``), not the pipe's error."""
        try:
            self._conns[rank - 1].send(message)
            return self._conns[rank - 1].recv()
        except (EOFError, OSError):
            raise DataParallelError(self._died(rank)) from None

    def rng_states(self):
        """The workers' generator states (a JSON-able list, one list per worker)."""
        return [self._ask(rank, "get_rng") for rank in range(1, len(self._conns) + 1)]

    def set_rng_states(self, states):
        if len(states) != len(self._conns):
            raise ValueError(f"{len(states)} worker generator states for {len(self._conns)} workers")
        for rank, state in enumerate(states, start=1):
            ok, error = self._ask(rank, ("set_rng", state))
            if error:
                raise ValueError(error)

    # -- lifetime ---------------------------------------------------------------------------------------------
    def close(self):
        for conn in self._conns:
            try:
                conn.send(None)
                conn.close()
            except OSError:
                pass
        for proc in self._workers:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        self._workers, self._conns, self._grad_views = [], [], []
        if self._views is not None:             # back to private memory, so the shared block can be freed
            for p in self.params:
                p.data = np.array(p.data)
            self._views = None


def _die_with_parent():
    """Ask Linux to kill this worker when the main process dies (even by SIGKILL): SIGKILL, since a worker
    ignores SIGTERM (``stop_signals.ignore_in_worker``) and has nothing of its own to save."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)        # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_main(rank, model, params, grads, conn, parent_end, seed, main_pid):
    """A worker's loop: compute the shares it is sent until the main process closes the pipe."""
    parent_end.close()
    stop_signals.ignore_in_worker()                    # Ctrl-C, SIGTERM ... are the main process's to handle
    _die_with_parent()
    if os.getppid() != main_pid:                       # the main process died before prctl took effect
        os._exit(0)
    set_num_threads(1)
    single_threaded_blas()
    generators = _generators(model)
    for j, g in enumerate(generators):
        g.bit_generator.state = type(g.bit_generator)(np.random.SeedSequence(seed, spawn_key=(rank, j))).state
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        if msg == "get_rng":
            conn.send([g.bit_generator.state for g in generators])
            continue
        if msg[0] == "set_rng":
            try:
                for g, state in zip(generators, msg[1], strict=True):
                    g.bit_generator.state = state
                conn.send((True, None))
            except (ValueError, TypeError, KeyError) as e:
                conn.send((False, f"worker {rank}: cannot restore its random generators: {e}"))
            continue
        inputs, targets, label_smoothing, grad_scale, training = msg
        try:
            model.train(training)                      # dropout on or off, as in the main process
            for p in params:
                p.grad = None
            loss = loss_and_backward(model, inputs, targets, label_smoothing, grad_scale)
            for p, g in zip(params, grads):
                if p.grad is None:
                    g[...] = 0
                else:
                    g[...] = p.grad
            conn.send((loss, None))
        except Exception:
            conn.send((None, f"data-parallel worker {rank} failed:\n{traceback.format_exc()}"))
        finally:
            model.clear_cache()
    os._exit(0)
