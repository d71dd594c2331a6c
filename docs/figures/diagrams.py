"""The tutorials' drawings: architecture and computation graphs, drawn with matplotlib.

``python docs/figures/diagrams.py`` writes every figure of ``DRAWINGS`` into docs/figures/
(``tests/test_docs_figures.py`` draws them all in a temporary folder and checks that each one is
committed and shown by a page). The model diagrams are numformer's own
(``numformer.analysis.plot_model_diagram``), built from the modules of the model their page trains
(``MODEL_DRAWINGS``: the config the page shows, or the file it trains); each PNG carries its diagram
as text, which the test compares with the model of the page's config.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
HEAD_COLORS = ["#e07b6a", "#6aa5e0", "#7cc47a", "#e0b85a"]
INK = "#333333"


def _box(ax, x, y, w, h, text, fc="#ffffff", fontsize=9, sub=None):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, fc=fc, ec="#444444", lw=1.0,
                                boxstyle="round,pad=0.02,rounding_size=0.08"))
    if sub is None:
        ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)
    else:
        ax.text(x, y + h * 0.15, text, ha="center", va="center", fontsize=fontsize)
        ax.text(x, y - h * 0.22, sub, ha="center", va="center", fontsize=fontsize - 2, color="#555")


def _arrow(ax, a, b, text=None, color=INK, offset=(0.0, 0.0), fontsize=7.5, rad=0.0, ls="-"):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=10, lw=1.1, color=color,
                                 connectionstyle=f"arc3,rad={rad}", linestyle=ls, shrinkA=2, shrinkB=2))
    if text:
        ax.text((a[0] + b[0]) / 2 + offset[0], (a[1] + b[1]) / 2 + offset[1], text, fontsize=fontsize,
                color=color, ha="center", va="center",
                bbox=dict(fc="white", ec="none", pad=0.5, alpha=0.9))


def _canvas(w, h, xlim, ylim):
    fig, ax = plt.subplots(figsize=(w, h))
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.set_axis_off()
    return fig, ax


def _grid(ax, x0, y0, rows, cols, colors, cell=0.32):
    """A rows × cols matrix of cells, top-left at (x0, y0); colors[c] is the colour of column c."""
    for r in range(rows):
        for c in range(cols):
            ax.add_patch(Rectangle((x0 + c * cell, y0 - (r + 1) * cell), cell, cell, fc=colors[c],
                                   ec="white", lw=0.8))


def head_split(path):
    """(B, T, d) -> reshape (B, T, h, d/h) -> transpose (B, h, T, d/h), for T = 6, d = 8, h = 4."""
    T, d, h = 6, 8, 4
    dh = d // h
    cell = 0.32
    fig, ax = _canvas(10.5, 3.0, (-0.6, 16.2), (-2.6, 2.0))
    colors = [HEAD_COLORS[c // dh] for c in range(d)]
    _grid(ax, 0, 1, T, d, colors, cell)
    ax.text(d * cell / 2, 1.35, "x: (B, T, d)", ha="center", fontsize=10)
    ax.text(-0.3, 1 - T * cell / 2, "T", ha="center", va="center", fontsize=9)
    ax.text(d * cell / 2, 1 - T * cell - 0.3, "d = h · d/h features", ha="center", fontsize=8)
    # reshape: the same memory, the last axis read as (h, d/h)
    x1 = 4.6
    for k in range(h):
        _grid(ax, x1 + k * (dh * cell + 0.12), 1, T, dh, [HEAD_COLORS[k]] * dh, cell)
    ax.text(x1 + 1.6, 1.35, "reshape: (B, T, h, d/h)", ha="center", fontsize=10)
    ax.text(x1 + 1.6, 1 - T * cell - 0.3, "no copy: the last axis read as (h, d/h)", ha="center",
            fontsize=8)
    _arrow(ax, (d * cell + 0.2, 0), (x1 - 0.2, 0))
    # transpose: heads before time, h independent (T, d/h) problems
    x2 = 10.4
    for k in range(h):
        y = 1.5 - k * 0.55
        _grid(ax, x2 + k * 0.55, y, T, dh, [HEAD_COLORS[k]] * dh, cell * 0.7)
        ax.text(x2 + k * 0.55 + dh * cell * 0.7 + 0.1, y - 0.12, f"head {k}", fontsize=7,
                color=HEAD_COLORS[k])
    ax.text(x2 + 2.0, 1.75, "transpose(0, 2, 1, 3): (B, h, T, d/h)", ha="center", fontsize=10)
    ax.text(x2 + 2.2, -2.3, "attention runs on each head's (T, d/h) matrix at once", ha="center",
            fontsize=8)
    _arrow(ax, (x1 + 3.6, 0), (x2 - 0.2, 0))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def residual_stream(path):
    """The residual stream of a pre-LN block: forward (up) and the gradient's split and sum."""
    fig, ax = _canvas(8.6, 6.4, (-4.6, 7.0), (-0.6, 8.8))
    xs = 0.0
    ax.plot([xs, xs], [0.2, 8.0], color="#888", lw=6, alpha=0.35, solid_capstyle="round")
    ax.text(xs, -0.2, "x (B, T, d): embeddings + positions", ha="center", fontsize=9)
    ax.text(xs, 8.45, "y (B, T, d) → final norm → logits", ha="center", fontsize=9)
    ax.text(-0.35, 4.0, "the residual stream", rotation=90, ha="center", va="center", fontsize=9,
            color="#666")
    for y0, name, fc in ((1.2, "Attention", "#f9d3d3"), (4.6, "FFN", "#d0e6fa")):
        _box(ax, 3.2, y0 + 0.3, 1.6, 0.6, "LayerNorm", fc="#fdf2b0")
        _box(ax, 3.2, y0 + 1.6, 1.6, 0.6, name, fc=fc)
        _arrow(ax, (xs + 0.1, y0 - 0.1), (3.2 - 0.8, y0 + 0.3), rad=-0.25)
        _arrow(ax, (3.2, y0 + 0.6), (3.2, y0 + 1.3))
        ax.add_patch(plt.Circle((xs, y0 + 2.6), 0.22, fc="white", ec=INK, lw=1.1, zorder=3))
        ax.text(xs, y0 + 2.6, "+", ha="center", va="center", fontsize=12, zorder=4)
        _arrow(ax, (3.2, y0 + 1.9), (xs + 0.22, y0 + 2.6), rad=0.25)
        ax.text(4.3, y0 + 2.35, f"x + {name}(LN(x))", fontsize=8, color="#555")
    # the backward annotations
    ax.text(-4.4, 6.8, "backward, at each +:", fontsize=9, fontweight="bold", color="#b03a2e")
    ax.text(-4.4, 6.2, "dy goes down the stream\nAND into the branch", fontsize=8.5,
            color="#b03a2e", va="top")
    ax.text(-4.4, 2.7, "at each fork:", fontsize=9, fontweight="bold", color="#b03a2e")
    ax.text(-4.4, 2.1, "dx = dy + LN'(f'(dy))\n(the two paths add)", fontsize=8.5, color="#b03a2e",
            va="top")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _attention_nodes(ax):
    """The forward graph of attention; returns the nodes' centres."""
    nodes = {"Q": (0, 4.2), "K": (0, 2.6), "V": (0, 0.6), "S": (4.2, 3.4), "P": (8.0, 3.4),
             "O": (11.2, 1.6)}
    shapes = {"Q": "(B, h, T, d_k)", "K": "(B, h, T, d_k)", "V": "(B, h, T, d_v)",
              "S": "(B, h, T, T)", "P": "(B, h, T, T)", "O": "(B, h, T, d_v)"}
    labels = {"S": "S = Q Kᵀ · scale + M", "P": "P = softmax(S)", "O": "O = P V"}
    fill = {"Q": "#eeeeee", "K": "#eeeeee", "V": "#eeeeee", "S": "#fdf2b0", "P": "#f9d3d3",
            "O": "#d0e6fa"}
    for name, (x, y) in nodes.items():
        _box(ax, x, y, 2.6 if name in labels else 1.8, 0.8, labels.get(name, name), fc=fill[name],
             sub=shapes[name])
    return nodes


