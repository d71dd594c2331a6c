"""Where a training step's time goes in numformer and in PyTorch, op family by op family, on the same shapes.

``numformer bench op-families [--quick]``

For each configuration of the throughput benchmark (``throughput.CONFIGS``: the same architecture, weights
and batches in both), ``op_families`` runs both frameworks' training steps on one thread (the BLAS,
numformer's pool and PyTorch's intra-op threads all at 1; ``throughput.measure_single_core``'s setting) and
splits each step's time into the same families:

* numformer: every op of ``nn.dispatch.OPS``, the attention kernels and the cross-entropy timed by
  ``profile.timed_ops`` (their Python included), the optimizer's step timed around it;
* PyTorch: ``torch.profiler``'s self CPU time of each aten op, mapped to a family by name (``torch_family``),
  and everything under the optimizer's step to "optimizer".

"other" is the rest of the step's wall time: in numformer the modules' own array arithmetic (residual sums,
reshapes, the output head's reshape) and Python; in PyTorch the autograd engine, its views and copies, and
Python. PyTorch's profiler adds its own cost to every op it records, which lands in "other": compare the
families; the steps' times without profilers are the throughput part's.

``elementwise_rates`` times single passes over a float32 array in NumPy and in PyTorch (ns per element): the
primitives every op but the matrix products is made of, whose speed differs between the libraries and from
one CPU to another.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import defaultdict

import numpy as np

from .._runtime import set_fast_runtime
from .profile import Timers, timed_ops
from .throughput import (CONFIGS, NumformerTrainer, build_models, environment, make_batches, one_thread_each,
                         torch_trainer)

REQUIRES = ("torch",)     # the reference it measures against: the runner refuses the part without it

# steps profiled per configuration (after 2 warm-up steps), and for --quick
STEPS = {"nanogpt": 20, "minillm": 2, "classifier": 20}
QUICK_STEPS = {"nanogpt": 2, "minillm": 1, "classifier": 2}

PRODUCTS = "linear (matrix products)"
FAMILY_ORDER = (PRODUCTS, "attention", "activation", "norm", "rotary positions", "embedding",
                "cross-entropy", "optimizer", "other")

# aten op (torch.profiler's event name without "aten::") -> family; any other op is "other"
TORCH_FAMILIES = {
    PRODUCTS: ("mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot"),
    "activation": ("gelu", "gelu_backward", "relu", "threshold_backward", "silu", "silu_backward"),
    "norm": ("native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward"),
    "cross-entropy": ("_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward"),
    "embedding": ("embedding", "embedding_dense_backward", "index_select"),
}
_BY_ATEN = {op: family for family, names in TORCH_FAMILIES.items() for op in names}


def torch_family(name):
    """The family of a ``torch.profiler`` event: an aten op by ``TORCH_FAMILIES``, any scaled-dot-product or
    flash-attention op "attention", the optimizer's own events (``Optimizer.step#AdamW.step``, ``_foreach_*``)
    "optimizer", anything else "other"."""
    op = name[len("aten::"):] if name.startswith("aten::") else None
    if name.startswith("Optimizer.") or (op or "").startswith("_foreach_") or (op or "").startswith("_fused_adam"):
        return "optimizer"
    if op is None:
        return "other"
    if "scaled_dot_product" in op or "flash_attention" in op:
        return "attention"
    return _BY_ATEN.get(op, "other")


def _under_optimizer(event):
    """True for an event run inside the optimizer's step (its record_function is an ancestor)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("Optimizer."):
            return True
        parent = parent.cpu_parent
    return False


def torch_families(step, batches, steps):
    """(ms per step by family, ms per profiled step) of ``step(x, y)`` (PyTorch eager) over ``steps`` steps."""
    from torch.profiler import ProfilerActivity, profile

    with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        for i in range(steps):
            step(*batches[i % len(batches)])
        total = time.perf_counter() - started
    seconds = defaultdict(float)
    for event in prof.events():
        family = "optimizer" if _under_optimizer(event) else torch_family(event.name)
        seconds[family] += event.self_cpu_time_total / 1e6
    return _per_step(seconds, total, steps)


