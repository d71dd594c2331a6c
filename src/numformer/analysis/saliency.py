"""Position importance: which input tokens does a prediction depend on?

Two measures, each per input position and relative to a *target score* s
(a logit, or the log-likelihood of given targets):

* gradient × input:  saliency_t = Σ_d (∂s/∂e_td) · e_td, where e_t = E[id_t] is the token
  embedding of position t (the Embedding module's output, before the √d scale and the
  position encoding are applied; ∂s/∂e · e is the same whether the scale is counted on the
  gradient or on e). It is the first-order change of s when e_t is scaled by (1 + ε), divided
  by ε: exactly what the finite-difference test checks.
* occlusion:  s(intact) - s(with token t replaced by a neutral id) (positive: the token helped).

The gradient ∂s/∂e_t is read exactly where the model's own backward pass hands it to the
Embedding: its ``backward`` is wrapped for the duration of the call, the gradient it receives
is recorded, and the original is called, so no backward formula is duplicated here. The
parameters' ``.grad`` are put back as they were afterwards.

Targets: ``LogitTarget(token, position)`` (default: the arg-max token at the last position,
or the predicted class of a classifier), ``LossTarget(targets)`` (the log-likelihood, minus
the cross-entropy, of given targets), or any callable(logits) -> (scores (B,), dscores/dlogits).
"""
from __future__ import annotations

import numpy as np

from ..nn import BatchStatNorm
from ._common import (as_inputs, check_position, check_token_ids, embedding_modules, eval_mode, input_names, label_ticks, new_figure, override_method,
                      pad_ids, save_figure, token_label)


class LogitTarget:
    """s_b = logits[b, position, token_b] (sequence outputs) or logits[b, token_b] (classifier).

    token: an id, one id per example, or None: the arg-max of the intact model's logits (fixed
    by ``resolve`` on the unperturbed input, so occluded variants are scored on the same token).
    """

    def __init__(self, token=None, position=-1):
        self.token, self.position = token, position

    def _row(self, logits):
        return logits if logits.ndim == 2 else logits[:, self.position]

    def resolve(self, logits):
        """This target with ``token`` fixed: itself when given, else the arg-max of ``logits``."""
        if self.token is not None:
            return self
        return LogitTarget(np.argmax(self._row(logits), axis=-1), self.position)

    def select(self, b):
        """The target of example ``b`` alone (a batch of one)."""
        tok = np.asarray(self.token)
        return self if tok.ndim == 0 else LogitTarget(tok[b:b + 1], self.position)

    def __call__(self, logits):
        if logits.ndim > 2:
            check_position(self.position, logits.shape[1], "the target's position")
        row = self._row(logits)
        B = row.shape[0]
        tok = np.broadcast_to(check_token_ids(self.token, row.shape[-1], "target token"), (B,))
        scores = row[np.arange(B), tok].astype(np.float64)
        d = np.zeros_like(logits)
        if logits.ndim == 2:
            d[np.arange(B), tok] = 1
        else:
            d[np.arange(B), self.position, tok] = 1
        return scores, d

    def describe(self, decode=None):
        """Words for the report: "logit of TOKEN at position P" (``decode``: ids -> token strings)."""
        tok = np.asarray(self.token).reshape(-1)
        name = ", ".join(repr(decode([int(t)])[0]) if decode else str(int(t)) for t in tok[:4])
        where = "" if self.position is None else f" at position {self.position}"
        return f"logit of {name}{where}"


