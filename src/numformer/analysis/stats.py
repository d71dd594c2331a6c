"""Per-head statistics of attention matrices: what kind of head is this?

Each statistic takes attention weights ``a`` of shape (..., Tq, Tk) (rows are
queries i, columns keys j, each row a distribution) and averages a per-query
value over the queries, giving an array of shape (...):

==================  ===========================================  ==============================
statistic           per query i                                  a head that scores high
==================  ===========================================  ==============================
entropy             -Σ_j a_ij log a_ij   (nats)                   uniform: log(#keys)
normalized entropy  entropy / log(#allowed keys of row i)        uniform over allowed keys: 1
                    (rows with one allowed key left out)
mean distance       Σ_j a_ij |i - j|                             long-range heads
previous token      a_{i,i-1}           (rows i ≥ 1)             previous-token heads: 1
self                a_{i,i}                                      identity heads: 1
first token         a_{i,0}                                      "attention sink" heads: 1
anti-diagonal       a_{i,Tk-1-i}        (rows i ≤ Tk-1)          reversal heads: 1
==================  ===========================================  ==============================

Queries that may attend no key (an all-masked row, all-zero weights) are left
out of the averages. ``allowed`` (bool, broadcastable to ``a``, True = the
masks let query i see key j; ``AttentionMaps.allowed`` gives it) sets the
number of keys for the normalized entropy; without it every key counts.
These are pure functions of the matrix: test them on matrices built by hand.
"""
from __future__ import annotations

import numpy as np

from ._common import new_figure, save_figure
from .attention import AttentionMaps

STATISTICS = ("entropy", "normalized_entropy", "mean_distance", "previous_token", "self", "first_token",
              "anti_diagonal")

STAT_TITLES = {
    "entropy": "entropy (nats)",
    "normalized_entropy": "entropy / log(#keys)",
    "mean_distance": "mean distance |i - j|",
    "previous_token": "mass on previous token",
    "self": "mass on itself",
    "first_token": "mass on first token",
    "anti_diagonal": "mass on anti-diagonal",
}


def _weights(a):
    try:
        a = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"attention statistics read an AttentionMaps (attention_maps(model, ids)) or an "
                         f"array of weights (..., Tq, Tk); got a {type(a).__name__}") from None
    if a.ndim < 2:
        raise ValueError(f"attention weights must have shape (..., Tq, Tk), got {a.shape}")
    return a


def _valid_rows(a, allowed=None):
    """(..., Tq) bool: queries that may attend at least one key."""
    if allowed is not None:
        return np.broadcast_to(np.asarray(allowed, bool), a.shape).any(axis=-1)
    return a.sum(axis=-1) > 0


def _mean_rows(values, rows):
    """Mean of values (..., Tq) over the rows marked True; NaN where no row is."""
    rows = np.broadcast_to(rows, values.shape)
    n = rows.sum(axis=-1)
    total = np.where(rows, values, 0.0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def _diagonal_mass(a, offset, allowed=None):
    """Mean over queries i of a[i, i + offset] (offset may be negative), over the i where that key exists."""
    Tq, Tk = a.shape[-2:]
    i = np.arange(Tq)
    j = i + offset
    exists = (j >= 0) & (j < Tk)
    vals = np.zeros(a.shape[:-1])
    vals[..., exists] = a[..., i[exists], j[exists]]
    return _mean_rows(vals, _valid_rows(a, allowed) & exists)


def entropy(a, allowed=None, normalize=False):
    """Mean over queries of the attention entropy -Σ_j a_ij log a_ij, in nats.

    normalize: divide each row's entropy by log(number of allowed keys): 1 = uniform over what
    the row may see. Rows with a single allowed key (no choice to make) are left out of that mean.
    Shape (..., Tq, Tk) -> (...).
    """
    a = _weights(a)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0).sum(axis=-1)
    rows = _valid_rows(a, allowed)
    if normalize:
        n = (np.broadcast_to(np.asarray(allowed, bool), a.shape).sum(axis=-1) if allowed is not None
             else np.full(a.shape[:-1], a.shape[-1]))
        h = h / np.log(np.maximum(n, 2))
        rows = rows & (n > 1)
    return _mean_rows(h, rows)


def mean_distance(a, allowed=None):
    """Mean over queries of Σ_j a_ij |i - j| (positions of queries and keys both counted from 0)."""
    a = _weights(a)
    Tq, Tk = a.shape[-2:]
    dist = np.abs(np.arange(Tq)[:, None] - np.arange(Tk)[None, :])
    return _mean_rows((a * dist).sum(axis=-1), _valid_rows(a, allowed))


def previous_token_mass(a, allowed=None):
    """Mean over queries i ≥ 1 of a_{i,i-1}: 1 for a pure previous-token head."""
    return _diagonal_mass(_weights(a), -1, allowed)


