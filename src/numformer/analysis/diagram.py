"""The model's block diagram with tensor shapes, as text and as a figure.

    print(format_model_diagram(gpt, batch_size=8, seq_len=64))
    plot_model_diagram(gpt, batch_size=8, seq_len=64, path="model.png")

The diagram is built from the model's own modules (their sizes, norm order,
activation, pooling, tying), so the two views agree with each other and with
the code: a post-LN block reads attention → Add & Norm → feed-forward → Add & Norm,
a pre-LN block Norm → attention → Add → Norm → feed-forward → Add.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..models import GPT, EncoderClassifier, Transformer
from ..nn import LearnedPositionalEncoding, SinusoidalPositionalEncoding
from ._common import new_figure, save_figure

NORM_NAMES = {"layer": "LayerNorm", "rms": "RMSNorm", "rms_plus_one": "RMSNorm (1 + w)", "batch": "BatchStatNorm"}


@dataclass
class Stage:
    """One box: what it computes, the shape of its output, and a detail line (e.g. the attention weights)."""

    label: str
    shape: tuple
    kind: str = "op"           # io, embed, attn, norm, ff, add, head
    detail: str = ""


@dataclass
class Column:
    """A stack: stages before the repeated block, the block (× n_layers), stages after.

    residuals: (i, j) pairs of block indices: the stream entering stage i skips to the add in stage j.
    cross: index of the block stage that reads the other column's output (cross-attention), or None.
    """

    title: str
    before: list = field(default_factory=list)
    block: list = field(default_factory=list)
    n_layers: int = 0
    block_title: str = ""
    residuals: list = field(default_factory=list)
    after: list = field(default_factory=list)
    cross: int | None = None


def _norm_name(block):
    return NORM_NAMES.get(getattr(block, "norm_kind", "layer"), "Norm")


def _block_stages(block, B, T, S=None, causal=False, decoder=False):
    """Stages of one encoder/decoder block and its residual pairs, in the block's own norm order."""
    d, h = block.d_model, block.n_heads
    dh, dff = block.self_attn.d_head, block.d_ff
    kv = block.self_attn.n_kv_heads
    norm = _norm_name(block)
    act = {"relu": "ReLU", "relu2": "ReLU²", "gelu": "GELU", "gelu_tanh": "GELU (tanh)", "swiglu": "SwiGLU (SiLU gate)",
           "geglu": "GeGLU (GELU gate)"}.get(block.activation, block.activation)
    x = (B, T, d)
    in_attention = {"rope": ", RoPE on q, k", "alibi": ", ALiBi bias"}.get(block.self_attn.positional, "")
    self_label = (("masked " if causal else "") + f"multi-head self-attention, {h} heads × {dh}"
                  + (f", {kv} key/value head{'s' * (kv != 1)}" if kv != h else "") + in_attention)
    qkv = f"Q {(B, h, T, dh)}, K,V {(B, kv, T, dh)}" if kv != h else f"Q,K,V {(B, h, T, dh)}"
    attn = Stage(self_label, x, "attn", f"{qkv}; weights {(B, h, T, T)}")
    ff = Stage(f"feed-forward {d}→{dff}→{d}, {act}", x, "ff", f"hidden {(B, T, dff)}")
    subs = [attn]
    if decoder:
        subs.append(Stage(f"multi-head cross-attention, {h} heads × {dh}", x, "attn",
                          f"K,V from memory {(B, h, S, dh)}; weights {(B, h, T, S)}"))
    subs.append(ff)
    stages, residuals = [], []
    for sub in subs:
        start = len(stages)
        if _placement(block) == "sandwich":
            stages += [Stage(norm, x, "norm"), sub, Stage(norm, x, "norm"), Stage("+ residual", x, "add")]
        elif block.norm_first:
            stages += [Stage(norm, x, "norm"), sub, Stage("+ residual", x, "add")]
        else:
            stages += [sub, Stage(f"+ residual, {norm}", x, "add")]
        residuals.append((start, len(stages) - 1))
    cross = next((i for i, s in enumerate(stages) if "cross" in s.label), None)
    return stages, residuals, cross


