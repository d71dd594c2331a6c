"""Training throughput on MPI ranks against the forked workers of one process, alternating in one session.

``numformer bench mpi [--quick]``

Both train nanoGPT's CPU configuration (``configs/shakespeare_char.toml``: the
same model, global batch 12 × 64 and AdamW) with ``numformer train``'s own
training step (``Trainer._train_step``: batch, forward, loss, backward, clip,
update), from the same seed:

* forked: one process with ``[train] processes`` = the machine's cores (what
  ``numformer train`` does by default; ``train/parallel.py``);
* MPI: ``mpiexec -n <cores>`` ranks of one process each (``train/mpi.py``), kept
  running between rounds and driven step by step (``bench/_mpi_serve.py``).

After a warm-up, each round times ``steps`` steps of each, alternating which
goes first, and the figure is the median over rounds of MPI tokens/s ÷ forked
tokens/s; the CPU time per step summed over each variant's processes is
recorded beside it, and so is the machine's load average before and after: on
a machine shared with other work the ratio, measured within each round, is the
figure to read, not the absolute tokens/s.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .._install import install_hint
from .._platform import process_cpu_seconds
from .._runtime import set_fast_runtime, usable_cores
from ..config import load_config
from ..train import Trainer
from ..train.parallel import ClosesOnExit

REQUIRES = ("mpi4py",)     # the runner refuses the part without it before any part runs (mpiexec: require_mpi)

PLAN = (5, 7, 20)            # warm-up steps, rounds, steps per round
QUICK_PLAN = (1, 3, 3)


def find_config(name):
    """configs/<name>.toml of this checkout (the working directory's, else the one beside the package)."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        path = root / "configs" / f"{name}.toml"
        if path.is_file():
            return load_config(path), str(path)
    raise ValueError(f"configs/{name}.toml not found: run numformer bench from the numformer checkout")


def mpiexec():
    """The mpiexec beside this Python (the mpich wheel's), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        raise ValueError(f"no mpiexec found: {install_hint('mpi', 'mpi4py mpich')}")
    return found


def require_mpi(part):
    """Before ``part`` measures anything: ValueError (one line) unless mpi4py imports and an mpiexec is found."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise ValueError(f"numformer bench {part} needs mpi4py and the mpich wheel, whose mpiexec it uses: "
                         f"{install_hint('mpi', 'mpi4py mpich')}") from None
    mpiexec()


class MPIJob(ClosesOnExit):
    """``mpiexec -n ranks python -m numformer.bench._mpi_serve``: ask(command) -> seconds (see that module)."""

    def __init__(self, config, ranks, processes=1):
        self._dir = tempfile.TemporaryDirectory()
        path = Path(self._dir.name) / "config.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        src = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([mpiexec(), "-n", str(ranks), sys.executable, "-m",
                                      "numformer.bench._mpi_serve", str(path), str(processes)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.ready = self._answer()

    def _answer(self):
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the MPI benchmark job ended (exit code {self.proc.wait()})")
            if line.startswith("{"):
                return json.loads(line)

    def ask(self, command, key="seconds"):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        self.last = self._answer()
        return self.last[key]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._dir.cleanup()


class ForkedTrainer(ClosesOnExit):
    """numformer train's trainer in this process with ``processes`` forked workers: steps(K) -> seconds."""

    def __init__(self, config, processes):
        config = json.loads(json.dumps(config))
        config["train"]["processes"] = processes
        self._dir = tempfile.TemporaryDirectory()
        self.trainer = Trainer(config, self._dir.name, quiet=True)
        self.trainer.workers.start()

    def steps(self, k):
        t0, cpu0 = time.perf_counter(), self.cpu_seconds()
        for _ in range(k):
            self.trainer._train_step()
        self.last_cpu = self.cpu_seconds() - cpu0
        return time.perf_counter() - t0

    def cpu_seconds(self):
        """CPU seconds used so far by this process and its forked workers (Linux /proc)."""
        workers = [process_cpu_seconds(proc.pid) for proc in self.trainer.workers.dp._workers]
        if None in workers:
            raise RuntimeError("the forked workers' CPU time cannot be read (/proc/PID/stat): Linux only")
        return time.process_time() + sum(workers)

    def close(self):
        self.trainer.workers.close()
        self._dir.cleanup()


def cores():
    return usable_cores()