def attention_graph(path):
    """Scaled dot-product attention, forward: Q, K, V -> S -> P -> O with shapes."""
    fig, ax = _canvas(9.5, 3.4, (-1.2, 12.8), (-0.2, 5.0))
    n = _attention_nodes(ax)
    _arrow(ax, (0.9, 4.2), (2.9, 3.55))
    _arrow(ax, (0.9, 2.6), (2.9, 3.25))
    _arrow(ax, (5.5, 3.4), (6.7, 3.4), "row-wise", offset=(0, 0.3))
    _arrow(ax, (9.3, 3.2), (10.6, 2.0))
    _arrow(ax, (0.9, 0.6), (9.9, 1.45))
    ax.text(4.2, 4.45, "M: mask (−∞ where a key is hidden)", ha="center", fontsize=7.5, color="#555")
    del n
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def attention_backward(path):
    """Attention's backward graph: the gradient flows right to left, with its formula on each edge."""
    fig, ax = _canvas(11.5, 4.6, (-1.4, 13.0), (-1.6, 5.4))
    _attention_nodes(ax)
    red = "#b03a2e"
    _arrow(ax, (0.9, 4.2), (2.9, 3.55), color="#bbb")
    _arrow(ax, (0.9, 2.6), (2.9, 3.25), color="#bbb")
    _arrow(ax, (5.5, 3.4), (6.7, 3.4), color="#bbb")
    _arrow(ax, (9.3, 3.2), (10.6, 2.0), color="#bbb")
    _arrow(ax, (0.9, 0.6), (9.9, 1.45), color="#bbb")
    _arrow(ax, (11.2, 2.05), (9.0, 3.8), "dP = dO Vᵀ", color=red, rad=0.3, offset=(0.9, 0.5))
    _arrow(ax, (10.3, 1.2), (0.9, 0.3), "dV = Pᵀ dO", color=red, rad=-0.08, offset=(0, -0.55))
    _arrow(ax, (6.7, 3.7), (5.5, 3.7), "dS = P ⊙ (dP − rowsum(dP ⊙ P))", color=red, rad=-0.6,
           offset=(0, 0.85))
    _arrow(ax, (3.0, 3.7), (0.9, 4.5), "dQ = dS K · scale", color=red, rad=-0.25, offset=(-0.3, 0.55))
    _arrow(ax, (3.0, 3.05), (0.9, 2.3), "dK = dSᵀ Q · scale", color=red, rad=0.25,
           offset=(0.6, -0.45))
    ax.text(5.8, -1.3, "grey: forward.  red: backward, from dO = ∂L/∂O.  "
            "Masked scores have P = 0, so dS = 0 there.", ha="center", fontsize=8.5, color=INK)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def flash_tiles(path):
    """Memory-efficient attention: the (T, T) scores computed tile by tile, causal tiles skipped."""
    n, cell = 6, 0.55
    fig, ax = _canvas(7.2, 4.4, (-1.2, 8.6), (-4.2, 0.9))
    for i in range(n):
        for j in range(n):
            if j > i:
                fc, text = "#f2f2f2", ""
            elif j == i:
                fc, text = "#fdf2b0", "mask"
            else:
                fc, text = "#d0e6fa", ""
            ax.add_patch(Rectangle((j * cell, -(i + 1) * cell), cell, cell, fc=fc, ec="white", lw=1.5))
            if text:
                ax.text((j + 0.5) * cell, -(i + 0.5) * cell, text, ha="center", va="center", fontsize=6)
    ax.text(n * cell / 2, 0.35, "keys, block by block →", ha="center", fontsize=9)
    ax.text(-0.4, -n * cell / 2, "queries", rotation=90, ha="center", va="center", fontsize=9)
    x = n * cell + 0.5
    for k, (fc, text) in enumerate((("#d0e6fa", "computed, no mask"), ("#fdf2b0", "computed, masked"),
                                    ("#f2f2f2", "skipped: all in the future"))):
        ax.add_patch(Rectangle((x, -0.5 - k * 0.6), 0.4, 0.4, fc=fc, ec="#999"))
        ax.text(x + 0.55, -0.3 - k * 0.6, text, va="center", fontsize=8.5)
    ax.text(x, -2.6, "each row keeps a running max m and sum ℓ:\n"
            "memory O(T · block) instead of O(T²);\nbackward recomputes each tile", fontsize=8.5,
            va="top")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def page_config(page):
    """The ``config = {...}`` dict of a tutorial page (read from its Python blocks, nothing run)."""
    text = (DOCS / page).read_text(encoding="utf-8")
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        for node in ast.parse(block).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "config":
                return ast.literal_eval(node.value)
    raise ValueError(f"{page} has no config = {{...}} block")