def self_mass(a, allowed=None):
    """Mean over queries of a_{i,i}: 1 for an identity head."""
    return _diagonal_mass(_weights(a), 0, allowed)


def first_token_mass(a, allowed=None):
    """Mean over queries of a_{i,0}: 1 for a head that parks its attention on the first token."""
    a = _weights(a)
    return _mean_rows(a[..., 0], _valid_rows(a, allowed))


def anti_diagonal_mass(a, allowed=None):
    """Mean over queries i ≤ Tk-1 of a_{i,Tk-1-i}: 1 for a head that reads the sequence backwards."""
    a = _weights(a)
    Tq, Tk = a.shape[-2:]
    i = np.arange(Tq)
    j = Tk - 1 - i
    exists = j >= 0
    vals = np.zeros(a.shape[:-1])
    vals[..., exists] = a[..., i[exists], j[exists]]
    return _mean_rows(vals, _valid_rows(a, allowed) & exists)


_FUNCTIONS = {
    "entropy": lambda a, m: entropy(a, m),
    "normalized_entropy": lambda a, m: entropy(a, m, normalize=True),
    "mean_distance": mean_distance,
    "previous_token": previous_token_mass,
    "self": self_mass,
    "first_token": first_token_mass,
    "anti_diagonal": anti_diagonal_mass,
}


def head_statistics(weights, allowed=None, batch_axis=None):
    """Every statistic of STATISTICS.

    weights: an ``AttentionMaps`` -> {group: {statistic: (n_layers, n_heads)}}, averaged over the batch;
    or an array (..., Tq, Tk) -> {statistic: array (...)} (``batch_axis``, if given, is averaged out).
    """
    if isinstance(weights, AttentionMaps):
        return {g: head_statistics(weights[g], weights.allowed[g], batch_axis=1) for g in weights}
    a = _weights(weights)
    out = {}
    for name, fn in _FUNCTIONS.items():
        v = fn(a, allowed)
        if batch_axis is not None:
            v = _nanmean(v, axis=batch_axis)
        out[name] = v
    return out


def _nanmean(v, axis):
    ok = ~np.isnan(v)
    n = ok.sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, np.where(ok, v, 0.0).sum(axis=axis) / np.maximum(n, 1), np.nan)


def format_head_statistics(stats, digits=3):
    """A markdown table, one row per (group, layer, head), one column per statistic.

    stats: {statistic: (L, H)} or {group: {statistic: (L, H)}} as returned by head_statistics.
    """
    nested = stats if all(isinstance(v, dict) for v in stats.values()) else {"": stats}
    names = [s for s in STATISTICS if s in next(iter(nested.values()))]
    head = (["group"] if len(nested) > 1 or "" not in nested else []) + ["layer", "head"] + names
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for g, st in nested.items():
        L, H = np.shape(st[names[0]])
        for l in range(L):
            for h in range(H):
                cells = ([g] if head[0] == "group" else []) + [str(l), str(h)]
                cells += [f"{st[n][l, h]:.{digits}f}" for n in names]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_head_statistics(stats, title=None, path=None, statistics=None, dpi=100):
    """One layer × head heatmap per statistic, each cell annotated with its value.

    stats: {statistic: (L, H)} (one group of ``head_statistics``). Returns the Figure.
    """
    names = [s for s in (statistics or STATISTICS) if s in stats]
    L, H = np.shape(stats[names[0]])
    ncol = min(len(names), 4)
    nrow = int(np.ceil(len(names) / ncol))
    cw, ch = max(2.6, 0.45 * H + 1.2), max(2.0, 0.4 * L + 1.0)
    fig = new_figure(ncol * cw, nrow * ch + (0.4 if title else 0))
    axes = fig.subplots(nrow, ncol, squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= len(names):
            ax.set_axis_off()
            continue
        name = names[k]
        v = np.asarray(stats[name], dtype=float)
        bounded = name not in ("entropy", "mean_distance")
        vmax = 1.0 if bounded else (np.nanmax(v) if np.isfinite(v).any() else 1.0)
        im = ax.imshow(v, cmap="magma", vmin=0.0, vmax=max(vmax, 1e-12), aspect="auto")
        ax.set_title(STAT_TITLES.get(name, name), fontsize=9)
        ax.set_xticks(range(H))
        ax.set_yticks(range(L))
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.tick_params(labelsize=7)
        if L * H <= 144:
            for l in range(L):
                for h in range(H):
                    x = v[l, h]
                    color = "black" if np.isfinite(x) and x > 0.6 * vmax else "white"
                    ax.text(h, l, "–" if not np.isfinite(x) else f"{x:.2f}", ha="center", va="center",
                            fontsize=7, color=color)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path, dpi)