def _placement(block):
    """"pre", "post" or "sandwich" (a norm before and after each sub-layer, Gemma's)."""
    return block.config.norm_placement


def _positional_label(pos, length="T"):
    """The positions added to the embeddings ("" when they act inside attention: RoPE, ALiBi)."""
    if isinstance(pos, LearnedPositionalEncoding):
        return f"+ learned positions P[0:{length}]"
    if isinstance(pos, SinusoidalPositionalEncoding):
        return f"+ sinusoidal positions PE[0:{length}]"
    return ""


def model_diagram(model, batch_size=1, seq_len=None, tgt_len=None):
    """(title, [Column, ...]) describing ``model`` for a batch of ``batch_size`` sequences.

    seq_len: the (source) sequence length T (default: the model's maximum, capped at 128);
    tgt_len: the target length of a Transformer (default seq_len).
    """
    builders = ((GPT, _gpt_diagram), (EncoderClassifier, _classifier_diagram), (Transformer, _transformer_diagram))
    for cls, build in builders:
        if isinstance(model, cls):
            return build(model, batch_size, seq_len, tgt_len)
    raise TypeError(f"no block diagram for {type(model).__name__}; expected GPT, EncoderClassifier or Transformer")


def _layers(n):
    """"1 layer", "4 layers"."""
    return f"{n} layer{'s' * (n != 1)}"


def _stack(title, inputs, blocks, final_norm, tail, block_name, B, T, S=None, causal=False, decoder=False):
    """The Column of one stack of ``blocks`` reading a (B, T) sequence: ``inputs`` = (ids label, embedding label,
    positional label), then the repeated block, its final norm (when ``final_norm`` is not None) and ``tail``."""
    ids, embedding, positions = inputs
    d = blocks[0].d_model
    stages, res, cross = _block_stages(blocks[0], B, T, S, causal=causal, decoder=decoder)
    after = [Stage(f"final {_norm_name(blocks[0])}", (B, T, d), "norm")] if final_norm is not None else []
    before = [Stage(ids, (B, T), "io"), Stage(embedding, (B, T, d), "embed"),
              Stage(positions + ", dropout" if positions else "dropout (positions act in attention)", (B, T, d),
                    "embed")]
    placement = {"pre": "pre-LN", "post": "post-LN", "sandwich": "sandwich-norm"}[_placement(blocks[0])]
    return Column(title, before, stages, len(blocks), f"{placement} {block_name}", res, after + tail, cross)


def _gpt_diagram(model, B, seq_len, tgt_len):
    T = seq_len or min(model.block_size, 128)
    d, V = model.d_model, model.vocab_size
    tied = " (tied to E)" if model.tie_weights else ""
    col = _stack("GPT (decoder-only)",
                 ("token ids", f"token embedding E[ids]{'·√d' if model.config.scale_embeddings else ''}, {V}×{d}",
                  _positional_label(model.pos_emb)),
                 list(model.blocks), model.norm_f, [Stage(f"linear → vocabulary{tied}", (B, T, V), "head", "logits")],
                 "block", B, T, causal=True)
    return f"GPT: B={B}, T={T}, d_model={d}, {_layers(model.n_layers)}, vocab {V}", [col]


def _classifier_diagram(model, B, seq_len, tgt_len):
    T = seq_len or min(model.max_len, 128)
    d, C = model.d_model, model.n_classes
    pool = "mean over non-padding positions" if model.pooling == "mean" else "first position"
    scale = " · √d" if model.embed_scale != 1.0 else ""
    col = _stack("EncoderClassifier",
                 ("token ids", f"token embedding E[ids]{scale}, {model.vocab_size}×{d}",
                  _positional_label(model.pos_emb)),
                 list(model.encoder.layers), model.encoder.norm,
                 [Stage(f"pool: {pool}", (B, d), "op"),
                  Stage(f"dropout, linear → {C} classes", (B, C), "head", "logits")],
                 "encoder block", B, T)
    return f"EncoderClassifier: B={B}, T={T}, d_model={d}, {_layers(len(model.encoder.layers))}", [col]