def run(quick=False, config_name="shakespeare_char", plan=None):
    require_mpi("mpi")
    set_fast_runtime()
    warmup, rounds, steps = plan or (QUICK_PLAN if quick else PLAN)
    config, path = find_config(config_name)
    n = max(2, cores())
    tokens = config["train"]["batch_size"] * config["data"]["block_size"] * steps
    load_before = os.getloadavg()
    tps, cpu = {"forked": [], "mpi": []}, {"forked": [], "mpi": []}
    with ForkedTrainer(config, n) as forked, MPIJob(config, n) as job:
        forked.steps(warmup)
        job.ask(f"steps {warmup}")
        variants = [("forked", forked.steps, lambda: forked.last_cpu),
                    ("mpi", lambda k: job.ask(f"steps {k}"), lambda: job.last["cpu_seconds"])]
        for r in range(rounds):
            for name, timed, cpu_used in (variants if r % 2 == 0 else variants[::-1]):
                tps[name].append(tokens / timed(steps))
                cpu[name].append(1e3 * cpu_used() / steps)
        combine = job.ask("combine 20")
    ratios = [m / f for m, f in zip(tps["mpi"], tps["forked"])]
    return {"config": path, "ranks": n, "forked_processes": n, "batch": config["train"]["batch_size"],
            "block_size": config["data"]["block_size"], "warmup": warmup, "rounds": rounds, "steps_per_round": steps,
            "forked_tokens_per_s": tps["forked"], "mpi_tokens_per_s": tps["mpi"], "ratios": ratios,
            "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
            "forked_median_tokens_per_s": statistics.median(tps["forked"]),
            "mpi_median_tokens_per_s": statistics.median(tps["mpi"]),
            "combine_ms": 1e3 * combine, "forked_cpu_ms_per_step": cpu["forked"], "mpi_cpu_ms_per_step": cpu["mpi"],
            "forked_median_cpu_ms_per_step": statistics.median(cpu["forked"]),
            "mpi_median_cpu_ms_per_step": statistics.median(cpu["mpi"]), "load_average_before": load_before, "load_average_after": os.getloadavg(),
            "cores": cores(), "quick": bool(quick)}


def markdown(result, fig_dir):
    r = result
    load = max(r["load_average_before"][0], r["load_average_after"][0])
    return "\n".join([
        "## Training on MPI ranks against forked workers (one machine)", "",
        f"nanoGPT's CPU configuration (`{Path(r['config']).name}`, global batch {r['batch']} × {r['block_size']}), "
        f"`numformer train`'s training step, on {r['cores']} cores: `mpiexec -n {r['ranks']}` ranks of one process "
        f"each (one in-place Allreduce of the gradients per step) against one process with {r['forked_processes']} "
        f"forked workers (`[train] processes`, the default), alternating in {r['rounds']} rounds of "
        f"{r['steps_per_round']} steps after {r['warmup']} warm-up step{'s' * (r['warmup'] != 1)}.", "",
        "| | tokens/s (median round) |", "|---|---:|",
        f"| forked workers ({r['forked_processes']} processes) | {r['forked_median_tokens_per_s']:,.0f} |",
        f"| MPI ({r['ranks']} ranks) | {r['mpi_median_tokens_per_s']:,.0f} |", "",
        f"MPI ÷ forked, median over rounds: **{r['median_ratio']:.2f}** (range {r['min_ratio']:.2f}–"
        f"{r['max_ratio']:.2f})." + (
            f" CPU time per step, summed over the processes (median round): forked "
            f"{r['forked_median_cpu_ms_per_step']:.1f} ms, MPI {r['mpi_median_cpu_ms_per_step']:.1f} ms (a rank "
            f"waiting in the Allreduce polls, so its wait counts as CPU time)." if "mpi_median_cpu_ms_per_step" in r
            else "") + f" One gradient combine (copy into the flat buffer, Allreduce, copy back) takes "
        f"{r['combine_ms']:.2f} ms. Load average of the machine during the run: up to {load:.1f} on "
        f"{r['cores']} cores" + (" (shared with other work: the absolute figures are noisy, the ratio is "
                                 "measured within each round; MPI ranks wait for each other by polling, forked "
                                 "workers by sleeping on a pipe, so on a machine with more runnable processes "
                                 "than cores a polling rank probably keeps more of its share of the CPU: re-run "
                                 "`numformer bench mpi` on a quiet machine for the figure that holds there)"
                                 if load > 0.5 * r["cores"] else "") + "."])
