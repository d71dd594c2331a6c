"""Training curves from a run's ``metrics.jsonl``.

One JSON object per line. Training lines carry ``step``, ``train_loss``, ``lr``,
``grad_norm``, ``tokens_per_s``, ``elapsed_s``; evaluation lines carry ``step``, ``val_loss`` (or
``val_loss_estimate``, on a fixed sample of the split), ``val_tokens``, ``val_bpb`` for language
models, and the task's own metrics under their names (``accuracy``, ``exact_match``, ``bleu_greedy``, ...).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..train.run_folder import metrics_records
from ._common import new_figure, save_figure


def read_metrics(path):
    """The records of a metrics.jsonl file, in order.

    Blank lines are skipped; a truncated last line (a run still being written) is dropped;
    a malformed line elsewhere raises ValueError naming the file and the line.
    """
    return [record for _, record in metrics_records(path)]


def _records(records):
    return read_metrics(records) if isinstance(records, (str, Path)) else list(records)


def series(records, key):
    """(steps, values) of the records that have ``key`` (and a ``step``), as float arrays."""
    pts = [(r["step"], r[key]) for r in _records(records)
           if key in r and _number(r.get("step")) and _number(r[key])]
    if not pts:
        return np.zeros(0), np.zeros(0)
    s, v = zip(*pts)
    return np.asarray(s, dtype=float), np.asarray(v, dtype=float)


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def ema(values, beta=0.9):
    """Bias-corrected exponential moving average (as TensorBoard's smoothing)."""
    out = np.empty(len(values))
    acc = 0.0
    for i, x in enumerate(values):
        acc = beta * acc + (1 - beta) * x
        out[i] = acc / (1 - beta ** (i + 1))
    return out


def eval_metric_names(records):
    """Numeric keys of the lines without ``train_loss``, in order of appearance, other than step, val_loss,
    val_loss_estimate, val_tokens, epoch, time and elapsed (e.g. accuracy, val_bpb)."""
    names = []
    for r in _records(records):
        if "train_loss" in r:
            continue
        for k, v in r.items():
            if k not in ("step", "val_loss", "val_loss_estimate", "val_tokens", "epoch", "time", "elapsed") \
                    and isinstance(v, (int, float)) and not isinstance(v, bool) and k not in names:
                names.append(k)
    return names


def plot_loss_curves(records, path=None, smooth=0.9, logy=False, title="loss", dpi=100):
    """Training loss (raw, faint, and smoothed) and validation loss against the step.

    records: metrics records or a metrics.jsonl path; smooth: the EMA's beta of the smoothed training curve,
    drawn when there are more than 20 points (0: raw only); logy: a log-scale y axis. Returns the Figure.
    """
    records = _records(records)
    fig = new_figure(7.0, 4.2)
    ax = fig.subplots()
    s, v = series(records, "train_loss")
    if len(s):
        ax.plot(s, v, color="#1f77b4", alpha=0.3 if len(s) > 20 and smooth else 1.0, lw=1,
                label="train" if not (len(s) > 20 and smooth) else "train (raw)")
        if len(s) > 20 and smooth:
            ax.plot(s, ema(v, smooth), color="#1f77b4", lw=1.8, label=f"train (EMA {smooth})")
    s, v = series(records, "val_loss")
    if len(s):
        ax.plot(s, v, "o-", color="#d62728", ms=3.5, lw=1.4, label="validation")
    s, v = series(records, "val_loss_estimate")
    if len(s):
        ax.plot(s, v, "o--", color="#d62728", ms=3.5, lw=1.2, label="validation (fixed sample)")
    if not ax.lines:
        ax.text(0.5, 0.5, "no train_loss or val_loss in the metrics", ha="center", va="center",
                transform=ax.transAxes)
    if logy and ax.lines:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    ax.set_title(title)
    return save_figure(fig, path, dpi)


def plot_learning_rate(records, path=None, title="learning rate", dpi=100):
    """The learning rate of each logged training step."""
    fig = new_figure(7.0, 3.2)
    ax = fig.subplots()
    s, v = series(records, "lr")
    if len(s):
        ax.plot(s, v, color="#2ca02c", lw=1.5)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    else:
        ax.text(0.5, 0.5, "no lr in the metrics", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return save_figure(fig, path, dpi)


def plot_eval_metrics(records, path=None, names=None, dpi=100):
    """Each other evaluation metric (``eval_metric_names``, or ``names``) against the step, one panel each;
    None if there is none."""
    records = _records(records)
    names = eval_metric_names(records) if names is None else names
    if not names:
        return None
    fig = new_figure(max(4.0, 3.6 * len(names)), 3.2)
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for ax, k in zip(axes, names):
        s, v = series(records, k)
        ax.plot(s, v, "o-", ms=3.5, color="#9467bd")
        ax.set_xlabel("step")
        ax.set_title(k, fontsize=10)
        ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi)


def plot_runs_against_time(runs, metric="val_bpb", path=None, title="", ylabel=None, dpi=100):
    """One evaluation metric of several runs against the seconds of training steps before each evaluation.

    runs: {label: metrics records or a metrics.jsonl path}; an evaluation line gives ``metric`` (the whole
    split) or ``metric + "_estimate"`` (the fixed sample), the training line of the same step its time."""
    fig = new_figure(7.0, 4.2)
    ax = fig.subplots()
    for label, records in runs.items():
        if isinstance(records, (str, Path)) and not Path(records).is_file():     # a run that logged nothing
            continue
        records = _records(records)
        seconds = {r["step"]: r["elapsed_s"] for r in records if "elapsed_s" in r}
        pts = [(seconds[r["step"]], r.get(metric, r.get(f"{metric}_estimate"))) for r in records
               if r.get("step") in seconds and (metric in r or f"{metric}_estimate" in r)]
        if pts:
            ax.plot(*zip(*pts), "o-", ms=3, lw=1.2, label=label)
    if not ax.lines:
        ax.text(0.5, 0.5, f"no {metric} in the metrics", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("seconds of training steps")
    ax.set_ylabel(ylabel or metric)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    ax.set_title(title)
    return save_figure(fig, path, dpi)