@contextlib.contextmanager
def _native_stderr_silenced():
    """File descriptor 2 to /dev/null for the block: the profiler's native library logs every start and stop
    there (Python's own errors still reach the caller as exceptions)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w", encoding="utf-8") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def numformer_families(trainer, batches, steps):
    """(ms per step by family, ms per timed step) of ``trainer(x, y)`` (``throughput.NumformerTrainer``) over
    ``steps`` steps, its ops timed by ``profile.timed_ops`` and its optimizer's step around it."""
    timers = Timers()
    optimizer = trainer.opt
    optimizer.step = timers.wrap(optimizer.step, "optimizer")
    try:
        with timed_ops(timers):
            started = time.perf_counter()
            for i in range(steps):
                trainer(*batches[i % len(batches)])
            total = time.perf_counter() - started
    finally:
        del optimizer.step                             # the class's step again
    return _per_step(timers.seconds, total, steps)


def _per_step(seconds, total, steps):
    """{family: ms per step} with "other" = the rest of the wall time (PyTorch's ops of no family are in that
    rest), and the step's ms."""
    families = {k: 1e3 * v / steps for k, v in seconds.items() if k != "other"}
    families["other"] = max(0.0, 1e3 * total / steps - sum(families.values()))
    return families, 1e3 * total / steps


def op_families(nf_step, pt_step, batches, tbatches, steps, warmup=2):
    """The two frameworks' training steps on one thread, split by op family: ``nf_step`` (a
    ``throughput.NumformerTrainer`` in one process) over the NumPy ``batches``, ``pt_step`` (PyTorch eager) over
    the same batches as tensors. Returns {"numformer": {family: ms}, "torch": {...}, "numformer_step_ms",
    "torch_step_ms", "steps"}."""
    with one_thread_each():
        for i in range(warmup):
            nf_step(*batches[i % len(batches)])
            pt_step(*tbatches[i % len(tbatches)])
        nf, nf_ms = numformer_families(nf_step, batches, steps)
        pt, pt_ms = torch_families(pt_step, tbatches, steps)
    return {"numformer": _ordered(nf), "torch": _ordered(pt), "numformer_step_ms": nf_ms, "torch_step_ms": pt_ms,
            "steps": steps}


def _ordered(families):
    known = [f for f in FAMILY_ORDER if f in families]
    return {f: families[f] for f in known + sorted(set(families) - set(known))}


# (name, NumPy call, PyTorch call): each on a float32 input x, an int8 input x8 and a float32 output y of one
# size; the PyTorch call gets the torch module first (imported only where PyTorch is timed)
PRIMITIVES = (
    ("multiply (x · x)", lambda x, x8, y: np.multiply(x, x, out=y), lambda torch, x, x8, y: torch.mul(x, x, out=y)),
    ("exp", lambda x, x8, y: np.exp(x, out=y), lambda torch, x, x8, y: torch.exp(x, out=y)),
    ("tanh", lambda x, x8, y: np.tanh(x, out=y), lambda torch, x, x8, y: torch.tanh(x, out=y)),
    ("int8 → float32", lambda x, x8, y: np.copyto(y, x8, casting="unsafe"), lambda torch, x, x8, y: y.copy_(x8)),
)


def elementwise_rates(n=65536, repeats=200, rounds=5):
    """ns per element of each of ``PRIMITIVES`` over ``n`` float32 elements (a hidden layer's activations; they
    stay in the core's cache), NumPy and PyTorch each on one thread, best of ``rounds`` rounds of ``repeats``
    calls in CPU time: {name: {"numpy": ns, "torch": ns}}."""
    import torch

    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    x8 = rng.integers(-127, 128, n).astype(np.int8)
    y = np.empty_like(x)
    tx, tx8, ty = torch.from_numpy(x.copy()), torch.from_numpy(x8.copy()), torch.empty(n)
    rates = {}
    with one_thread_each():
        for name, with_numpy, with_torch in PRIMITIVES:
            rates[name] = {"numpy": _ns_per_element(lambda: with_numpy(x, x8, y), n, repeats, rounds),
                           "torch": _ns_per_element(lambda: with_torch(torch, tx, tx8, ty), n, repeats, rounds)}
    return rates


def _ns_per_element(call, n, repeats, rounds):
    call()
    best = float("inf")
    for _ in range(rounds):
        started = time.thread_time()
        for _ in range(repeats):
            call()
        best = min(best, (time.thread_time() - started) / repeats)
    return 1e9 * best / n