class LossTarget:
    """s_b = mean over t of log p(targets[b, t]) (minus the cross-entropy); classifier: log p(targets[b]).

    Targets equal to ``ignore_index`` are left out.
    """

    def __init__(self, targets, ignore_index=-100):
        self.targets, self.ignore_index = np.asarray(targets), ignore_index

    def resolve(self, logits):
        """Itself (the targets are given)."""
        return self

    def select(self, b):
        """The target of example ``b`` alone (a batch of one)."""
        return self if self.targets.shape[0] == 1 else LossTarget(self.targets[b:b + 1], self.ignore_index)

    def __call__(self, logits):
        z = logits.astype(np.float64)
        t = np.broadcast_to(self.targets, z.shape[:-1])
        valid = t != self.ignore_index
        ts = np.where(valid, t, 0)
        z = z - z.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        picked = np.take_along_axis(logp, ts[..., None], axis=-1)[..., 0] * valid
        if z.ndim == 2:
            n = valid.astype(np.float64)
            scores = picked
        else:
            n = valid.sum(axis=-1).astype(np.float64)
            scores = picked.sum(axis=-1) / np.maximum(n, 1)
        onehot = np.zeros_like(z)
        np.put_along_axis(onehot, ts[..., None], 1.0, axis=-1)
        d = (onehot - np.exp(logp)) * valid[..., None]
        if z.ndim == 3:
            d /= np.maximum(n, 1)[:, None, None]
        return scores, d.astype(logits.dtype)

    def describe(self, decode=None):
        return "log-likelihood of the targets"


def next_token_target(idx, ignore_index=-100):
    """LossTarget for a language model: position t is scored on the token at t + 1."""
    idx = np.asarray(idx)
    idx = idx[None] if idx.ndim == 1 else idx
    t = np.full(idx.shape, ignore_index)
    t[:, :-1] = idx[:, 1:]
    return LossTarget(t, ignore_index)


def _resolve(target, logits):
    if target is None:
        target = LogitTarget()
    elif isinstance(target, (int, np.integer)):
        target = LogitTarget(int(target))
    elif isinstance(target, tuple) and len(target) == 2:
        target = LogitTarget(target[1], target[0])
    return target.resolve(logits) if hasattr(target, "resolve") else target


def gradient_x_input(model, inputs, target=None, return_target=False, **forward_kwargs):
    """Gradient-times-input saliency of every input position.

    inputs: token ids as for ``model.forward`` (1-D sequences get a batch axis).
    target: None (arg-max logit at the last position / predicted class), a token id, a
    ``(position, token)`` pair, a ``LogitTarget``/``LossTarget``, or a callable(logits) ->
    (scores (B,), dscores/dlogits). Each example's score is differentiated on its own (the
    gradient of the sum over the batch), exact for every model whose examples do not interact.
    Returns {input name: (B, T) array} (and the resolved target when ``return_target``).
    """
    inputs = as_inputs(model, inputs)
    embs = embedding_modules(model)
    grads = {}
    saved = [(p, p.grad) for p in model.parameters()]

    def recorder(name, emb):
        backward = emb.backward

        def wrapped(dy):
            grads[name] = grads[name] + dy if name in grads else np.array(dy, dtype=np.float64, copy=True)
            return backward(dy)
        return wrapped

    from contextlib import ExitStack
    try:
        with ExitStack() as stack:
            stack.enter_context(eval_mode(model))
            for name, emb in embs.items():
                stack.enter_context(override_method(emb, "backward", recorder(name, emb)))
            for p, _ in saved:
                p.grad = None
            logits = model(**inputs, **forward_kwargs)
            target = _resolve(target, logits)
            _, dlogits = target(logits)
            model.backward(np.asarray(dlogits, dtype=logits.dtype))
    finally:
        for p, g in saved:
            p.grad = g
        model.clear_cache()
    out = {}
    for name, emb in embs.items():
        e = emb.weight.data[inputs[name]].astype(np.float64)
        out[name] = (grads[name] * e).sum(axis=-1)
    return (out, target) if return_target else out


def _score(model, inputs, target, forward_kwargs):
    logits = model(**inputs, **forward_kwargs)
    model.clear_cache()
    return np.asarray(target(logits)[0], dtype=np.float64)


