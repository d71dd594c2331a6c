"""Helpers shared by the analysis modules: model inputs, eval mode, headless figures, token labels."""
from __future__ import annotations

import inspect
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..models import GPT, EncoderClassifier, Transformer
from ..nn import Embedding

# -- model inputs -------------------------------------------------------------------------------------


def input_names(model):
    """The token-id arguments of ``model.forward``: ('idx',) GPT, ('ids',) EncoderClassifier, ('src', 'tgt')
    Transformer; for another model, the first positional argument of its forward."""
    if isinstance(model, Transformer):
        return ("src", "tgt")
    if isinstance(model, EncoderClassifier):
        return ("ids",)
    if isinstance(model, GPT):
        return ("idx",)
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not params:
        raise TypeError(f"cannot tell the token-id argument of {type(model).__name__}.forward")
    return (params[0].name,)


def as_inputs(model, inputs):
    """Normalize ``inputs`` to {argument name: int array (B, T)} (plus any other keyword arguments given).

    Accepts a dict of forward arguments, one id sequence / array (GPT, EncoderClassifier), or a
    ``(src, tgt)`` pair (Transformer). 1-D id sequences get a batch axis.
    """
    names = input_names(model)
    if isinstance(inputs, dict):
        d = dict(inputs)
    elif len(names) > 1:
        if not isinstance(inputs, (tuple, list)) or len(inputs) != len(names):
            raise ValueError(f"{type(model).__name__} needs {len(names)} id sequences {names}; "
                             f"pass a dict {{{', '.join(repr(n) for n in names)}: ...}} or a tuple")
        d = dict(zip(names, inputs))
    else:
        d = {names[0]: inputs}
    for n in names:
        if n not in d:
            raise ValueError(f"missing input {n!r} for {type(model).__name__} (needs {names})")
        a = np.asarray(d[n])
        if a.ndim == 1:
            a = a[None]
        if a.ndim != 2 or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"input {n!r} must be integer token ids of shape (T,) or (batch, T), "
                             f"got dtype {a.dtype} and shape {a.shape}")
        d[n] = a
    return d


MASKS = ("attention_mask", "key_padding_mask")     # GPT's, the encoder classifier's


def mask_kwargs(model, inputs, what):
    """{name: mask}: the padding mask among the normalized ``inputs`` (``as_inputs``), for ``what`` to pass to
    each forward it runs; one ValueError for any other keyword argument (``kv_caches``, ``logits_to_keep``):
    ``what`` reads whole forward passes of the token ids."""
    names = input_names(model)
    extra = {k: v for k, v in inputs.items() if k not in names}
    other = sorted(k for k in extra if k not in MASKS)
    if other:
        raise ValueError(f"{what} runs the model on the token ids {names} and a padding mask only; got "
                         f"{', '.join(map(repr, other))} too")
    return {k: v for k, v in extra.items() if v is not None}


def check_unpadded(extra, position, what):
    """One ValueError when ``position`` (one index into every row) is padding in a row of the mask in
    ``extra`` (``mask_kwargs``): what it reads there is not a token's. Nothing to check without a mask."""
    mask = extra.get("attention_mask")
    padded = None if mask is None else ~np.asarray(mask).astype(bool)
    if "key_padding_mask" in extra:
        padded = np.asarray(extra["key_padding_mask"]).astype(bool)
    if padded is None or padded.ndim != 2 or not isinstance(position, (int, np.integer)) or \
            not -padded.shape[1] <= position < padded.shape[1]:
        return
    rows = np.flatnonzero(padded[:, position])
    if rows.size:
        raise ValueError(f"{what} reads position {position}, which is padding in batch row(s) {rows.tolist()}; "
                         f"pad on the left (position -1 is then every row's last token) or choose a position "
                         f"with a real token in every row")


def embedding_modules(model):
    """{input name: the Embedding module that looks its ids up}."""
    if isinstance(model, Transformer):
        return {"src": model.src_emb, "tgt": model.tgt_emb}
    if isinstance(model, (GPT, EncoderClassifier)):
        return {input_names(model)[0]: model.tok_emb}
    embs = [m for m in model.modules() if isinstance(m, Embedding)]
    if len(embs) != 1:
        raise TypeError(f"cannot tell which Embedding of {type(model).__name__} reads which input")
    return {input_names(model)[0]: embs[0]}


def pad_ids(model):
    """{input name: the model's padding id or None}."""
    if isinstance(model, Transformer):
        return {"src": model.src_pad_id, "tgt": model.tgt_pad_id}
    return {n: getattr(model, "pad_id", None) for n in input_names(model)}


def max_lengths(model):
    """{input name: the longest sequence the model's positional encoding covers, or None}."""
    if isinstance(model, Transformer):
        return {"src": model.src_pos.max_len, "tgt": model.tgt_pos.max_len}
    pos = getattr(model, "pos_emb", None)
    return {n: getattr(pos, "max_len", None) for n in input_names(model)}