def _transformer_diagram(model, B, seq_len, tgt_len):
    S = seq_len or min(model.max_len, 128)
    T = tgt_len or S
    d = model.d_model
    scale = " · √d" if model.embed_scale != 1.0 else ""
    ecol = _stack("encoder", ("source ids", f"source embedding{scale}, {model.src_vocab_size}×{d}",
                              _positional_label(model.src_pos, "S")),
                  list(model.encoder.layers), model.encoder.norm, [Stage("memory", (B, S, d), "io")],
                  "encoder block", B, S)
    dcol = _stack("decoder", ("target ids (shifted right)", f"target embedding{scale}, {model.tgt_vocab_size}×{d}",
                              _positional_label(model.tgt_pos)),
                  list(model.decoder.layers), model.decoder.norm,
                  [Stage("linear → target vocabulary", (B, T, model.tgt_vocab_size), "head", "logits")],
                  "decoder block", B, T, S, causal=True, decoder=True)
    layers = f"{len(model.encoder.layers)}+{len(model.decoder.layers)} layers"
    return f"Transformer: B={B}, S={S}, T={T}, d_model={d}, {layers}", [ecol, dcol]


def _fmt(shape):
    return "(" + ", ".join(str(s) for s in shape) + ")"


def format_model_diagram(model, batch_size=1, seq_len=None, tgt_len=None):
    """The block diagram as text: one line per stage with its output shape, the block indented."""
    title, cols = model_diagram(model, batch_size, seq_len, tgt_len)
    width = max(len(s.label) for c in cols for s in c.before + c.block + c.after) + 6
    lines = [title]
    for c in cols:
        lines.append("")
        lines.append(f"[{c.title}]")
        for s in c.before:
            lines.append(f"  {s.label:<{width}}{_fmt(s.shape)}")
        lines.append(f"  ┌─ {c.block_title} × {c.n_layers}")
        for s in c.block:
            extra = f"   {s.detail}" if s.detail else ""
            lines.append(f"  │ {s.label:<{width - 2}}{_fmt(s.shape)}{extra}")
        lines.append("  └─")
        for s in c.after:
            extra = f"   {s.detail}" if s.detail else ""
            lines.append(f"  {s.label:<{width}}{_fmt(s.shape)}{extra}")
    return "\n".join(lines)


COLORS = {"io": "#eeeeee", "embed": "#f9e0c7", "attn": "#fbd3d3", "norm": "#fff3b0", "add": "#fff3b0",
          "ff": "#cfe8fc", "head": "#d6f5d6", "op": "#e8e0f5"}


