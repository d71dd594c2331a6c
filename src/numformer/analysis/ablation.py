"""Head ablation: how much does a metric change when one head's output is zeroed?

    result = head_ablation(model, metric)        # metric(model) -> float, e.g. validation loss
    result.delta["self"]                         # (n_layers, n_heads): metric(ablated) - metric(intact)
    plot_head_ablation(result, path="ablation.png")

A head is ablated through ``MultiHeadAttention.head_mask``: its context vector
is multiplied by 0 before the output projection W^O, so the other heads and
the biases are untouched. The masks are restored afterwards (to exactly what
they were, normally None), so the model computes bit for bit what it did before.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from .. import ops
from ..models import EncoderClassifier, GPT, Transformer
from ._common import as_inputs, eval_mode, metric_value, new_figure, save_figure
from .attention import GROUP_TITLES, attention_modules


@contextmanager
def ablate_heads(model, heads):
    """Zero the output of the given heads inside the ``with`` block.

    heads: iterable of (group, layer, head), e.g. [("self", 0, 2)]; groups as in ``attention_modules``.
    On exit every touched layer gets back its previous ``head_mask`` object.
    """
    mods = attention_modules(model)
    saved = {}
    try:
        for group, layer, head in heads:
            if group not in mods:
                raise ValueError(f"no attention group {group!r} in {type(model).__name__}; groups: {list(mods)}")
            for what, value in (("layer", layer), ("head", head)):
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                    raise ValueError(f"the {what} of ({group!r}, {layer!r}, {head!r}) must be an integer index, "
                                     f"got {value!r}")
            if not 0 <= layer < len(mods[group]):
                raise ValueError(f"layer {layer} out of range: group {group!r} has {len(mods[group])} layers")
            m = mods[group][layer][1]
            if not 0 <= head < m.n_heads:
                raise ValueError(f"head {head} out of range: the layer has {m.n_heads} heads")
            if id(m) not in saved:
                saved[id(m)] = (m, m.head_mask)
                mask = np.ones(m.n_heads) if m.head_mask is None else np.array(m.head_mask, dtype=float)
            else:
                mask = np.array(m.head_mask, dtype=float)
            mask[head] = 0.0
            m.head_mask = mask
        yield model
    finally:
        for m, old in saved.values():
            m.head_mask = old


@dataclass
class AblationResult:
    """baseline: metric of the intact model; values[group] (L, H): metric with that head zeroed;
    delta[group] = values[group] - baseline."""

    baseline: float
    values: dict = field(default_factory=dict)
    metric_name: str = "metric"

    @property
    def delta(self):
        """{group: (L, H)}: values[group] - baseline."""
        return {g: v - self.baseline for g, v in self.values.items()}

    def table(self, digits=4):
        """A markdown table: group, layer, head, metric with the head zeroed, change."""
        lines = [f"| group | layer | head | {self.metric_name} | change |", "|---|---|---|---|---|"]
        for g, v in self.values.items():
            for l in range(v.shape[0]):
                for h in range(v.shape[1]):
                    lines.append(f"| {g} | {l} | {h} | {v[l, h]:.{digits}f} | {v[l, h] - self.baseline:+.{digits}f} |")
        return "\n".join(lines)


def head_ablation(model, metric, groups=None, metric_name="metric", progress=False):
    """metric(model) with each head zeroed in turn, for every layer and head of the chosen groups.

    metric: callable(model) -> float (the caller decides: validation loss, accuracy, ...).
    groups: the attention groups to ablate (default all, as ``attention_modules`` names them); metric_name:
    the name the table and figure give the metric; progress: show a tqdm progress bar.
    The model is in eval mode throughout (no dropout), and left as it was.
    Costs 1 + (number of heads) metric calls. Returns an ``AblationResult`` (values[group] (L, H)).
    """
    mods = attention_modules(model)
    groups = list(mods) if groups is None else list(groups)
    with eval_mode(model):
        baseline = metric_value(metric, model)
        result = AblationResult(baseline, metric_name=metric_name)
        jobs = [(g, l, h) for g in groups for l, (_, m) in enumerate(mods[g]) for h in range(m.n_heads)]
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(jobs), desc="head ablation", leave=False)
        for g in groups:
            result.values[g] = np.full((len(mods[g]), mods[g][0][1].n_heads), np.nan)
        for g, l, h in jobs:
            with ablate_heads(model, [(g, l, h)]):
                result.values[g][l, h] = metric_value(metric, model)
            if bar is not None:
                bar.update()
        if bar is not None:
            bar.close()
    return result


def loss_metric(model, inputs, targets=None, **forward_kwargs):
    """A metric(model) -> float: the cross-entropy on ``inputs``, for ablations without a validation set.

    Default targets: GPT, the next token (ids[1:]); Transformer, the next target token
    (teacher forcing on tgt, logits[:, :-1] against tgt[:, 1:]); EncoderClassifier, the class the
    intact model predicts now (so the metric is -log p(that class)).
    """
    inputs = as_inputs(model, inputs)
    if targets is None:
        if isinstance(model, GPT):
            targets = inputs["idx"][:, 1:]
            cut = True
        elif isinstance(model, Transformer):
            targets = inputs["tgt"][:, 1:]
            cut = True
        elif isinstance(model, EncoderClassifier):
            with eval_mode(model):
                targets = np.argmax(model(**inputs, **forward_kwargs), axis=-1)
            model.clear_cache()
            cut = False
        else:
            raise ValueError(f"give targets for {type(model).__name__}")
    else:
        targets, cut = np.asarray(targets), False

    def metric(m):
        logits = m(**inputs, **forward_kwargs)
        m.clear_cache()
        if cut:
            logits = logits[:, :-1]
        loss, _ = ops.cross_entropy_forward(logits.astype(np.float64), targets)
        return loss

    return metric


def plot_head_ablation(result, path=None, title=None, dpi=100):
    """One layer × head heatmap per group of the change in the metric (diverging colours, 0 = white) of an
    ``AblationResult``; returns the Figure (a PNG at ``path`` when given)."""
    delta = result.delta
    groups = list(delta)
    L = max(v.shape[0] for v in delta.values())
    H = max(v.shape[1] for v in delta.values())
    lim = max([np.nanmax(np.abs(v)) for v in delta.values() if np.isfinite(v).any()] + [1e-12])
    cw, ch = max(3.0, 0.55 * H + 1.5), max(2.4, 0.45 * L + 1.2)
    fig = new_figure(max(len(groups) * cw, 6.0), ch + 0.7)
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    for ax, g in zip(axes, groups):
        v = delta[g]
        im = ax.imshow(v, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        ax.set_title(GROUP_TITLES.get(g, g), fontsize=9)
        ax.set_xticks(range(v.shape[1]))
        ax.set_yticks(range(v.shape[0]))
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.tick_params(labelsize=7)
        if v.size <= 144:
            for l in range(v.shape[0]):
                for h in range(v.shape[1]):
                    ax.text(h, l, f"{v[l, h]:+.3g}", ha="center", va="center", fontsize=7,
                            color="white" if abs(v[l, h]) > 0.6 * lim else "black")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)
    fig.suptitle(title or f"change in {result.metric_name} when one head is zeroed\n"
                          f"(intact model: {result.baseline:.4g})", fontsize=10)
    return save_figure(fig, path, dpi)