def model_of(config):
    """The model a config builds (the sizes its data decides, without reading data where the task can tell),
    and the (batch size, source length, target length) of one training batch."""
    from numformer.config import resolve_config
    from numformer.models import build_model

    resolved, _ = resolve_config(config, sizes_only=True)
    model = build_model(resolved["model"], rng=0)
    data, batch = resolved["data"], resolved["train"]["batch_size"]
    if resolved["model"]["type"] == "transformer":           # a synthetic task: the source, <bos> target <eos>
        return model, (batch, data["length"], data["length"] + 1)
    return model, (batch, data["block_size"], None)


def _model_drawing(config):
    def draw(path):
        from numformer.analysis import plot_model_diagram

        model, (batch, seq_len, tgt_len) = model_of(config())
        plot_model_diagram(model, batch_size=batch, seq_len=seq_len, tgt_len=tgt_len, path=path)
    return draw


def _toml(name):
    from numformer.config import load_config

    return lambda: load_config(ROOT / "configs" / name)


# model diagrams: figure -> (the page that shows it, the config it is drawn from; the page trains that config)
MODEL_DRAWINGS = {
    "gpt_shakespeare.png": ("tutorials/first-gpt.md", _toml("shakespeare_char.toml")),
    "transformer_copy.png": ("tutorials/encoder-decoder.md", lambda: page_config("tutorials/encoder-decoder.md")),
}


