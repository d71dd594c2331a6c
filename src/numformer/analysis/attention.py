"""Attention maps: the weights softmax(QKᵀ/√d_k + M) of every layer and head, and their heatmaps.

    maps = attention_maps(gpt, ids)             # ids (T,) or (B, T)
    maps["self"]                                # (n_layers, B, n_heads, T, T)
    maps.plot("self", tokens=labels)            # a layer × head grid of heatmaps

Groups of attention layers: ``"self"`` for GPT and EncoderClassifier; for the
encoder-decoder Transformer ``"encoder"`` (source self-attention),
``"decoder"`` (causal target self-attention) and ``"cross"`` (target queries
over source keys).
"""
from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack

import numpy as np

from ..nn import MultiHeadAttention, build_attention_mask
from ._common import (as_inputs, eval_mode, input_names, new_figure, override_method, save_figure,
                      set_token_ticks)

GROUP_TITLES = {
    "self": "self-attention",
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention (causal)",
    "cross": "cross-attention (target queries, source keys)",
}


def attention_modules(model):
    """{group: [(dotted name, MultiHeadAttention), ...] in layer order}.

    Groups: 'self' (GPT, EncoderClassifier), or 'encoder', 'decoder', 'cross' (Transformer).
    """
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
    seq2seq = any(n.startswith("decoder.") for n, _ in found)
    groups = {}
    for name, m in found:
        if name.endswith("cross_attn"):
            g = "cross"
        elif seq2seq and name.startswith("decoder."):
            g = "decoder"
        elif seq2seq and name.startswith("encoder."):
            g = "encoder"
        else:
            g = "self"
        groups.setdefault(g, []).append((name, m))
    order = ["self", "encoder", "decoder", "cross"]
    return {g: groups[g] for g in order if g in groups}


def group_inputs(model, group):
    """(query input name, key input name) of a group, e.g. ('tgt', 'src') for 'cross'."""
    names = input_names(model)
    return {"encoder": ("src", "src"), "decoder": ("tgt", "tgt"), "cross": ("tgt", "src")}.get(
        group, (names[0], names[0]))


class AttentionMaps(Mapping):
    """Attention weights per group, as a read-only dict: ``maps[group]`` is (n_layers, B, H, Tq, Tk).

    ``allowed[group]`` (same shape, bool) is True where the masks let a query attend a key
    (False: blocked by a causal, padding or sliding-window mask, or a mask passed in); ``inputs`` are the token ids used;
    ``query_input[group]`` / ``key_input[group]`` name the input that labels each axis;
    ``names[group]`` are the modules' dotted names.
    """

    def __init__(self, weights, allowed, inputs, query_input, key_input, names):
        self.weights, self.allowed, self.inputs = weights, allowed, inputs
        self.query_input, self.key_input, self.names = query_input, key_input, names

    def __getitem__(self, group):
        return self.weights[group]

    def __iter__(self):
        return iter(self.weights)

    def __len__(self):
        return len(self.weights)

    def __repr__(self):
        shapes = ", ".join(f"{g!r}: {w.shape}" for g, w in self.weights.items())
        return f"AttentionMaps({{{shapes}}})"

    def labels(self, group, tokens=None, batch_index=0):
        """(query labels, key labels) of a group: ``tokens`` {input name: list of str} or the ids as text."""
        out = []
        for name in (self.query_input[group], self.key_input[group]):
            if tokens is not None and name in tokens:
                out.append(list(tokens[name]))
            else:
                out.append([str(int(i)) for i in self.inputs[name][batch_index]])
        return tuple(out)

    def plot(self, group=None, tokens=None, batch_index=0, path=None, **kwargs):
        """Heatmaps of a group (default: the only or first group), labelled with ``tokens``.

        ``tokens``: {input name: labels}, or one list of labels for single-input models; other keyword
        arguments go to ``plot_attention`` (layers, heads, title, scale, cmap, dpi). Returns the Figure.
        """
        group = next(iter(self.weights)) if group is None else group
        if group not in self.weights:
            raise ValueError(f"no attention group {group!r} in these maps; they hold {list(self.weights)}")
        if tokens is not None and not isinstance(tokens, dict):
            tokens = {self.query_input[group]: tokens}
        q_labels, k_labels = self.labels(group, tokens, batch_index)
        title = kwargs.pop("title", GROUP_TITLES.get(group, group))
        return plot_attention(self.weights[group], q_labels, k_labels, batch_index=batch_index,
                              allowed=self.allowed[group], title=title, path=path, **kwargs)