def occlusion(model, inputs, target=None, replace_id=None, batch_size=64, return_target=False,
              **forward_kwargs):
    """Change in the target score when each position's token is replaced by ``replace_id``.

    value_t = s(intact) - s(token t replaced)  (positive: the token supported the target).
    replace_id: an id or {input name: id}; default the model's padding id for that input
    (an EncoderClassifier then masks the position out entirely), else 0. Pass the id of
    ``<unk>`` or another neutral token when the vocabulary has one.
    The occluded copies are scored in batches of ``batch_size`` (one at a time if the model
    uses batch statistics, which would couple them). Returns {input name: (B, T)}.
    """
    inputs = as_inputs(model, inputs)
    names = input_names(model)
    pads = pad_ids(model)
    if not isinstance(replace_id, dict):
        replace_id = {n: replace_id for n in names}
    replace_id = {n: (replace_id.get(n) if replace_id.get(n) is not None
                      else (pads.get(n) if pads.get(n) is not None else 0)) for n in names}
    if any(isinstance(m, BatchStatNorm) for m in model.modules()):
        batch_size = 1
    B = inputs[names[0]].shape[0]
    out = {n: np.zeros(inputs[n].shape) for n in names}
    resolved = []
    with eval_mode(model):
        for b in range(B):
            one = {k: (v[b:b + 1] if k in names or (isinstance(v, np.ndarray) and v.ndim and v.shape[0] == B)
                       else v) for k, v in inputs.items()}
            logits = model(**one, **forward_kwargs)
            model.clear_cache()
            tgt = _resolve(target, logits)
            tgt_b = tgt.select(0) if hasattr(tgt, "select") else tgt
            resolved.append(tgt_b)
            base = float(np.asarray(tgt_b(logits)[0])[0])
            for n in names:
                T = one[n].shape[1]
                for start in range(0, T, batch_size):
                    stop = min(start + batch_size, T)
                    k = stop - start
                    batch = {key: (np.repeat(v, k, axis=0) if isinstance(v, np.ndarray) and v.ndim
                                   and v.shape[0] == 1 else v) for key, v in one.items()}
                    batch[n] = batch[n].copy()
                    batch[n][np.arange(k), np.arange(start, stop)] = replace_id[n]
                    out[n][b, start:stop] = base - _score(model, batch, tgt_b, forward_kwargs)
    return (out, resolved) if return_target else out


def plot_position_importance(values, tokens=None, title=None, path=None, batch_index=0, dpi=100):
    """Bar charts of per-position scores with the tokens under the bars.

    values: {label: {input name: (B, T) or (T,)}} (e.g. {"gradient × input": ..., "occlusion": ...})
    or {input name: (B, T)} for one measure. tokens: {input name: list of str}.
    One row per (measure, input). Returns the Figure.
    """
    if values and all(not isinstance(v, dict) for v in values.values()):
        values = {"": values}
    rows = [(m, n, np.asarray(v)[batch_index] if np.ndim(v) == 2 else np.asarray(v))
            for m, per_input in values.items() for n, v in per_input.items()]
    T = max(len(r[2]) for r in rows)
    width = float(np.clip(0.16 * T + 2.0, 6.0, 30.0))
    fig = new_figure(width, 2.4 * len(rows) + (0.4 if title else 0))
    axes = fig.subplots(len(rows), 1, squeeze=False)[:, 0]
    for ax, (measure, name, v) in zip(axes, rows):
        x = np.arange(len(v))
        ax.bar(x, v, color=np.where(v >= 0, "#c0392b", "#2e86c1"), width=0.8)
        ax.axhline(0.0, color="black", lw=0.6)
        labels = list(tokens[name]) if tokens and name in tokens else [str(i) for i in x]
        ticks, fs = label_ticks(len(v), width - 1.0, max_fontsize=8.0)
        ax.set_xticks(ticks)
        ax.set_xticklabels([token_label(labels[i]) for i in ticks], rotation=90, fontsize=fs)
        ax.set_xlim(-0.6, len(v) - 0.4)
        ax.set_ylabel(measure, fontsize=8)
        ax.set_title(f"{measure} — {name}" if measure else name, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path, dpi)