def measure(cfg, steps, seed=0):
    """Both frameworks' one-thread training steps of ``cfg`` (a ``throughput.CONFIGS`` entry) by op family."""
    import torch

    model, ref = build_models(cfg, seed)
    batches = make_batches(cfg)
    tbatches = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]
    return op_families(NumformerTrainer(model, cfg), torch_trainer(ref, cfg), batches, tbatches, steps)


def run(quick=False, configs=None, steps=None):
    """Every configuration's split and the primitives' rates (``configs``/``steps`` override the defaults, for
    tests)."""
    set_fast_runtime()
    configs = CONFIGS if configs is None else configs
    steps = (QUICK_STEPS if quick else STEPS) if steps is None else steps
    results = {name: _with_totals({"title": cfg["title"], "batch": cfg["batch"], "seq": cfg["seq"],
                                   **measure(cfg, steps[name])}) for name, cfg in configs.items()}
    return {"configs": results, "elementwise_ns_per_element": elementwise_rates(repeats=20 if quick else 200),
            "environment": environment(), "quick": bool(quick)}


def _with_totals(r):
    """A configuration's result with each framework's ms in matrix products and in the other ops (not "other")."""
    for who in ("numformer", "torch"):
        r[f"{who}_products_ms"] = r[who].get(PRODUCTS, 0.0)
        r[f"{who}_non_product_ms"] = non_product_ms(r[who])
    return r


def non_product_ms(split):
    """The ms of a split's families other than the matrix products and "other" (the ops a kernel can speed up)."""
    return sum(v for k, v in split.items() if k not in (PRODUCTS, "other"))


def cpu_row(result):
    """The figures bench.md keeps per CPU model: each configuration's ops other than the products (ms,
    numformer / PyTorch), and exp's ns per element (NumPy / PyTorch)."""
    row = {f"{name} non-product ops ms": [r["numformer_non_product_ms"], r["torch_non_product_ms"]]
           for name, r in result["configs"].items()}
    exp = result["elementwise_ns_per_element"].get("exp")
    if exp:
        row["exp ns per element"] = [exp["numpy"], exp["torch"]]
    return row


def markdown(result, fig_dir):
    cfgs = result["configs"]
    found = {f for r in cfgs.values() for who in ("numformer", "torch") for f in r[who]}
    families = [f for f in FAMILY_ORDER if f in found] + sorted(found - set(FAMILY_ORDER))
    env = result["environment"]
    lines = ["## op_families: a training step by op family, numformer and PyTorch on one thread", "",
             "The throughput part's training steps (the same architecture, weights and batches in both; forward, "
             "cross-entropy, backward and AdamW) on one thread each (the BLAS, numformer's pool and PyTorch's "
             "intra-op threads at 1), split by op family: numformer's ops timed one by one (their Python "
             "included), PyTorch's by `torch.profiler`'s self CPU time of each aten op (the optimizer's step "
             "whole). \"other\" is the rest of the step: numformer's own array arithmetic and Python, PyTorch's "
             "autograd engine, views, copies and Python, and each profiler's cost (the steps' times without "
             "profilers are the throughput part's per-core table). ms per step, numformer / PyTorch:", "",
             "| op family | " + " | ".join(f"{n} ({r['batch']} × {r['seq']}, {r['steps']} steps)"
                                          for n, r in cfgs.items()) + " |", "|---|" + "---:|" * len(cfgs)]
    for f in families:
        lines.append(f"| {f} | " + " | ".join(
            f"{r['numformer'].get(f, 0):.2f} / {r['torch'].get(f, 0):.2f}" for r in cfgs.values()) + " |")
    lines.append("| ops other than the products and \"other\" | " + " | ".join(
        f"{r['numformer_non_product_ms']:.2f} / {r['torch_non_product_ms']:.2f}" for r in cfgs.values()) + " |")
    lines.append("| **step (profiled)** | " + " | ".join(
        f"**{r['numformer_step_ms']:.1f} / {r['torch_step_ms']:.1f}**" for r in cfgs.values()) + " |")
    rates = result["elementwise_ns_per_element"]
    lines += ["", "The primitives of the ops that are not matrix products: one pass over 65,536 float32 elements "
              "(in the core's cache) on one thread, ns per element (best of 5 rounds, CPU time), NumPy / "
              "PyTorch: " + ", ".join(f"{name} {r['numpy']:.2f} / {r['torch']:.2f}" for name, r in rates.items())
              + ".", "", f"PyTorch {env['torch']}; numformer's allocator: {env['malloc']}."]
    return "\n".join(lines) + "\n"
