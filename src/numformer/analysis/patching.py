"""Activation patching and its gradient approximation, attribution patching.

    metric = LogitDifference(answer, wrong)                   # logit(answer) - logit(wrong) at the last position
    grid = activation_patching(model, clean, corrupted, metric)            # (L, T): resid_pre, layer × position
    heads = activation_patching(model, clean, corrupted, metric, per="head")   # (L, H): hook_z, head by head
    approx = attribution_patching(model, clean, corrupted, metric)          # the same grid from one backward
    grid.normalized()                                          # 0: the corrupted run, 1: the clean run

Activation patching (causal tracing, Meng et al. 2022; TransformerLens's ``patching``) runs the corrupted
prompt with one activation taken from the clean run and measures how much of the clean behaviour it brings
back: a large effect says the information that differs between the prompts flows through that place.
Attribution patching (Nanda 2023) replaces each of those runs by a first-order Taylor term,
metric(corrupted with a patched) ≈ metric(corrupted) + (a_clean - a_corrupted) · ∂metric/∂a (on the corrupted
run), every place at once from one forward and one backward pass: exact for a metric linear in the activation,
an approximation otherwise, to be checked against real patching where it matters.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._common import (as_inputs, check_position, check_token_ids, check_unpadded, eval_mode, input_names,
                      mask_kwargs, metric_value, new_figure, save_figure, set_token_ticks)
from .lens import plot_layer_head

PER = {"position": "resid_pre", "head": "z"}      # what a place is: (layer, position) or (layer, head)


class LogitDifference:
    """metric(logits) = mean over the batch of logit[answer] - logit[wrong] at ``position`` (a float); ``grad``
    is its gradient with respect to the logits (what attribution patching passes to ``model.backward``).
    ``answer`` and ``wrong``: a token id each, or one per batch row. With ``wrong=None``, the answer's
    log-probability."""

    def __init__(self, answer, wrong=None, position=-1):
        self.answer, self.wrong, self.position = answer, wrong, position

    def _rows(self, tokens, batch, vocab=None, what="answer"):
        if vocab is not None:
            check_token_ids(tokens, vocab, f"LogitDifference's {what}")
        tokens = np.asarray(tokens)
        if tokens.ndim > 1 or (tokens.ndim == 1 and len(tokens) not in (1, batch)):
            raise ValueError(f"LogitDifference's {what} must be one token id or one per batch row ({batch}), "
                             f"got shape {tokens.shape}")
        return np.broadcast_to(tokens, (batch,))

    def __call__(self, logits):
        z = np.asarray(logits, dtype=np.float64)
        check_position(self.position, z.shape[1], "LogitDifference's position")
        z = z[:, self.position]                                                 # (B, V)
        rows = np.arange(len(z))
        value = z[rows, self._rows(self.answer, len(z), z.shape[-1])]
        if self.wrong is not None:
            return float(np.mean(value - z[rows, self._rows(self.wrong, len(z), z.shape[-1], "wrong")]))
        top = z.max(axis=-1)
        return float(np.mean(value - top - np.log(np.exp(z - top[:, None]).sum(axis=-1))))

    def grad(self, logits):
        """d metric / d logits, the shape (B, T, V) and dtype of ``logits``."""
        z = np.asarray(logits, dtype=np.float64)
        check_position(self.position, z.shape[1], "LogitDifference's position")
        g = np.zeros_like(z)
        B, V = len(z), z.shape[-1]
        rows = np.arange(B)
        g[rows, self.position, self._rows(self.answer, B, V)] += 1.0 / B
        if self.wrong is not None:
            g[rows, self.position, self._rows(self.wrong, B, V, "wrong")] -= 1.0 / B
        else:
            last = z[:, self.position]
            p = np.exp(last - last.max(axis=-1, keepdims=True))
            g[:, self.position] -= p / p.sum(axis=-1, keepdims=True) / B
        return g.astype(np.asarray(logits).dtype)


@dataclass
class PatchingResult:
    """``values`` (L, T) per layer × position or (L, H) per layer × head: the metric with that place patched
    (activation patching) or its first-order estimate (attribution patching); ``clean`` and ``corrupted``:
    the metric of the two unpatched runs; ``per``: "position" or "head"; ``hook``: the activations patched."""
    values: np.ndarray
    clean: float
    corrupted: float
    per: str
    hook: str

    def normalized(self):
        """(values - corrupted) / (clean - corrupted): 0 for no effect, 1 for the whole clean behaviour back."""
        span = self.clean - self.corrupted
        if span == 0:
            raise ValueError("the clean and corrupted prompts give the same metric: nothing to patch back")
        return (self.values - self.corrupted) / span

    def plot(self, tokens=None, path=None, title=None, dpi=100):
        """Heatmap of ``normalized()``: layer × head, or layer × position with ``tokens`` (labels) on x."""
        v = self.normalized()
        what = f"{'activation' if self.hook != 'attribution' else 'attribution'} patching"
        if self.per == "head":
            return plot_layer_head(v, "fraction of the clean metric", path, title or f"{what}: each head's output",
                                   dpi, diverging=True)
        L, T = v.shape
        fig = new_figure(max(4.0, 0.35 * T + 2.0), max(2.2, 0.45 * L + 1.3))
        ax = fig.subplots()
        lim = max(float(np.nanmax(np.abs(v))), 1e-12)
        im = ax.imshow(v, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        ax.set_yticks(range(L))
        ax.set_ylabel("layer (its residual stream before it)", fontsize=8)
        set_token_ticks(ax, tokens if tokens is not None else [str(t) for t in range(T)], "x",
                        fig.get_figwidth() - 2.0)
        ax.set_xlabel("position patched", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01, label="fraction of the clean metric")
        ax.set_title(title or f"{what}: the residual stream at each layer and position", fontsize=9)
        return save_figure(fig, path, dpi)


def _hook_name(per, layer):
    return f"blocks.{layer}.hook_{PER[per]}" if per == "position" else f"blocks.{layer}.attn.hook_{PER[per]}"


def _prepared(model, clean, corrupted, per, metric, what):
    """(clean ids, corrupted ids, the padding mask both share as forward keyword arguments: {} or one entry)."""
    if per not in PER:
        raise ValueError(f"per must be one of {sorted(PER)}, got {per!r}")
    name = input_names(model)[0]
    clean, corrupted = as_inputs(model, clean), as_inputs(model, corrupted)
    extra, other = mask_kwargs(model, clean, what), mask_kwargs(model, corrupted, what)
    if clean[name].shape != corrupted[name].shape:
        raise ValueError(f"the clean and corrupted prompts must have the same shape (one token each position), "
                         f"got {clean[name].shape} and {corrupted[name].shape}")
    if extra.keys() != other.keys() or any(not np.array_equal(extra[k], other[k]) for k in extra):
        raise ValueError("the clean and corrupted prompts must have the same padding mask (or none): patching "
                         "moves the activation at each position to the same position of the other run")
    check_unpadded(extra, getattr(metric, "position", None), f"{what}'s metric")
    return clean[name], corrupted[name], extra


def _clean_cache(model, clean, per, extra):
    names = [_hook_name(per, layer) for layer in range(len(model.blocks))]
    return model.run_with_cache(clean, names_filter=names, **extra)


def activation_patching(model, clean, corrupted, metric, per="position"):
    """The ``PatchingResult`` of running ``corrupted`` with one place from the ``clean`` run: per="position"
    patches the residual stream ``blocks.{l}.hook_resid_pre`` at one position (L, T); per="head" patches one
    head's output ``blocks.{l}.attn.hook_z`` at every position (L, H). ``metric(logits) -> float``. One
    forward pass per place (L·T or L·H of them). Prompts with padding: dicts {"idx": ids, "attention_mask":
    mask}, the same mask in both (a padding position patched changes nothing)."""
    clean, corrupted, extra = _prepared(model, clean, corrupted, per, metric, "activation patching")
    with eval_mode(model):
        clean_logits, cache = _clean_cache(model, clean, per, extra)
        corrupted_metric = metric_value(metric, model(corrupted, **extra), of="logits")
        L = len(model.blocks)
        width = clean.shape[1] if per == "position" else cache[_hook_name(per, 0)].shape[2]
        values = np.empty((L, width))
        for layer in range(L):
            name = _hook_name(per, layer)
            source = cache[name]
            for i in range(width):
                def patch(act, hook, i=i):
                    if per == "position":
                        act[:, i] = source[:, i]
                    else:
                        act[:, :, i] = source[:, :, i]
                    return act
                logits = model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)], **extra)
                values[layer, i] = metric_value(metric, logits, of="logits")
        model.clear_cache()
    return PatchingResult(values, metric_value(metric, clean_logits, of="logits"), corrupted_metric, per, PER[per])


def attribution_patching(model, clean, corrupted, metric, per="position"):
    """The first-order estimate of ``activation_patching``'s result (same places, same shape): the metric of
    the corrupted run plus (a_clean - a_corrupted) · ∂metric/∂a, the gradient taken on the corrupted run
    through backward hooks. ``metric`` must have ``grad(logits)`` (as ``LogitDifference``). Uses the model's
    backward pass: the parameters' gradients are zeroed at the end. Padding: as ``activation_patching``."""
    if not callable(getattr(metric, "grad", None)):
        raise ValueError("attribution patching needs the metric's gradient: give a metric with grad(logits) "
                         "(as numformer.analysis.LogitDifference)")
    clean, corrupted, extra = _prepared(model, clean, corrupted, per, metric, "attribution patching")
    L = len(model.blocks)
    names = [_hook_name(per, layer) for layer in range(L)]
    with eval_mode(model):
        clean_logits, clean_cache = _clean_cache(model, clean, per, extra)
        grads = {}
        model.zero_grad()
        with model.hooks(bwd_hooks=[(n, lambda g, hook: grads.__setitem__(hook.name, g)) for n in names]):
            corrupted_logits, corrupted_cache = model.run_with_cache(corrupted, names_filter=names, **extra)
            model.backward(metric.grad(corrupted_logits))
        model.zero_grad()
        model.clear_cache()
    base = metric_value(metric, corrupted_logits, of="logits")
    axes = (0, 2) if per == "position" else (0, 1, 3)       # (B, T, d): sum d, per position; (B, T, H, d): per head
    values = np.stack([np.sum((clean_cache[n].astype(np.float64) - corrupted_cache[n]) * grads[n], axis=axes)
                       for n in names])
    return PatchingResult(base + values, metric_value(metric, clean_logits, of="logits"), base, per, "attribution")


__all__ = ["LogitDifference", "PatchingResult", "activation_patching", "attribution_patching"]
