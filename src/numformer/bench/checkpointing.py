"""Gradient checkpointing: peak memory and time of an 8-layer GPT's training step with and without it.

The model: GPT with 8 pre-LN layers, d_model 256, 8 heads, d_ff 1024, context
512, vocabulary 65, dropout 0.1, float32; one training step (forward, the
cross-entropy loss, backward) on a batch of 8 sequences of 512 tokens.

Measured in a fresh process per configuration (see ``_measure``) with
tracemalloc, which sees every array NumPy allocates:

- *activation memory*: the bytes the forward pass leaves allocated for the
  backward pass (held after the loss is computed, before backward) — the
  quantity checkpointing cuts. Without it every block keeps its caches
  (attention weights and dropout masks, (8, 8, 512, 512) each, dominate);
  with it each block keeps only its input.
- *peak*: the high-water mark over the whole step (with checkpointing it
  occurs while one block's activations are recomputed in backward);
- *time*: the better of two steps after the measured one; checkpointing
  recomputes one forward pass per block.

The parameters are allocated before tracing starts, so neither figure counts
them; the gradients, allocated during backward, count in the peak only, not in
the activation memory.
"""
from __future__ import annotations

import tracemalloc

from .. import ops
from ..models import GPT
from . import _measure
from .runner import image_link

CONFIG = {"vocab_size": 65, "block_size": 512, "n_layers": 8, "n_heads": 8, "d_model": 256, "dropout": 0.1}
BATCH = 8
QUICK_CONFIG = {"vocab_size": 65, "block_size": 128, "n_layers": 8, "n_heads": 4, "d_model": 128, "dropout": 0.1}
QUICK_BATCH = 4


def measure(config, batch, checkpointing, seed=0):
    """One configuration, in a child process: {'seconds', 'activation_bytes', 'peak_bytes', ...}."""
    import numpy as np

    rng = np.random.default_rng(seed)
    model = GPT(**config, gradient_checkpointing=checkpointing, rng=np.random.default_rng(seed))
    T = config["block_size"]
    idx = rng.integers(0, config["vocab_size"], (batch, T))
    targets = rng.integers(0, config["vocab_size"], (batch, T))
    param_bytes = sum(p.data.nbytes for p in model.parameters())

    def forward():
        logits = model(idx)
        return ops.cross_entropy_forward(logits, targets)

    def backward(cache):
        model.backward(ops.cross_entropy_backward(cache))

    def step():
        model.zero_grad()
        loss, cache = forward()
        backward(cache)
        return float(loss)

    tracemalloc.start()                     # first: both configurations draw the same dropout masks here
    try:
        base = tracemalloc.get_traced_memory()[0]
        loss, cache = forward()
        held, forward_peak = tracemalloc.get_traced_memory()
        backward(cache)
        del cache
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    grad_norm = float(np.sqrt(sum(float(np.sum(p.grad.astype(np.float64) ** 2)) for p in model.parameters())))
    seconds = _measure.best_time(step, min_total=float("inf"), max_repeats=2, warmup=False)   # traced step warmed up
    return {"checkpointing": checkpointing, "seconds": seconds, "loss": float(loss), "grad_norm": grad_norm,
            "activation_bytes": held - base, "forward_peak_bytes": forward_peak - base, "peak_bytes": peak - base,
            "param_bytes": param_bytes, "max_rss_bytes": _measure.max_rss_bytes()}


def run(quick=False, config=None, batch=None, log=None):
    config = dict(config or (QUICK_CONFIG if quick else CONFIG))
    batch = batch or (QUICK_BATCH if quick else BATCH)
    runs = {}
    for name, flag in (("plain", False), ("checkpointing", True)):
        runs[name] = _measure.run_child("checkpointing", "measure", {"config": config, "batch": batch,
                                                                     "checkpointing": flag})
        if log:
            r = runs[name]
            log(f"  {name}: {r['seconds']:.2f} s, activations {r['activation_bytes'] / 2 ** 20:.1f} MiB, "
                f"peak {r['peak_bytes'] / 2 ** 20:.1f} MiB")
    a, b = runs["plain"], runs["checkpointing"]
    return {"config": {**config, "type": "gpt", "d_ff": 4 * config["d_model"], "norm_first": True},
            "batch": batch, "dtype": "float32", "blas_threads_env": _measure.blas_env(),
            "plain": a, "checkpointing": b,
            "activation_ratio": b["activation_bytes"] / a["activation_bytes"],
            "peak_ratio": b["peak_bytes"] / a["peak_bytes"],
            "time_ratio": b["seconds"] / a["seconds"],
            "same_loss_and_gradients": a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]}


def markdown(result, fig_dir):
    from pathlib import Path

    plt = _measure.plt()
    a, b = result["plain"], result["checkpointing"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    names = ["no checkpointing", "checkpointing"]
    for label, key, color in (("activations", "activation_bytes", "C0"), ("peak", "peak_bytes", "C1")):
        off = -0.2 if key == "activation_bytes" else 0.2
        axes[0].bar([i + off for i in range(2)], [a[key] / 2 ** 20, b[key] / 2 ** 20], width=0.4, label=label,
                    color=color)
    axes[0].set_xticks(range(2), names)
    axes[0].set(ylabel="MiB (tracemalloc)", title="memory of one training step")
    axes[0].legend()
    axes[1].bar(range(2), [a["seconds"], b["seconds"]], color="C2")
    axes[1].set_xticks(range(2), names)
    axes[1].set(ylabel="seconds", title="time of one training step")
    fig.tight_layout()
    path = Path(fig_dir) / "checkpointing.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)

    c = result["config"]

    def m(x):
        return f"{x / 2 ** 20:,.1f}"

    lines = ["## checkpointing: memory and time with and without gradient checkpointing", "",
             f"GPT with {c['n_layers']} pre-LN layers, d_model {c['d_model']}, {c['n_heads']} heads, d_ff {c['d_ff']}, "
             f"context {c['block_size']}, vocabulary {c['vocab_size']}, dropout {c['dropout']}, {result['dtype']}; "
             f"one training step (forward, cross-entropy, backward) on a batch of {result['batch']} × "
             f"{c['block_size']} tokens. Activation memory = arrays the forward pass leaves allocated for backward; "
             f"peak = high-water mark over the step (tracemalloc, each configuration in a fresh process). "
             f"Parameters: {m(a['param_bytes'])} MiB.", "",
             "| | activation MiB | peak MiB | process RSS MiB | seconds per step |", "|---|---:|---:|---:|---:|",
             f"| no checkpointing | {m(a['activation_bytes'])} | {m(a['peak_bytes'])} | {m(a['max_rss_bytes'])} | "
             f"{a['seconds']:.2f} |",
             f"| checkpointing | {m(b['activation_bytes'])} | {m(b['peak_bytes'])} | {m(b['max_rss_bytes'])} | "
             f"{b['seconds']:.2f} |", "",
             f"Checkpointing keeps {100 * result['activation_ratio']:.0f}% of the activation memory "
             f"({1 / result['activation_ratio']:.1f}x less) and {100 * result['peak_ratio']:.0f}% of the peak; "
             f"a step takes {result['time_ratio']:.2f}x the time (it recomputes one forward pass per block). Loss and "
             f"gradients are {'identical' if result['same_loss_and_gradients'] else 'NOT identical'} "
             f"(same seed, dropout on: the recomputation replays the generators' states).", "",
             image_link(path, "memory and time with and without gradient checkpointing", fig_dir)]
    return "\n".join(lines)