def attention_maps(model, inputs, **forward_kwargs):
    """Run ``model`` once in eval mode and return the attention weights of every layer and head: an
    ``AttentionMaps``, ``maps[group]`` (n_layers, B, n_heads, Tq, Tk) in the model's dtype.

    inputs: token ids as for ``model.forward`` (an array for GPT / EncoderClassifier, a
    ``(src, tgt)`` pair or a dict for Transformer; 1-D sequences get a batch axis).
    forward_kwargs: further arguments of ``model.forward`` (e.g. masks).

    Each MultiHeadAttention's ``record_weights`` is switched on for the pass and then restored (as are
    ``last_weights`` and the train/eval flags). The mask each layer used is recorded too
    (``AttentionMaps.allowed``): the masks the layer built itself, so causal and padding masks, its
    sliding window (also per-layer windows, as in Gemma 2/3) and any mask passed in are all reflected.
    """
    inputs = as_inputs(model, inputs)
    groups = attention_modules(model)
    if not groups:
        raise ValueError(f"{type(model).__name__} has no MultiHeadAttention layers")
    modules = [m for mods in groups.values() for _, m in mods]
    saved = [(m, m.record_weights, m.last_weights) for m in modules]
    records = {}

    with ExitStack() as stack:
        stack.enter_context(eval_mode(model))
        for m in modules:
            m.record_weights = True
            stack.enter_context(override_method(m, "forward", _recorder(m, records)))
        try:
            model(**inputs, **forward_kwargs)
        finally:
            for m, flag, last in saved:
                m.record_weights, m.last_weights = flag, last
            model.clear_cache()

    weights, allowed, q_in, k_in, names = {}, {}, {}, {}, {}
    for g, mods in groups.items():
        missing = [n for n, m in mods if id(m) not in records]
        if missing:
            raise RuntimeError(f"attention layers {missing} did not run in the forward pass")
        weights[g] = np.stack([records[id(m)][0] for _, m in mods])
        allowed[g] = np.stack([records[id(m)][1] for _, m in mods])
        q_in[g], k_in[g] = group_inputs(model, g)
        names[g] = [n for n, _ in mods]
    ids = {n: inputs[n] for n in input_names(model)}
    return AttentionMaps(weights, allowed, ids, q_in, k_in, names)


def _recorder(m, records):
    """m.forward, recording into records[id(m)] (its weights, the keys its masks allowed)."""
    forward, build_masks = m.forward, m._masks
    built = []

    def masks(*args, **kwargs):
        # the Masks the layer itself built: its sliding window (per layer in Gemma 2/3) is in them
        built.append(build_masks(*args, **kwargs))
        return built[-1]

    def wrapped(query, *args, **kwargs):
        built.clear()
        with override_method(m, "_masks", masks):
            out = forward(query, *args, **kwargs)
        records[id(m)] = (np.array(m.last_weights, copy=True), _allowed(built[-1], m.last_weights))
        return out
    return wrapped


def _allowed(masks, weights):
    """(B, H, Tq, Tk) bool of the keys a layer's ``Masks`` let each query attend (no -inf score)."""
    B, H, t_q, t_k = weights.shape
    mask = build_attention_mask(t_q, t_k, np.float64, masks.attn_mask, masks.key_padding_mask,
                                masks.is_causal, B, H, masks.causal_offset)
    if mask is None:
        return np.ones((B, H, t_q, t_k), bool)
    return np.broadcast_to(mask > -np.inf, (B, H, t_q, t_k)).copy()


