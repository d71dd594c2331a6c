"""An MPI training job that the MPI benchmarks drive, step by step, from their own process.

    mpiexec -n N python -m numformer.bench._mpi_serve CONFIG.json PROCESSES

Every rank builds the trainer of CONFIG.json (``numformer train``'s trainer, with this MPI world and PROCESSES
forked workers per rank) and waits; rank 0 reads one command per line from its standard input (mpiexec
forwards it), hands it to every rank, and answers with one JSON line on its standard output:

    steps K           K training steps (as numformer train does them)   {"seconds": ..., "cpu_seconds": ...}
    combine K         K gradient combines of the model's size           {"seconds": ... per combine}
    allreduce B K     K in-place Allreduces of B float32 bytes          {"seconds": ... per Allreduce}
    quit
"""
from __future__ import annotations

import json
import sys
import tempfile
import time

import numpy as np

from .._runtime import set_fast_runtime, set_num_threads
from ..train import Trainer
from ..train.mpi import init_world


def _idle_until_all_arrive(comm):
    """Wait for every rank while sleeping: MPICH's blocking calls poll a core, which would take it from the
    forked-worker rounds that run between the MPI rounds."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.002)


def _serve(trainer, world):
    comm = world.comm
    while True:
        line = sys.stdin.readline() if world.is_writer else None
        _idle_until_all_arrive(comm)
        cmd = comm.bcast((line or "quit").split(), root=0)
        if not cmd or cmd[0] == "quit":
            return
        comm.Barrier()
        t0, cpu0, cpu = time.perf_counter(), time.process_time(), None
        if cmd[0] == "steps":
            for _ in range(int(cmd[1])):
                trainer._train_step()
            seconds = time.perf_counter() - t0
            cpu = comm.reduce(time.process_time() - cpu0, root=0)     # CPU seconds of every rank
        elif cmd[0] == "combine":
            for _ in range(int(cmd[1])):
                trainer.workers.dp.combine(0.0, [False, False])
            seconds = (time.perf_counter() - t0) / int(cmd[1])
            trainer.optimizer.zero_grad()
        elif cmd[0] == "allreduce":
            buf = np.ones(int(cmd[1]) // 4, dtype=np.float32)
            comm.Allreduce(world.MPI.IN_PLACE, buf)
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(int(cmd[2])):
                comm.Allreduce(world.MPI.IN_PLACE, buf)
            seconds = (time.perf_counter() - t0) / int(cmd[2])
        else:
            seconds = None
        comm.Barrier()
        if world.is_writer:
            print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "command": cmd}), flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    config = json.loads(open(argv[0], encoding="utf-8").read())
    config["train"]["processes"] = int(argv[1])
    set_fast_runtime()
    world = init_world("numformer bench")
    if world is None:
        raise SystemExit("run under mpiexec -n N (N > 1)")
    set_num_threads(world.cores_per_rank())
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(config, run_dir, quiet=True, world=world)
        trainer.workers.start()
        try:
            if world.is_writer:
                print(json.dumps({"ready": world.size, "processes": trainer.processes}), flush=True)
            _serve(trainer, world)
        finally:
            trainer.workers.close()


if __name__ == "__main__":
    main()
