"""Gradient flow against depth: per-layer gradient norms of post-LN and pre-LN GPTs, at initialization and after
training.

The seed claims that "gradient flow remains stable up to 8 layers". Here a
character-level GPT (d_model 64, 4 heads, d_ff 256, context 64, no dropout,
float32) with 2, 4, 8 and 16 layers, post-LN (the paper's block, no final
norm) and pre-LN (GPT-2's, with a final norm), is trained for 100 steps with
AdamW (lr 1e-3 constant, no warm-up, betas (0.9, 0.99), weight decay 0.01, no
gradient clipping) on random 64-character windows of the first 200,000
characters of tiny Shakespeare, batch 16. Same seed for every model.

The gradient norm of a layer is the L2 norm of the gradients of all its
parameters (attention, feed-forward, norms) for the mean cross-entropy on one
fixed held-out batch, measured at initialization and after the 100 steps.
Layer 1 is nearest the input. ``spread`` is max/min over the layers of a
model: 1 means every layer receives gradients of the same size.
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..data.text import read_corpus
from ..models import GPT
from ..optim import AdamW
from . import _measure
from .runner import image_link

DEPTHS = [2, 4, 8, 16]
MODEL = {"block_size": 64, "n_heads": 4, "d_model": 64, "dropout": 0.0}
TRAIN = {"steps": 100, "batch": 16, "lr": 1e-3, "betas": (0.9, 0.99), "weight_decay": 0.01, "chars": 200_000}
QUICK_TRAIN = {"steps": 15, "batch": 8, "lr": 1e-3, "betas": (0.9, 0.99), "weight_decay": 0.01, "chars": 50_000}
QUICK_MODEL = {"block_size": 32, "n_heads": 4, "d_model": 32, "dropout": 0.0}


def corpus(chars):
    """The first ``chars`` characters of tiny Shakespeare (built into numformer.data); a seeded random text of
    65 symbols when it is not available, so the benchmark still runs."""
    text = None
    try:
        text = read_corpus("")
    except (OSError, ValueError):              # an installation without its package data
        pass
    if text:
        text = text[:chars]
        vocab = sorted(set(text))
        lookup = {c: i for i, c in enumerate(vocab)}
        return np.array([lookup[c] for c in text], dtype=np.int64), len(vocab), "tiny Shakespeare"
    rng = np.random.default_rng(0)
    return rng.integers(0, 65, chars), 65, "synthetic (tiny Shakespeare not found)"


def _batch(data, T, B, rng):
    starts = rng.integers(0, len(data) - T - 1, B)
    x = np.stack([data[s:s + T] for s in starts])
    y = np.stack([data[s + 1:s + T + 1] for s in starts])
    return x, y


def layer_grad_norms(model, x, y):
    """(loss, [L2 norm of each block's parameter gradients]) for the mean cross-entropy on (x, y)."""
    model.zero_grad()
    loss, cache = ops.cross_entropy_forward(model(x), y)
    model.backward(ops.cross_entropy_backward(cache))
    norms = [float(np.sqrt(sum(float(np.sum(p.grad.astype(np.float64) ** 2)) for p in block.parameters()
                                if p.grad is not None))) for block in model.blocks]
    model.zero_grad()
    return float(loss), norms


def train_one(n_layers, norm_first, data, vocab, model_cfg, train_cfg, seed=0):
    model = GPT(vocab, n_layers=n_layers, norm_first=norm_first, **model_cfg, rng=np.random.default_rng(seed))
    T, B = model_cfg["block_size"], train_cfg["batch"]
    held_out = _batch(data, T, B, np.random.default_rng(12345))
    loss0, init_norms = layer_grad_norms(model, *held_out)
    opt = AdamW(model.parameters(), lr=train_cfg["lr"], betas=tuple(train_cfg["betas"]),
                weight_decay=train_cfg["weight_decay"])
    rng = np.random.default_rng(seed + 1)
    losses = []
    for _ in range(train_cfg["steps"]):
        x, y = _batch(data, T, B, rng)
        opt.zero_grad()
        loss, cache = ops.cross_entropy_forward(model(x), y)
        model.backward(ops.cross_entropy_backward(cache))
        opt.step()
        losses.append(float(loss))
    loss1, trained_norms = layer_grad_norms(model, *held_out)
    return {"layers": n_layers, "norm": "pre-LN" if norm_first else "post-LN",
            "grad_norms_init": init_norms, "grad_norms_trained": trained_norms,
            "spread_init": max(init_norms) / max(min(init_norms), 1e-30),
            "spread_trained": max(trained_norms) / max(min(trained_norms), 1e-30),
            "first_over_last_init": init_norms[0] / max(init_norms[-1], 1e-30),
            "first_over_last_trained": trained_norms[0] / max(trained_norms[-1], 1e-30),
            "held_out_loss_init": loss0, "held_out_loss_trained": loss1,
            "train_loss_first": losses[0], "train_loss_last10": float(np.mean(losses[-10:])),
            "finite": bool(np.isfinite(loss1) and all(np.isfinite(trained_norms)))}


def run(quick=False, depths=None, model_cfg=None, train_cfg=None, log=None):
    depths = list(depths or DEPTHS)
    model_cfg = dict(model_cfg or (QUICK_MODEL if quick else MODEL))
    train_cfg = dict(train_cfg or (QUICK_TRAIN if quick else TRAIN))
    data, vocab, source = corpus(train_cfg["chars"])
    runs = []
    for n in depths:
        for norm_first in (False, True):
            r = train_one(n, norm_first, data, vocab, model_cfg, train_cfg)
            runs.append(r)
            if log:
                log(f"  {r['norm']:7s} {n:2d} layers: spread {r['spread_init']:.1f} -> {r['spread_trained']:.1f}, "
                    f"loss {r['held_out_loss_init']:.2f} -> {r['held_out_loss_trained']:.2f}")
    return {"model": {**model_cfg, "type": "gpt", "d_ff": 4 * model_cfg["d_model"], "vocab_size": vocab},
            "train": {**train_cfg, "optimizer": "AdamW", "data": source}, "depths": depths, "runs": runs}


def markdown(result, fig_dir):
    from pathlib import Path

    plt = _measure.plt()
    depths = result["depths"]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharey=True)
    for col, norm in enumerate(("post-LN", "pre-LN")):
        for row, (key, when) in enumerate((("grad_norms_init", "at initialization"),
                                           ("grad_norms_trained", f"after {result['train']['steps']} steps"))):
            ax = axes[row][col]
            for r in result["runs"]:
                if r["norm"] == norm:
                    ax.semilogy(range(1, r["layers"] + 1), r[key], "o-", ms=3, label=f"{r['layers']} layers")
            ax.set(title=f"{norm}, {when}", xlabel="layer (1 = nearest the input)")
            ax.grid(True, which="both", alpha=0.3)
            if col == 0:
                ax.set_ylabel("gradient norm of the layer")
            ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(fig_dir) / "depth_grad_norms.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    m, t = result["model"], result["train"]
    lines = ["## depth: gradient norms per layer, post-LN against pre-LN", "",
             f"Character-level GPT (d_model {m['d_model']}, {m['n_heads']} heads, d_ff {m['d_ff']}, context "
             f"{m['block_size']}, vocabulary {m['vocab_size']}, no dropout) with {', '.join(map(str, depths))} layers, "
             f"trained {t['steps']} steps with {t['optimizer']} (lr {t['lr']}, constant, no warm-up, no clipping, "
             f"batch {t['batch']}) on {t['data']} (first {t['chars']:,} characters). Gradient norm of a layer = L2 "
             "norm of all its parameter gradients on one fixed held-out batch. Spread = largest / smallest layer "
             "norm in the model; first/last = layer nearest the input over the layer nearest the output.", "",
             "| norm | layers | spread at init | first/last at init | spread after | first/last after | "
             "held-out loss init → after |", "|---|---:|---:|---:|---:|---:|---|"]
    for norm in ("post-LN", "pre-LN"):
        for r in result["runs"]:
            if r["norm"] == norm:
                lines.append(f"| {norm} | {r['layers']} | {r['spread_init']:.2f} | {r['first_over_last_init']:.2f} | "
                             f"{r['spread_trained']:.2f} | {r['first_over_last_trained']:.2f} | "
                             f"{r['held_out_loss_init']:.3f} → {r['held_out_loss_trained']:.3f} |")
    lines.append("")
    deepest = max(depths)
    by = {(r["norm"], r["layers"]): r for r in result["runs"]}
    post, pre = by.get(("post-LN", deepest)), by.get(("pre-LN", deepest))
    if post and pre:
        decades = {k: float(np.log10(max(r["spread_trained"], 1.0))) for k, r in (("post", post), ("pre", pre))}
        lines.append(f"After {t['steps']} steps the layer gradients of the {deepest}-layer post-LN model span "
                     f"{decades['post']:.1f} decades (largest / smallest {post['spread_trained']:.3g}), those of the "
                     f"pre-LN model {decades['pre']:.1f} (held-out loss {post['held_out_loss_trained']:.2f} against "
                     f"{pre['held_out_loss_trained']:.2f}).")
        for norm in ("post-LN", "pre-LN"):
            losses = ", ".join(f"{by[(norm, n)]['held_out_loss_trained']:.2f}" for n in depths if (norm, n) in by)
            lines.append(f"Held-out loss after training, {norm}, {', '.join(map(str, depths))} layers: {losses}.")
    if post and post["first_over_last_init"] > 5:
        lines.append("At initialization the first post-LN layer gets a larger gradient than the others: its input, "
                     "the token + position embeddings (std 0.02, as GPT-2), is small, and LayerNorm's backward "
                     "divides by the standard deviation of its input; later layers see normalized inputs.")
    lines += ["", image_link(path, f"per-layer gradient norms, post-LN and pre-LN, {depths[0]} to {depths[-1]} layers",
                                fig_dir)]
    return "\n".join(lines)
