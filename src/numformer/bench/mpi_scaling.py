"""A scaling model of MPI training over many machines, from figures measured on this one.

``numformer bench mpi_scaling [--quick]`` (also ``mpi-scaling``)

Measured here, for nanoGPT's CPU configuration (``configs/shakespeare_char.toml``)
and the MiniLLM configuration (``configs/shakespeare_char_full.toml``):

* t_step: the time of one training step of the config's global batch on this
  machine (``numformer train``'s step, forked workers on every core), and
  t_opt, the part of it that every rank repeats whatever the split (gradient
  clipping and the AdamW update);
* t_local: one in-place Allreduce of the model's float32 gradients between two
  ranks on this machine (``mpiexec -n 2``, shared memory): the memory traffic
  and additions that every rank of a ring does on top of the network transfer.

Predicted, for N machines of this kind, one rank each, joined by a link of B
bytes/s (1 and 10 Gb/s), with P = 4 × parameters bytes of gradients, by a ring
Allreduce (each rank sends and receives 2(N-1)/N × P bytes in 2(N-1) messages;
numformer does not overlap it with the backward pass):

    t_comm(N) = 2(N-1)/N × (P / B + t_local) + 2(N-1) × latency         (0 for N = 1)
    same batch per machine (global batch N× the config's):  T = t_step + t_comm,  efficiency = t_step / T
    the config's global batch split N ways:  T = (t_step - t_opt) × ceil(b / N) / b + t_opt + t_comm,
                                             efficiency = t_step / (N × T)

The latency is not measured here (one machine): it is taken as 50 µs per
message, typical of TCP over Ethernet (``LATENCY_S``).
"""
from __future__ import annotations

import json
import math
import os
import time

from .._runtime import set_fast_runtime
from ..optim import clip_grad_norm
from .mpi import ForkedTrainer, MPIJob, cores, find_config, require_mpi

REQUIRES = ("mpi4py",)     # the runner refuses the part without it before any part runs (mpiexec: require_mpi)

LINKS_GBIT = (1, 10)
MACHINES = (1, 2, 4, 8, 16, 32, 64)
LATENCY_S = 50e-6
CONFIGS = {"nanogpt": "shakespeare_char", "minillm": "shakespeare_char_full"}
# (warm-up steps, timed steps) per configuration; quick runs MiniLLM on a batch of 8
PLAN = {"nanogpt": (3, 10), "minillm": (1, 2)}
QUICK_PLAN = {"nanogpt": (1, 2), "minillm": (1, 1)}


def measure_step(config, warmup, steps, processes):
    """(t_step, t_opt, parameters): a training step of this machine and its clip + optimizer part, in seconds,
    and the model's parameter count."""
    with ForkedTrainer(config, processes) as forked:
        forked.steps(warmup)
        t_step = forked.steps(steps) / steps
        tr = forked.trainer
        tr.workers.loss_and_backward(tr.task.train_batch(config["train"]["batch_size"], tr.data_rng), 0.0, 1.0)
        t0 = time.perf_counter()
        for _ in range(3):
            clip_grad_norm(tr.optimizer.params, config["train"].get("grad_clip", 1.0))
            tr.optimizer.step()
        t_opt = (time.perf_counter() - t0) / 3
        params = tr.model.num_parameters()
    return t_step, t_opt, params


def predict(t_step, t_opt, batch, grad_bytes, t_local, link_gbit, machines=MACHINES, latency=LATENCY_S):
    """Rows of the scaling model (see the module docstring) for one configuration and one link."""
    rows = []
    for n in machines:
        f = 2 * (n - 1) / n
        comm = f * (grad_bytes / (link_gbit * 1e9 / 8) + t_local) + 2 * (n - 1) * latency
        weak = t_step + comm
        strong = (t_step - t_opt) * math.ceil(batch / n) / batch + t_opt + comm
        rows.append({"machines": n, "comm_s": comm, "weak_step_s": weak, "weak_efficiency": t_step / weak,
                     "strong_step_s": strong, "strong_speedup": t_step / strong,
                     "strong_efficiency": t_step / (n * strong)})
    return rows