def plot_model_diagram(model, batch_size=1, seq_len=None, tgt_len=None, path=None, dpi=110):
    """Boxes and arrows from the input ids (bottom) to the logits (top), shapes in each box.

    The repeated block is framed and marked × n_layers, residual connections run on the
    right of the boxes, and a Transformer's encoder output feeds the decoder's cross-attention.
    The PNG's Description field holds ``format_model_diagram``'s text of the same diagram.
    """
    from matplotlib.patches import FancyArrowPatch

    title, cols = model_diagram(model, batch_size, seq_len, tgt_len)
    box_w, box_h, gap = 4.4, 0.62, 0.36
    col_x = [0.0, 6.4][:len(cols)]
    heights = [len(c.before) + len(c.block) + len(c.after) for c in cols]
    n_max = max(heights)
    fig = new_figure(5.6 * len(cols) + 0.6, (box_h + gap) * n_max * 0.95 + 1.6)
    ax = fig.subplots()
    ax.set_axis_off()
    centers = []
    for c, x0 in zip(cols, col_x):
        stages = c.before + c.block + c.after
        # Align the columns' tops for a Transformer: the encoder output sits level with the cross-attention.
        y0 = 0.0
        if len(cols) == 2 and c is cols[0] and cols[1].cross is not None:
            target = len(cols[1].before) + cols[1].cross
            y0 = (target - (len(stages) - 1)) * (box_h + gap)
        ys = [y0 + k * (box_h + gap) for k in range(len(stages))]
        centers.append(ys)
        _draw_stages(ax, stages, x0, ys, box_w, box_h)
        if c.block:
            _draw_block(ax, c, x0, ys, box_w, box_h, gap)
        ax.text(x0 + box_w / 2, ys[-1] + box_h + 0.35, c.title, ha="center", va="bottom", fontsize=9,
                fontweight="bold")
    if len(cols) == 2 and cols[1].cross is not None:
        enc_top = centers[0][-1] + box_h / 2
        k = len(cols[1].before) + cols[1].cross
        ax.add_patch(FancyArrowPatch((col_x[0] + box_w, enc_top), (col_x[1], centers[1][k] + box_h / 2),
                                     arrowstyle="-|>", mutation_scale=9, lw=1.2, color="#b03a2e",
                                     connectionstyle="arc3,rad=0.0"))
    all_y = [y for ys in centers for y in ys]
    ax.set_xlim(-1.3, col_x[-1] + box_w + 0.9)
    ax.set_ylim(min(all_y) - 0.4, max(all_y) + box_h + 0.9)
    ax.set_title(title, fontsize=9)
    return save_figure(fig, path, dpi, description=format_model_diagram(model, batch_size, seq_len, tgt_len))


def _draw_stages(ax, stages, x0, ys, box_w, box_h):
    """One box per stage (label, and shape with detail below it), an arrow from each box to the next."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    for k, (s, y) in enumerate(zip(stages, ys)):
        ax.add_patch(FancyBboxPatch((x0, y), box_w, box_h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                    fc=COLORS.get(s.kind, "#ffffff"), ec="#444444", lw=0.9))
        ax.text(x0 + box_w / 2, y + box_h * 0.66, s.label, ha="center", va="center", fontsize=7.2)
        sub = _fmt(s.shape) + (f"   {s.detail}" if s.detail else "")
        ax.text(x0 + box_w / 2, y + box_h * 0.27, sub, ha="center", va="center", fontsize=6.2, color="#333333")
        if k:
            ax.add_patch(FancyArrowPatch((x0 + box_w / 2, ys[k - 1] + box_h), (x0 + box_w / 2, y),
                                         arrowstyle="-|>", mutation_scale=8, lw=0.9, color="#333333"))


def _draw_block(ax, c, x0, ys, box_w, box_h, gap):
    """The repeated block of column ``c``: a dashed frame, its count and title, and its residual connections."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    b0 = len(c.before)
    top = ys[b0 + len(c.block) - 1] + box_h + gap * 0.4
    bot = ys[b0] - gap * 0.4
    ax.add_patch(FancyBboxPatch((x0 - 0.25, bot), box_w + 0.85, top - bot,
                                boxstyle="round,pad=0.02,rounding_size=0.15", fc="none", ec="#777777",
                                lw=1.0, ls="--"))
    ax.text(x0 - 0.35, (top + bot) / 2, f"× {c.n_layers}", ha="right", va="center", fontsize=10,
            fontweight="bold")
    ax.text(x0 - 0.2, top + 0.05, c.block_title, ha="left", va="bottom", fontsize=7, color="#555555")
    # Residual connections: from the stream entering stage i, around the right side, into stage j.
    for r, (i, j) in enumerate(c.residuals):
        y_from = ys[b0 + i] - gap / 2
        y_to = ys[b0 + j] + box_h / 2
        xr = x0 + box_w + 0.22 + 0.12 * (r % 2)
        ax.plot([x0 + box_w / 2, xr, xr], [y_from, y_from, y_to], color="#666666", lw=0.9)
        ax.add_patch(FancyArrowPatch((xr, y_to), (x0 + box_w, y_to), arrowstyle="-|>",
                                     mutation_scale=7, lw=0.9, color="#666666"))