def _as_grid(weights, batch_index):
    w = np.asarray(weights)
    if w.ndim == 5:
        w = w[:, batch_index]
    elif w.ndim == 3:
        w = w[None]
    elif w.ndim == 2:
        w = w[None, None]
    elif w.ndim != 4:
        raise ValueError(f"attention weights must be (Tq, Tk), (H, Tq, Tk), (L, H, Tq, Tk) or "
                         f"(L, B, H, Tq, Tk); got shape {w.shape}")
    return w


def plot_attention(weights, query_tokens=None, key_tokens=None, *, batch_index=0, allowed=None, layers=None,
                   heads=None, title=None, path=None, cmap="viridis", scale="panel", dpi=100):
    """Heatmaps of attention weights, one panel per (layer, head): rows are layers, columns heads.

    weights: (L, B, H, Tq, Tk) (``batch_index`` picks the example), (L, H, Tq, Tk), (H, Tq, Tk) or (Tq, Tk).
    query_tokens / key_tokens: labels of the y (queries) and x (keys) axes; all are shown up to
    about 64 tokens at a readable size, longer inputs get every k-th label.
    allowed: same shape as weights (bool); masked-out cells are drawn grey.
    layers / heads: the indices to draw (default all); title: the figure's title; cmap: a matplotlib colour map.
    scale: 'panel' (each panel from 0 to its own maximum, with a colour bar) or 'shared' (0 to 1).
    Returns the Figure (written as PNG to ``path`` when given, at ``dpi``).
    """
    w = _as_grid(weights, batch_index)
    a = None if allowed is None else _as_grid(np.broadcast_to(allowed, np.shape(weights)), batch_index)
    L, H, Tq, Tk = w.shape
    layers = range(L) if layers is None else list(layers)
    heads = range(H) if heads is None else list(heads)
    query_tokens = [str(i) for i in range(Tq)] if query_tokens is None else list(query_tokens)
    key_tokens = [str(i) for i in range(Tk)] if key_tokens is None else list(key_tokens)
    if len(query_tokens) != Tq or len(key_tokens) != Tk:
        raise ValueError(f"{len(query_tokens)} query and {len(key_tokens)} key labels for weights of "
                         f"{Tq} queries and {Tk} keys")
    nr, nc = len(layers), len(heads)
    # Panel size grows with the sequence so that ~64 labels stay readable; the whole figure is capped.
    side = float(np.clip(0.11 * max(Tq, Tk) + 1.2, 2.4, 8.0))
    side = min(side, 36.0 / max(nc, 1), 36.0 / max(nr, 1))
    pw, ph = side * max(Tk / max(Tq, Tk), 0.35), side * max(Tq / max(Tq, Tk), 0.35)
    fig = new_figure(nc * (pw + 0.9) + 0.8, nr * (ph + 0.8) + 0.8)
    axes = fig.subplots(nr, nc, squeeze=False)
    cm = _cmap(cmap)
    for r, l in enumerate(layers):
        for c, h in enumerate(heads):
            ax = axes[r][c]
            panel = w[l, h]
            if a is not None:
                panel = np.ma.masked_array(panel, mask=~a[l, h])
            vmax = 1.0 if scale == "shared" else max(float(np.max(w[l, h])), 1e-12)
            im = ax.imshow(panel, cmap=cm, vmin=0.0, vmax=vmax, interpolation="nearest", aspect="auto")
            ax.set_title(f"layer {l} · head {h}", fontsize=9)
            set_token_ticks(ax, key_tokens, "x", pw)
            set_token_ticks(ax, query_tokens, "y", ph)
            if scale != "shared":
                fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)
    if scale == "shared":
        fig.colorbar(im, ax=axes, fraction=0.02, pad=0.01, label="attention weight")
    fig.supxlabel("key", fontsize=9)
    fig.supylabel("query", fontsize=9)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path, dpi)


def _cmap(name):
    import matplotlib

    return matplotlib.colormaps[name].with_extremes(bad="#d9d9d9")