def run(quick=False):
    require_mpi("mpi-scaling")
    set_fast_runtime()
    plan = QUICK_PLAN if quick else PLAN
    out = {"links_gbit": list(LINKS_GBIT), "latency_s": LATENCY_S, "cores": cores(), "configs": {},
           "load_average_before": os.getloadavg()}
    measured = {}
    for name, file in CONFIGS.items():
        config, path = find_config(file)
        if quick and name == "minillm":
            config["train"]["batch_size"] = 8
        t_step, t_opt, params = measure_step(config, *plan[name], processes=max(1, cores()))
        measured[name] = (config, path, t_step, t_opt, params)
    small = find_config(CONFIGS["nanogpt"])[0]
    with MPIJob(small, 2) as job:                      # Allreduce of each model's gradient size, 2 ranks here
        local = {name: job.ask(f"allreduce {4 * m[4]} {20 if name == 'nanogpt' else 5}")
                 for name, m in measured.items()}
    for name, (config, path, t_step, t_opt, params) in measured.items():
        batch = config["train"]["batch_size"]
        grad_bytes = 4 * params
        out["configs"][name] = {
            "config": path, "parameters": params, "gradient_bytes": grad_bytes, "batch": batch,
            "block_size": config["data"]["block_size"], "t_step_s": t_step, "t_opt_s": t_opt,
            "t_local_allreduce_s": local[name], "local_allreduce_gb_per_s": grad_bytes / local[name] / 1e9,
            "predictions": {str(g): predict(t_step, t_opt, batch, grad_bytes, local[name], g) for g in LINKS_GBIT}}
    out["load_average_after"] = os.getloadavg()
    out["quick"] = bool(quick)
    json.dumps(out)
    return out


def markdown(result, fig_dir):
    lines = ["## MPI across machines: a scaling model from this machine's figures", "",
             "Measured here (" + f"{result['cores']} cores" + "): t_step, a training step of the config's global "
             "batch (forked workers on every core); t_opt, its clip + AdamW part, which every rank repeats; "
             "t_local, an in-place Allreduce of the float32 gradients between 2 ranks on this machine. Predicted "
             "for N such machines, one rank each, by a ring Allreduce (not overlapped with the backward pass): "
             "t_comm = 2(N−1)/N × (P / link + t_local) + 2(N−1) × latency, P the gradient bytes, latency "
             f"{1e6 * result['latency_s']:.0f} µs per message (assumed, typical of TCP over Ethernet). "
             "*Same batch per machine*: the global batch grows N×, step = t_step + t_comm. *Split batch*: the "
             "config's global batch b split N ways, step = (t_step − t_opt) × ⌈b/N⌉/b + t_opt + t_comm (beyond "
             "N = b machines idle). Efficiency = t_step ÷ (step time) and t_step ÷ (N × step time)."]
    if "load_average_before" in result:
        load = max(result["load_average_before"][0], result["load_average_after"][0])
        lines[-1] += (f" Load average of this machine while measuring: up to {load:.1f} on {result['cores']} cores"
                      + ("; other work inflated the measured times, so re-run on a quiet machine for predictions "
                         "that hold there" if load > 0.5 * result["cores"] else "") + ".")
    lines.append("")
    for name, c in result["configs"].items():
        lines += [f"### {name} (`{c['config'].rsplit('/', 1)[-1]}`): {c['parameters'] / 1e6:.2f}M parameters "
                  f"({c['gradient_bytes'] / 1e6:.1f} MB of gradients), batch {c['batch']} × {c['block_size']}", "",
                  f"t_step {1e3 * c['t_step_s']:,.1f} ms, t_opt {1e3 * c['t_opt_s']:,.1f} ms, t_local "
                  f"{1e3 * c['t_local_allreduce_s']:,.2f} ms ({c['local_allreduce_gb_per_s']:.2f} GB/s).", ""]
        for link, rows in c["predictions"].items():
            lines += [f"{link} Gb/s:", "",
                      "| machines | t_comm ms | same batch per machine: step ms | efficiency "
                      "| split batch: step ms | speed-up | efficiency |",
                      "|---:|---:|---:|---:|---:|---:|---:|"]
            lines += [f"| {r['machines']} | {1e3 * r['comm_s']:,.1f} | {1e3 * r['weak_step_s']:,.1f} "
                      f"| {100 * r['weak_efficiency']:.0f}% | {1e3 * r['strong_step_s']:,.1f} "
                      f"| {r['strong_speedup']:.2f} | {100 * r['strong_efficiency']:.0f}% |" for r in rows]
            lines.append("")
    return "\n".join(lines)