@contextmanager
def eval_mode(model):
    """Switch every module to eval mode (no dropout) and restore each module's own flag afterwards."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, flag in flags:
            object.__setattr__(m, "training", flag)


def check_token_ids(tokens, size, what):
    """``tokens`` as an integer array of ids in [0, size); one ValueError naming ``what`` otherwise."""
    t = np.asarray(tokens)
    if t.dtype.kind not in "iu" or (t.size and (int(t.min()) < 0 or int(t.max()) >= size)):
        raise ValueError(f"{what} {tokens!r} must be token ids in [0, {size}), the model's vocabulary; "
                         f"give ids the model's tokenizer produces")
    return t


def check_position(position, length, what="position"):
    """One ValueError unless ``position`` indexes a sequence of ``length`` (negative counts from the end)."""
    if not isinstance(position, (int, np.integer)) or not -length <= position < length:
        raise ValueError(f"{what} {position!r} is outside the input's {length} positions; give an index in "
                         f"[{-length}, {length}) (-1: the last)")


@contextmanager
def override_method(obj, name, function):
    """Temporarily replace ``obj.name`` by ``function`` (an instance attribute), then restore it."""
    had = name in obj.__dict__
    old = obj.__dict__.get(name)
    object.__setattr__(obj, name, function)
    try:
        yield
    finally:
        if had:
            object.__setattr__(obj, name, old)
        else:
            object.__delattr__(obj, name)


# -- figures ----------------------------------------------------------------------------------------------


def new_figure(width, height):
    """A matplotlib Figure on the Agg canvas: no pyplot, no display, no global backend switch.

    In a notebook with the inline backend, a returned Figure shows itself.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib (~0.5 s) only when drawing: the
    from matplotlib.figure import Figure                         # CLI lists the experiments, which import analysis

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path, dpi=100, description=None):
    """Write ``fig`` as PNG to ``path`` (folders created) when path is given; return the figure.

    ``description``: text stored in the PNG's Description field (what the figure shows, e.g. a model diagram
    as text), so that a committed figure can be checked against what it should show without comparing pixels.
    """
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Gg]lyph.*missing.*")
            warnings.filterwarnings("ignore", message=".*constrained_layout not applied.*")
            fig.savefig(path, dpi=dpi, format="png",
                        metadata=None if description is None else {"Description": description})
    return fig


def token_label(token, max_chars=10):
    """A token shown on an axis: visible whitespace (␣, \\n, \\t), no mathtext, at most ``max_chars``."""
    s = str(token)
    s = s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r").replace(" ", "␣")
    if s == "":
        s = "∅"
    if len(s) > max_chars:
        s = s[:max_chars - 1] + "…"
    return s.replace("$", r"\$")


def label_ticks(n, length_inches, fontsize=None, min_fontsize=5.0, max_fontsize=9.0):
    """(tick positions, font size) for ``n`` labels along an axis ``length_inches`` long.

    Every label is shown when they fit at ``min_fontsize``; otherwise every k-th (thinned).
    """
    if fontsize is None:
        fontsize = float(np.clip(length_inches * 72.0 / max(n, 1) / 1.25, min_fontsize, max_fontsize))
    # the labels that fit; the small margin keeps a size chosen to fit n labels exactly from showing n - 1
    # after rounding (which would thin the axis to every second label)
    fit = max(int(length_inches * 72.0 / (fontsize * 1.25) + 1e-6), 1)
    step = int(np.ceil(n / fit)) if n > fit else 1
    return np.arange(0, n, step), fontsize


def set_token_ticks(ax, labels, axis, length_inches, rotate=True):
    """Token labels on ``axis`` ('x' or 'y') of an image axes, thinned to what fits."""
    labels = [token_label(t) for t in labels]
    ticks, fs = label_ticks(len(labels), length_inches)
    if axis == "x":
        ax.set_xticks(ticks)
        ax.set_xticklabels([labels[i] for i in ticks], fontsize=fs, rotation=90 if rotate else 0)
    else:
        ax.set_yticks(ticks)
        ax.set_yticklabels([labels[i] for i in ticks], fontsize=fs)


def default_labels(ids):
    return [str(int(i)) for i in np.asarray(ids).reshape(-1)]


def metric_value(metric, arg, of="model"):
    """metric(arg) as a float; anything but one real number (an array of several, a string, None) is a
    ValueError naming what the metric returned. ``of`` names the argument in that message ("model": head
    ablation's metrics; "logits": activation patching's)."""
    value = metric(arg)
    arr = np.asarray(value) if isinstance(value, (int, float, np.generic, np.ndarray)) else None
    if arr is None or arr.size != 1 or arr.dtype.kind not in "biuf":
        what = (f"an array of shape {arr.shape} and dtype {arr.dtype}" if arr is not None
                else f"a {type(value).__name__}")
        raise ValueError(f"the metric returned {what}; metric({of}) must return one real number "
                         "(e.g. a validation loss or an accuracy as a float)")
    return float(arr.reshape(()))
