"""Where a training step's time goes, op family by op family, and the CPU's float32 matrix-product peak.

``profile_training_step`` runs training steps of a config's model as one data-parallel worker runs them (its
share of the batch, numformer's kernels and the BLAS on one thread) with every op of ``nn.dispatch.OPS``, the
attention kernels, the cross-entropy and the optimizer timed; "other" is the rest of the step (the modules'
own array arithmetic: residual sums, reshapes, SwiGLU's gating product, the output head's reshape ...).

``matmul_peak`` is the yardstick of model FLOPs utilization: the best rate of a large float32 matrix product
(2·n³ operations) on one thread, and on every core with the BLAS's own threads.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import numpy as np

from .. import ops
from .._runtime import blas_threads, single_threaded
from ..config import resolve_config
from ..models import build_model
from ..models.flops import training_flops_per_token
from ..nn.dispatch import ATTENTION, OPS
from ..optim import clip_grad_norm
from ..train.step import loss_and_backward
from ..train.trainer import make_optimizer

# op name prefix in OPS -> family
FAMILIES = {"linear": "linear (matrix products)", "embedding": "embedding", "layer_norm": "norm",
            "rms_norm": "norm", "batch_norm": "norm", "relu": "activation", "gelu": "activation",
            "silu": "activation", "dropout": "dropout", "rope": "rotary positions", "repeat_kv": "repeat k/v",
            "softcap": "soft-capping"}


def _family(op_name):
    return next(f for prefix, f in FAMILIES.items() if op_name.startswith(prefix))


def matmul_peak(n=2048, threads=1, min_seconds=1.0):
    """The best rate (operations/s) of an (n, n) @ (n, n) float32 product on ``threads`` BLAS threads."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    out = np.empty((n, n), np.float32)
    best, spent = float("inf"), 0.0
    with blas_threads(threads):
        np.matmul(a, b, out=out)                     # warm up: the BLAS's buffers and threads
        while spent < min_seconds or best == float("inf"):
            started = time.perf_counter()
            np.matmul(a, b, out=out)
            took = time.perf_counter() - started
            best, spent = min(best, took), spent + took
    return 2 * n ** 3 / best


class Timers:
    """Seconds spent in each family, by wrapping functions."""

    def __init__(self):
        self.seconds = defaultdict(float)

    def wrap(self, fn, family):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[family] += time.perf_counter() - started
        return timed


@contextlib.contextmanager
def timed_ops(timers):
    """Every op of OPS (its speed path), the attention kernels and the cross-entropy timed by family."""
    saved_ops, saved_kernels = dict(OPS), dict(ATTENTION)
    saved_ce = ops.cross_entropy_forward, ops.cross_entropy_backward
    try:
        for name, (reference, kernel) in saved_ops.items():
            if name.startswith("scaled_dot_product_attention"):     # inside ATTENTION["reference"], timed below
                continue
            OPS[name] = (reference, timers.wrap(kernel, _family(name)))
        for name, kernel in saved_kernels.items():
            ATTENTION[name] = kernel._replace(forward=timers.wrap(kernel.forward, "attention"),
                                              backward=timers.wrap(kernel.backward, "attention"))
        ops.cross_entropy_forward = timers.wrap(saved_ce[0], "cross-entropy")
        ops.cross_entropy_backward = timers.wrap(saved_ce[1], "cross-entropy")
        yield
    finally:
        OPS.clear()
        OPS.update(saved_ops)
        ATTENTION.clear()
        ATTENTION.update(saved_kernels)
        ops.cross_entropy_forward, ops.cross_entropy_backward = saved_ce


def profile_training_step(config, processes=2, steps=20, warmup=3, seed=0, rounds=1):
    """Seconds per training step by op family, for one of ``processes`` data-parallel workers of ``config``
    (a raw config dict): its share of the batch, on one thread. After ``warmup`` steps, ``rounds`` rounds of
    ``steps`` steps each are timed, and the round of median step time is the one reported (another process
    briefly sharing the core slows one round, not the median). Returns a dict with that round's families
    (seconds per step, largest first), the step's seconds, tokens and operations, the rate it achieves, and
    every round's step seconds (``round_step_seconds``)."""
    config, task = resolve_config(config)
    t = config["train"]
    model_cfg = {k: v for k, v in config["model"].items() if k != "init_from"}
    dtype = np.dtype(t["dtype"])
    model = build_model(model_cfg, rng=np.random.default_rng(seed), dtype=dtype)
    optimizer = make_optimizer(model, t)
    share = max(1, t["batch_size"] // processes)
    rng = np.random.default_rng(seed)
    batches = [task.train_batch(share, rng) for _ in range(warmup + steps)]
    timers = Timers()
    timed_rounds = []

    def step(batch):
        loss_and_backward(model, batch.inputs, batch.targets, t["label_smoothing"])
        started = time.perf_counter()
        clip_grad_norm(optimizer.params, t["grad_clip"])
        optimizer.step()
        optimizer.zero_grad()
        timers.seconds["optimizer and clipping"] += time.perf_counter() - started

    with single_threaded(), timed_ops(timers):
        for batch in batches[:warmup]:
            step(batch)
        for _ in range(max(1, rounds)):
            timers.seconds.clear()
            started = time.perf_counter()
            for batch in batches[warmup:]:
                step(batch)
            timed_rounds.append(((time.perf_counter() - started) / steps,
                                 {k: v / steps for k, v in timers.seconds.items()}))
    total, families = sorted(timed_rounds, key=lambda r: r[0])[(len(timed_rounds) - 1) // 2]
    families["other"] = max(0.0, total - sum(families.values()))
    tokens = batches[0].n_tokens
    context = config["data"]["block_size"]
    flops = training_flops_per_token(model, context) * tokens
    return {"families": dict(sorted(families.items(), key=lambda kv: -kv[1])), "step_seconds": total,
            "tokens_per_step": tokens, "flops_per_step": flops, "flops_per_s": flops / total,
            "tokens_per_s": tokens / total, "batch_share": share, "processes": processes,
            "parameters": model.num_parameters(), "round_step_seconds": [r[0] for r in timed_rounds]}
