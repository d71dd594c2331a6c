"""The processes that compute each training step with the trainer: this process alone, forked data-parallel
workers (train/parallel.py), or the ranks of an MPI job (train/mpi.py), each with its own workers.

    workers = Workers(model, processes, seed, world)
    workers.start()                                                  # at the start of a train() call
    loss = workers.loss_and_backward(batch, label_smoothing, grad_scale)
    loss = workers.combine(loss, stop_requested, time_up)            # under MPI: the step's one Allreduce
    workers.close()                                                  # at its end

The workers' random generators (their dropout masks) live on between train() calls and in the checkpoint
(``state``, ``restore``), so that a resumed run draws what an uninterrupted run would.
"""
from __future__ import annotations

from .mpi import MPIDataParallel
from .parallel import DataParallel
from .step import loss_and_backward


class Workers:
    """The data-parallel processes of a run: ``processes`` per rank (1: none forked), ``world`` the MPI world
    or None; ``seed`` seeds the workers' generators."""

    def __init__(self, model, processes, seed, world=None):
        self.model, self.processes, self.seed, self.world = model, processes, seed, world
        self.dp = None                  # the DataParallel (MPIDataParallel under MPI) of a running train() call
        self.worker_rngs = None         # the data-parallel workers' generator states between train() calls
        self.rank_rngs = None           # under MPI: this rank's generator states between train() calls
        self.agreed = {"stop": False, "time_up": False}   # under MPI: what the ranks agreed at this step

    def start(self):
        """Fork the data-parallel workers (none for one process), restoring their generators on resume; under
        MPI, join the other ranks (MPIDataParallel, with this rank's workers inside)."""
        if self.world is not None:
            self.dp = MPIDataParallel(self.model, self.world, self.processes, seed=self.seed)
            if self.rank_rngs is not None:
                self.dp.set_rng_states(self.rank_rngs)
            return
        self.dp = DataParallel(self.model, self.processes, seed=self.seed)
        if self.worker_rngs is not None and len(self.worker_rngs) == self.processes - 1:
            self.dp.set_rng_states(self.worker_rngs)

    def close(self):
        """Stop the workers (keeping their generator states for a later train() call)."""
        if self.dp is None:
            return
        if self.world is not None:            # no communication here: another rank may have failed
            self.rank_rngs = self.dp.rng_states()
            self.dp.close()
            self.dp = None
            return
        try:
            self.worker_rngs = self.dp.rng_states()
        except (OSError, EOFError):          # a worker died: its states are lost with it
            self.worker_rngs = None
        finally:
            self.dp.close()
            self.dp = None

    def loss_and_backward(self, batch, label_smoothing, grad_scale):
        """Forward, cross-entropy and backward of one micro-batch: in this process (train/step.py), or split
        over the data-parallel processes, which each run the same step on their share."""
        if self.dp is not None and self.dp.processes > 1:
            loss, _ = self.dp.forward_backward(batch.inputs, batch.targets, label_smoothing, grad_scale)
            return loss
        return loss_and_backward(self.model, batch.inputs, batch.targets, label_smoothing, grad_scale)

    def combine(self, loss, stop_requested, time_up):
        """Under MPI, the step's one Allreduce: the ranks' gradients and losses are summed, and so are their stop
        requests (Ctrl-C, the time limit: ``agreed``), so that every rank stops at the same step. Else ``loss``
        as it is."""
        if self.world is None:
            return loss
        loss, (self.agreed["stop"], self.agreed["time_up"]) = self.dp.combine(loss, [stop_requested, time_up])
        return loss

    def state(self):
        """The workers' generator states for the checkpoint ({"worker_rngs", and under MPI "mpi_rngs": every
        rank's, gathered on rank 0: a collective call)."""
        if self.world is not None:
            local = self.dp.rng_states() if self.dp is not None else self.rank_rngs
            return {"worker_rngs": local["workers"] if local else None,
                    "mpi_rngs": self.world.comm.gather(local, root=0)}
        return {"worker_rngs": self.dp.rng_states() if self.dp is not None else self.worker_rngs}

    def restore(self, state):
        """The generator states of a checkpoint's trainer state; a rank beyond the checkpoint's ranks (or workers
        beyond its workers) keeps its fresh seeds."""
        self.worker_rngs = state.get("worker_rngs")
        ranks = state.get("mpi_rngs") or []
        if self.world is not None and self.world.rank < len(ranks):
            self.rank_rngs = ranks[self.world.rank]
