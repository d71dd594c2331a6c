"""Data parallelism across machines with MPI: ``mpiexec -n N numformer train CONFIG.toml --out RUN_DIR``.

    world = init_world()                              # None outside mpiexec / srun
    with MPIDataParallel(model, world, processes=1, seed=1337) as dp:
        part, n_targets = dp.forward_backward(batch.inputs, batch.targets)   # this rank's share
        loss, (stop,) = dp.combine(part, [stop_requested])                  # the step's one Allreduce
        clip_grad_norm(...); optimizer.step()                                # on every rank, the same update

The same interface as the forked workers of ``train/parallel.py`` (split a
global batch, combine the gradients so that the update equals the one-process
update, one writer of the run folder), one level up:

* Every rank builds the same model from the same seed and draws the same global
  batches from the same data generator; rank r computes the forward and
  backward pass of its contiguous share of each batch (within the rank, the
  forked workers of ``DataParallel`` may split that share again across the
  machine's cores).
* Share r's mean cross-entropy over its n_r counted targets is scaled by
  n_r / N (N = the batch's counted targets), as the forked workers do, so the
  sum over ranks is the gradient of the whole batch's mean loss.
* ``combine`` packs every gradient, the loss and a few stop flags into one
  flat buffer and sums it over the ranks with one in-place ``Allreduce``.
  Every rank then holds the same gradient and applies the same optimizer step,
  so the parameters stay identical without being sent anywhere (each rank's
  BLAS and numformer threads give the same bits on the same machine type).
  The flags (Ctrl-C, the time limit) make every rank stop at the same step.
* Dropout: rank 0 keeps the trainer's generators; rank r > 0 reseeds the
  model's generators from (seed, r), and its forked workers from (seed, r, i),
  so every share draws its own masks. Every rank's ``rng_states()`` is
  gathered on rank 0 for the checkpoint (``train.workers.Workers.state``),
  which rank 0 alone writes.

Requirements: ``mpi4py`` with an MPI library (``pip install -e ".[mpi]"`` in the checkout
installs the ``mpich`` wheel, whose ``mpiexec`` lands in the environment's
``bin``; a system MPI works too). ``init_world`` refuses to run N independent
copies when a launcher started N processes but mpi4py is missing or belongs to
another MPI library.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import time

import numpy as np

from .._install import install_hint
from .. import _platform
from ..config import config_changes
from ..data.base import IGNORE
from .parallel import ClosesOnExit, DataParallel, _generators, _shares, _take

# Environment variables by which launchers tell a process how many ranks they started.
# (srun --mpi=pmix sets PMIX_RANK and no size: there SLURM_STEP_NUM_TASKS, which a batch script alone lacks.)
SIZE_VARIABLES = ("PMI_SIZE",                 # MPICH's Hydra, Intel MPI, srun --mpi=pmi2
                  "OMPI_COMM_WORLD_SIZE",     # Open MPI
                  "MV2_COMM_WORLD_SIZE")      # MVAPICH
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
STOP_SIGNALS = _platform.signals("SIGTERM", "SIGHUP", "SIGUSR1")     # those of them this platform has


def launcher_size(environ=None):
    """(number of ranks the launcher started, the variable that says so); (1, None) outside a launcher."""
    environ = os.environ if environ is None else environ
    names = SIZE_VARIABLES + (("SLURM_STEP_NUM_TASKS",) if "PMIX_RANK" in environ else ())
    for name in names:
        try:
            n = int(environ.get(name, ""))
        except ValueError:
            continue
        if n > 1:
            return n, name
    return 1, None


def launcher_rank(environ=None):
    """This process's rank as the launcher's environment says (0 where it says nothing)."""
    environ = os.environ if environ is None else environ
    for name in RANK_VARIABLES:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return 0


class World:
    """This process's place among the ranks: ``comm`` (mpi4py's COMM_WORLD), ``rank``, ``size``, ``local_size``
    (ranks on this machine) and ``host``."""

    def __init__(self, comm):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.host = socket.gethostname()
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_size = local.Get_size()
        local.Free()
        self.pids = comm.allgather((os.getpid(), self.host))

    @property
    def is_writer(self):
        """Rank 0 alone writes the run folder and prints."""
        return self.rank == 0

    def cores_per_rank(self):
        """This machine's usable cores divided among its ranks (at least 1)."""
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        return max(1, cores // self.local_size)

    def describe(self):
        """One line: how many ranks on how many machines, and which process each rank is (mpiexec reports a
        killed rank by its pid)."""
        hosts = sorted({h for _, h in self.pids})
        ranks = ", ".join(f"{r}: pid {pid}" + (f" on {h}" if len(hosts) > 1 else "")
                          for r, (pid, h) in enumerate(self.pids[:16]))
        more = f", ... ({self.size - 16} more)" if self.size > 16 else ""
        return (f"MPI: {self.size} ranks on {len(hosts)} machine{'s' * (len(hosts) > 1)} "
                f"({', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''}); ranks {ranks}{more}")

    def launched_from_terminal(self, levels=4):
        """Whether the launcher (mpiexec, a few parents up: its proxy pipes our output) writes to a terminal.

        Linux: follows the parents' /proc/PID/fd/2; False elsewhere or when not readable."""
        pid = os.getppid()
        for _ in range(levels):
            try:
                if os.readlink(f"/proc/{pid}/fd/2").startswith(("/dev/pts/", "/dev/tty")):
                    return True
                with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                return False
            if pid <= 1:
                return False
        return False

    def label(self):
        return f"rank {self.rank} of {self.size} (pid {os.getpid()} on {self.host})"

    def abort(self, message, code=1):
        """Print ``message`` (one line naming this rank) and stop every rank of the job now.

        The line is one write (the ranks share the launcher's stderr). The launcher reads a rank's stderr
        through a pipe, and ``MPI_Abort`` makes it kill every process, that reader included: a line still in
        the pipe would be lost. So the abort waits (a few seconds at most) until the launcher has read it."""
        sys.stderr.write(message.rstrip() + "\n")
        sys.stderr.flush()
        wait_until_read(sys.stderr)
        self.comm.Abort(code)

    def agree_on_errors(self, error):
        """Collective: every rank's error (a string or None) after a phase that may fail on some ranks only
        (building the trainer); the first error and the ranks that had it, or None when all succeeded."""
        errors = self.comm.allgather(error)
        failed = [r for r, e in enumerate(errors) if e is not None]
        if not failed:
            return None
        ranks = f"rank {failed[0]}" if len(failed) == 1 else f"ranks {', '.join(map(str, failed))}"
        return f"{errors[failed[0]]} (on {ranks} of {self.size})"

    def disagreement(self, config, data_files):
        """Collective: None when every rank was started on rank 0's run (``run_disagreement``), else one line
        naming the first rank that was not and what differs. ``config``: this rank's resolved config;
        ``data_files``: the data_files.json document of the data it read (or None)."""
        return run_disagreement(self.comm.allgather((config, data_files)))

    def stop_on_signals(self, command):
        """A rank told to stop by a signal (SIGTERM, SIGHUP, SIGUSR1) says so in one line and stops all ranks;
        the job's exit code is 128 + the signal's number (143 for SIGTERM), as for a run alone."""
        rank_pid = os.getpid()

        def handler(signum, frame):
            if os.getpid() != rank_pid:        # a forked worker inherited this handler: it just ends
                os._exit(128 + signum)
            self.abort(f"{command}: {self.label()} stopped by {signal.Signals(signum).name}; "
                       f"stopping every rank (the last checkpoint is kept)", code=128 + signum)
        for s in STOP_SIGNALS:
            signal.signal(s, handler)


# What ranks may hold differently: the [data] keys that name a file or a folder (each machine may keep its copy
# of the data elsewhere; the files' contents are compared instead), [model] init_from (a path too) and [train]
# processes (a machine's own number of worker processes).
PER_MACHINE_KEYS = {"model": ("init_from",), "train": ("processes",)}
PATH_KEY_WORDS = ("path", "file", "dir", "module", "template")


def _shared_part(config):
    """The config without the keys each machine may set for itself (``PER_MACHINE_KEYS``, [data] paths)."""
    out = {}
    for section, values in config.items():
        if isinstance(values, dict):
            values = {k: v for k, v in values.items() if k not in PER_MACHINE_KEYS.get(section, ())
                      and not (section == "data" and any(w in k for w in PATH_KEY_WORDS))}
        out[section] = values
    return out


def _contents(data_files):
    """What a data_files.json document says of the data, whatever their paths (None without one): the sorted
    sha256 of every file and folder, and of each sequence of files joined in order (``fingerprint.sequence_entry``:
    the same files joined in another order are other data)."""
    if data_files is None:
        return None
    return (sorted(e["sha256"] for part in ("files", "folders") for e in data_files.get(part, [])),
            [e["sha256"] for e in data_files.get("sequences", [])])


def run_disagreement(states):
    """``states``: every rank's (resolved config, data_files.json document or None), rank 0 first. None when
    each rank trains rank 0's run (the same config but for ``PER_MACHINE_KEYS`` and [data] paths, and data of
    the same contents), else one line naming the first rank that does not: ranks started with other --set
    items would train one model with several optimizers, or fail inside MPI with a message of its own."""
    config0, data0 = _shared_part(states[0][0]), _contents(states[0][1])
    for rank, (config, data_files) in enumerate(states[1:], 1):
        changes = config_changes(config0, _shared_part(config))
        if changes:
            key, ours, theirs = changes[0]
            return (f"rank {rank} was started with another config than rank 0: {key} = {theirs!r} there, {ours!r} "
                    f"on rank 0; start every rank with the same config file and --set items")
        contents = _contents(data_files)
        if data0 is not None and contents is not None and contents != data0:
            return (f"rank {rank} read other data than rank 0 (the files' contents differ); give every machine "
                    f"the same copy of the data")
    return None


def wait_until_read(stream, timeout=5.0, poll=0.002):
    """Return once the reader of ``stream``'s pipe has taken every byte written to it, or after ``timeout``
    seconds; at once when the stream is not a pipe (a terminal, a file) or the platform cannot tell."""
    try:
        fd = stream.fileno()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _platform.pipe_unread(fd):
            time.sleep(poll)
    except (OSError, ValueError, AttributeError):      # closed or replaced stream: nothing to wait for
        return


def init_world(command="numformer train"):
    """The MPI world when this process is one of several ranks, else None.

    Raises ValueError (one clear message) where a launcher started several processes but they cannot talk:
    mpi4py missing, or mpi4py's MPI library differs from the launcher's (each process would be alone)."""
    n, variable = launcher_size()
    if n == 1:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        if launcher_rank() != 0:
            raise SystemExit(2) from None     # rank 0 says why; N copies of the message would say nothing more
        raise ValueError(f"{command} was started as one of {n} processes ({variable}={n}, set by mpiexec or "
                         f"srun) but mpi4py is not installed, so the processes cannot train together and "
                         f"would each write the run folder; install it and the mpich wheel, whose mpiexec to use: "
                         f"{install_hint('mpi', 'mpi4py mpich')}; or run without mpiexec") from None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != n:
        if launcher_rank() != 0:
            raise SystemExit(2)
        raise ValueError(f"the launcher started {n} processes ({variable}={n}) but mpi4py's MPI sees "
                         f"{comm.Get_size()}: mpiexec and mpi4py come from different MPI libraries "
                         f"({MPI.Get_library_version().splitlines()[0].strip()}); launch with the mpiexec of "
                         f"the library mpi4py was built for (with the mpi extra: the one in the environment's bin)")
    return World(comm)


def rank_seed(seed, rank):
    """The seed of a rank's dropout generators and its forked workers: ``seed`` on rank 0 (a one-rank run is
    a plain run), (seed, rank) on the others."""
    return seed if rank == 0 else [int(seed), int(rank)]


class MPIDataParallel(ClosesOnExit):
    """Train ``model`` on every rank of ``world``, each rank on its share of every batch (with ``processes``
    forked workers inside the rank). See the module docstring; use as a context manager or call ``close()``."""

    def __init__(self, model, world, processes=1, seed=0):
        self.model, self.world = model, world
        self.params = [p for _, p in model.named_parameters()]
        self.local = DataParallel(model, processes, seed=rank_seed(seed, world.rank))
        self.processes = world.size * self.local.processes       # processes over all ranks
        self._offsets = np.cumsum([0] + [p.size for p in self.params])
        self._flat = np.zeros(int(self._offsets[-1]) + 8, dtype=self.local.dtype)
        if world.rank > 0:
            for j, g in enumerate(_generators(model)):
                g.bit_generator.state = type(g.bit_generator)(
                    np.random.SeedSequence(rank_seed(seed, world.rank), spawn_key=(0, j))).state
        self.broadcast_parameters()

    def _views(self):
        """(parameter, its slice of the flat buffer, shaped like it)."""
        return [(p, self._flat[a:b].reshape(p.shape)) for p, a, b in
                zip(self.params, self._offsets[:-1], self._offsets[1:])]

    def broadcast_parameters(self):
        """Copy rank 0's parameters to every rank (they start equal anyway: same seed or same checkpoint)."""
        for p, view in self._views():
            view[...] = p.data
        n = int(self._offsets[-1])
        self.world.comm.Bcast(self._flat[:n], root=0)
        for p, view in self._views():
            p.data[...] = view

    def forward_backward(self, inputs, targets, label_smoothing=0.0, grad_scale=1.0):
        """Forward and backward of this rank's share of a global batch.

        inputs: the model's keyword arguments, batched on axis 0 (the whole batch, the same on every rank);
        targets: (B, ...) ids, IGNORE left out. Adds grad_scale × (n_r / N) × the gradient of the share's mean
        cross-entropy to ``.grad``; returns (n_r / N × the share's mean loss, N). ``combine`` sums both over
        the ranks, giving the batch's mean loss and its gradient."""
        targets = np.asarray(targets)
        batch = targets.shape[0]
        counted = int(np.count_nonzero(targets != IGNORE))
        share = _shares(batch, self.world.size)[self.world.rank]
        if share.stop <= share.start:                       # fewer examples than ranks: nothing here
            return 0.0, counted
        weight = int(np.count_nonzero(targets[share] != IGNORE)) / max(counted, 1)
        loss, _ = self.local.forward_backward(_take(inputs, share, batch), targets[share], label_smoothing,
                                              grad_scale * weight)
        return weight * loss, counted

    def combine(self, loss, flags=()):
        """The step's one in-place Allreduce: sums every gradient, ``loss`` and ``flags`` over the ranks.

        Afterwards every rank's ``.grad`` is the sum of the ranks' gradients. Returns (the summed loss, one bool
        per flag: whether any rank raised it)."""
        n, k = int(self._offsets[-1]), len(flags)
        if k > len(self._flat) - n - 1:
            raise ValueError(f"at most {len(self._flat) - n - 1} flags")
        for p, view in self._views():
            if p.grad is None:
                view[...] = 0
            else:
                view[...] = p.grad
        self._flat[n] = loss
        self._flat[n + 1:n + 1 + k] = [float(bool(f)) for f in flags]
        self.world.comm.Allreduce(self.world.MPI.IN_PLACE, self._flat[:n + 1 + k], op=self.world.MPI.SUM)
        for p, view in self._views():
            if not p.requires_grad:             # frozen: no gradient on any rank
                continue
            if p.grad is None:
                p.grad = view.copy()
            else:
                p.grad[...] = view
        return float(self._flat[n]), [bool(f > 0) for f in self._flat[n + 1:n + 1 + k]]

    # -- random generators ------------------------------------------------------------------------------------
    def rng_states(self):
        """This rank's generator states: its model's and its forked workers' (no communication)."""
        return {"generators": [g.bit_generator.state for g in _generators(self.model)],
                "workers": self.local.rng_states()}

    def set_rng_states(self, state):
        """Restore what ``rng_states`` returned on this rank (worker states only when the worker count matches)."""
        for g, s in zip(_generators(self.model), state["generators"], strict=True):
            g.bit_generator.state = s
        if len(state["workers"]) == self.local.processes - 1:
            self.local.set_rng_states(state["workers"])

    def gather_rng_states(self):
        """Collective: every rank's ``rng_states()`` in rank order on rank 0 (None on the other ranks)."""
        return self.world.comm.gather(self.rng_states(), root=0)

    def set_all_rng_states(self, states):
        """Restore this rank's entry of a ``gather_rng_states`` list; a rank beyond the list (resuming on more
        ranks than the checkpoint's) keeps its fresh seeds."""
        if states and self.world.rank < len(states):
            self.set_rng_states(states[self.world.rank])

    # -- lifetime ---------------------------------------------------------------------------------------------
    def close(self):
        self.local.close()