def rope_scaling(path):
    """Scaled RoPE, θ'_i / θ_i per rotated pair: llama3's three bands (Llama 3.2 1B's parameters) against
    linear; YaRN's ramp (a Qwen-style 4x extension) against dynamic NTK at four times the context."""
    import numpy as np

    from numformer.ops.rope_scaling import RopeScaling, rope_inverse_frequencies, yarn_ramp_bounds

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    d, theta, old = 64, 500000.0, 8192
    plain, _ = rope_inverse_frequencies(d, theta)
    wavelength = 2 * np.pi / plain
    llama3 = RopeScaling("llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position_embeddings=old)
    for scaling, style, label in ((RopeScaling("linear", factor=32.0), "--", "linear, s = 32"),
                                  (llama3, "o-", "llama3, s = 32")):
        left.plot(wavelength, rope_inverse_frequencies(d, theta, scaling)[0] / plain, style, ms=3, label=label)
    left.axvspan(wavelength.min() / 2, old / 4, color="#7cc47a", alpha=0.2, label="λ < L₀/h: kept")
    left.axvspan(old / 4, old, color="#e0b85a", alpha=0.25, label="blended")
    left.axvspan(old, wavelength.max() * 2, color="#e07b6a", alpha=0.2, label="λ > L₀/l: θ / s")
    left.set(xscale="log", yscale="log", xlabel=r"wavelength $\lambda_i = 2\pi/\theta_i$ (tokens)",
             ylabel=r"$\theta'_i / \theta_i$",
             title="llama3 (θ = 5·10⁵, d = 64, L₀ = 8192, l = 1, h = 4)",
             xlim=(wavelength.min() / 2, wavelength.max() * 2))
    left.legend(fontsize=7.5, loc="upper right")
    d, theta, old = 128, 1e6, 32768
    plain, _ = rope_inverse_frequencies(d, theta)
    yarn = RopeScaling("yarn", factor=4.0, original_max_position_embeddings=old)
    dynamic = RopeScaling("dynamic", factor=4.0, max_position_embeddings=old)
    pairs = np.arange(d // 2)
    inv, a = rope_inverse_frequencies(d, theta, yarn)
    right.plot(pairs, inv / plain, "o-", ms=3, label=f"yarn, s = 4 (cos, sin × a = {a:.3f})")
    right.plot(pairs, rope_inverse_frequencies(d, theta, dynamic, 4 * old)[0] / plain, "--",
               label="dynamic, s = 4, at n = 4·L")
    lo, hi = yarn_ramp_bounds(yarn, d, theta)
    right.axvspan(lo, hi, color="#e0b85a", alpha=0.25, label=f"ramp: pairs {lo} to {hi}")
    right.set(yscale="log", xlabel="rotated pair i", ylabel=r"$\theta'_i / \theta_i$",
              title="yarn and dynamic (θ = 10⁶, d = 128, L₀ = 32768)")
    right.legend(fontsize=7.5, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chat_masked_loss(path):
    """A conversation as the tokens supervised fine-tuning trains on: the default chat format rendered, each
    token a cell, the assistant's tokens (labels kept) in colour, every other target -100 (no loss)."""
    from numformer.data.chat import ChatFormat, encode_chat
    from numformer.data.tokenizers import ByteLevelBPE

    messages = [{"role": "user", "content": "Is this review positive or negative? A wonderful film."},
                {"role": "assistant", "content": "positive"},
                {"role": "user", "content": "Write a negative review."},
                {"role": "assistant", "content": "The boat sank and so did the film."}]
    fmt = ChatFormat.default()
    tok = ByteLevelBPE.train([fmt.render(messages) * 4], 300)
    ids, labels = encode_chat((tok, fmt), messages)
    fig, ax = plt.subplots(figsize=(11, 3.2))
    ax.set_axis_off()
    x, y, per_row = 0.0, 0.0, 12.0
    for i, label in zip(ids, labels):
        text = tok.decode([i]).replace("\n", "↵")
        w = 0.12 + 0.09 * len(text)
        if x + w > per_row:
            x, y = 0.0, y - 0.5
        taken = label != -100
        ax.add_patch(Rectangle((x, y), w - 0.04, 0.4, fc="#7cc47a" if taken else "#e6e6e6", ec="white"))
        ax.text(x + (w - 0.04) / 2, y + 0.2, text, ha="center", va="center", fontsize=7.5,
                color=INK if taken else "#777777", family="monospace")
        x += w
    ax.set_xlim(-0.1, per_row + 0.1)
    ax.set_ylim(y - 0.2, 0.6)
    ax.set_title("encode_chat: the loss is taken on the assistant's tokens (green); every other target is -100",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


DRAWINGS = {"head_split.png": head_split, "residual_stream.png": residual_stream,
            "attention_graph.png": attention_graph, "attention_backward.png": attention_backward,
            "flash_tiles.png": flash_tiles, "rope_scaling.png": rope_scaling, "chat_masked_loss.png": chat_masked_loss,
            **{name: _model_drawing(config) for name, (_, config) in MODEL_DRAWINGS.items()}}


def draw_all(folder):
    folder = Path(folder)
    for name, draw in DRAWINGS.items():
        draw(folder / name)
    return sorted(DRAWINGS)


if __name__ == "__main__":
    print("wrote", draw_all(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent))
