"""Real text: IMDB sentiment and AG News topics with the encoder classifier (``numformer reproduce imdb|agnews``).

Besides the standard pipeline (train ``configs/NAME.toml``, test accuracy on the
full official test set, learning curve, attention heatmaps), each experiment
draws ``figures/NAME_saliency.png``: for a few test texts, which words drive the
prediction, seen two ways:

* attention: how much attention each token receives in the last encoder layer,
  averaged over heads and over the positions that the classifier pools (all
  non-padding positions for ``pooling = "mean"``, the ``<cls>`` position for
  ``"first"``);
* gradient × input: Σ_d ∂log p(predicted class)/∂e_td · e_td for the token
  embedding e_t (``numformer.analysis.gradient_x_input``): red words raise the
  probability of the predicted class, blue words lower it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analysis import LossTarget, attention_maps, gradient_x_input, new_figure, save_figure
from ..ops import softmax_forward
from . import Experiment, Target, register

# --quick: a tiny model on a few hundred texts (the test metrics are on a 200-text sample of the test set).
QUICK = ["train.max_steps=24", "train.eval_every=12", "train.checkpoint_every=12", "train.batch_size=16",
         "train.early_stopping_patience=0", "train.warmup_steps=4", "train.max_minutes=0",
         "data.n_train=400", "data.val_size=100", "data.n_test=200", "data.max_len=64", "data.vocab_size=2000",
         "data.min_freq=1", "data.buckets=1",
         "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.d_ff=64"]

N_EXAMPLES = 4               # test texts in the saliency figure
EXAMPLE_TOKENS = (25, 90)    # their length range in tokens (short enough to read)


# --------------------------------------------------------------------------------------------- word scores
def word_scores(model, ids):
    """(attention received (T,), gradient × input (T,), class probabilities (C,)) for one id sequence.

    Attention: last layer, mean over heads, mean over the query positions the classifier pools.
    Gradient × input: for log p(predicted class) (``analysis.gradient_x_input`` with a ``LossTarget``).
    """
    ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
    was_training = model.training
    model.eval()
    try:
        logits = np.asarray(model(ids), dtype=np.float64)
        model.clear_cache()
    finally:
        model.train(was_training)
    probs = softmax_forward(logits, axis=-1)[0][0]
    pred = int(np.argmax(probs))
    maps = attention_maps(model, ids)["self"]                 # (layers, 1, heads, T, T)
    last = maps[-1, 0].mean(axis=0)                           # (T, T), mean over heads
    attn = last[0] if getattr(model, "pooling", "mean") == "first" else last.mean(axis=0)
    sal = gradient_x_input(model, ids, target=LossTarget(np.array([pred])))
    return attn, next(iter(sal.values()))[0], probs


def pick_examples(task, n=N_EXAMPLES, lengths=EXAMPLE_TOKENS, seed=0):
    """Indices of ``n`` test texts of readable length, spread over the classes (seeded, fixed)."""
    lens = task.lengths["test"]
    labels = np.asarray(task.data["test"].labels)
    rng = np.random.default_rng(seed)
    ok = np.flatnonzero((lens >= lengths[0]) & (lens <= lengths[1]))
    if ok.size < n:
        ok = np.argsort(np.abs(lens - np.mean(lengths)), kind="stable")[:max(n, 1)]
    classes = sorted(set(labels[ok].tolist()))
    pools = {c: list(rng.permutation(ok[labels[ok] == c])) for c in classes}
    chosen = []
    while len(chosen) < min(n, ok.size):
        for c in classes:
            if pools[c] and len(chosen) < n:
                chosen.append(int(pools[c].pop(0)))
    return chosen


# ------------------------------------------------------------------------------------------------- figure
_CHAR_W = 0.602      # DejaVu Sans Mono advance width, in em
_MONO = "DejaVu Sans Mono"


def _layout(words, fontsize, width_in):
    """(x, line) in inches / line numbers for each word, wrapped to ``width_in``."""
    cw = _CHAR_W * fontsize / 72.0
    x, line, out = 0.0, 0, []
    for w in words:
        wlen = (len(w) + 1) * cw
        if x > 0 and x + wlen > width_in:
            x, line = 0.0, line + 1
        out.append((x, line))
        x += wlen
    return out, line + 1


def _draw_words(ax, words, values, top, cmap, norm, fontsize, width_in, left):
    """Words on a coloured background (value -> colour); returns the height used (inches)."""
    from matplotlib.patches import Rectangle

    pos, n_lines = _layout(words, fontsize, width_in)
    cw, lh = _CHAR_W * fontsize / 72.0, 1.55 * fontsize / 72.0
    for w, v, (x, line) in zip(words, values, pos):
        y = top + line * lh
        ax.add_patch(Rectangle((left + x - 0.2 * cw, y), (len(w) + 0.4) * cw, lh * 0.92,
                               facecolor=cmap(norm(v)), edgecolor="none"))
        ax.text(left + x, y + lh * 0.46, w, fontsize=fontsize, family=_MONO, va="center", ha="left",
                color="black")
    return n_lines * lh


def _safe(word):
    return str(word).replace("$", r"\$").replace("\n", " ") or "∅"


def plot_word_saliency(examples, path=None, title=None, width=13.0, fontsize=8.5, dpi=110):
    """One panel per example: a header, then its words coloured by attention and by gradient × input.

    examples: dicts with keys words (list of str), attention (T,), saliency (T,), header (str).
    Returns the Figure (written as PNG to ``path`` when given).
    """
    import matplotlib
    from matplotlib.colors import Normalize, TwoSlopeNorm

    left, text_w = 0.25, width - 0.5 - 1.25      # inches: 0.25 margins, 1.25 for the row labels
    lh = 1.55 * fontsize / 72.0
    heights = []
    for ex in examples:
        n = _layout([_safe(w) for w in ex["words"]], fontsize, text_w)[1]
        heights.append(0.32 + 2 * (n * lh + 0.22) + 0.2)
    head = 0.75 if title else 0.45
    H = head + sum(heights) + 0.1
    fig = new_figure(width, H)
    fig.set_layout_engine(None)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(H, 0)
    ax.axis("off")
    attn_cmap, sal_cmap = matplotlib.colormaps["Oranges"], matplotlib.colormaps["RdBu_r"]
    y = 0.12
    if title:
        ax.text(left, y + 0.15, title, fontsize=11, weight="bold", va="center")
        y += 0.32
    ax.text(left, y + 0.12, "attention: received in the last layer (mean over heads and pooled positions), "
            "from least (white) to most (dark).   gradient × input of log p(predicted class): red = supports the prediction, "
            "blue = against it.", fontsize=8, va="center", color="#333333")
    y += 0.33
    for ex, h in zip(examples, heights):
        ax.text(left, y + 0.14, ex["header"], fontsize=9, weight="bold", va="center")
        y += 0.32
        words = [_safe(w) for w in ex["words"]]
        a = np.asarray(ex["attention"], dtype=np.float64)
        s = np.asarray(ex["saliency"], dtype=np.float64)
        amin, amax = (float(a.min()), float(a.max())) if a.size else (0.0, 1.0)
        smax = float(np.abs(s).max()) if s.size and np.abs(s).max() > 0 else 1.0
        for label, vals, cmap, norm in (
                ("attention", a, attn_cmap, Normalize(amin, amax + 0.15 * (amax - amin) + 1e-12)),
                ("grad × input", s, sal_cmap, TwoSlopeNorm(0.0, -smax * 1.15, smax * 1.15))):
            ax.text(left, y + lh * 0.46, label, fontsize=8, va="center", color="#555555", style="italic")
            used = _draw_words(ax, words, vals, y, cmap, norm, fontsize, text_w, left + 1.25)
            y += used + 0.22
        y += 0.2
    return save_figure(fig, path, dpi)


# ---------------------------------------------------------------------------------------------- the hook
def _top_words(words, values, k=6, sign=1):
    order = np.argsort(-sign * np.asarray(values), kind="stable")
    out = []
    for i in order:
        w = words[i]
        if w.startswith("<") and w.endswith(">"):
            continue
        if sign * values[i] <= 0:
            break
        if w not in out:
            out.append(w)
        if len(out) == k:
            break
    return out


def saliency_extra(name):
    """The ``extra`` step of an experiment: figures/NAME_saliency.png and a markdown section."""

    def extra(trainer, task, ctx):
        model = trainer.model
        names = task.label_names
        examples, rows = [], []
        for i in pick_examples(task, seed=int(trainer.config["train"]["seed"])):
            ids = task.ids["test"][i]
            attn, sal, probs = word_scores(model, ids)
            words = task.token_labels(ids)
            pred, true = int(np.argmax(probs)), int(task.data["test"].labels[i])
            header = (f"test text {i}: true {names[true]}, predicted {names[pred]} (p = {probs[pred]:.3f})"
                      + ("" if pred == true else "  [wrong]"))
            examples.append({"words": words, "attention": attn, "saliency": sal, "header": header})
            rows.append(f"| {i} | {names[true]} | {names[pred]} ({probs[pred]:.3f}) | "
                        f"{', '.join(_top_words(words, sal)) or '-'} | "
                        f"{', '.join(_top_words(words, -sal)) or '-'} | "
                        f"{', '.join(_top_words(words, attn - attn.mean())) or '-'} |")
        path = Path(ctx.results_dir) / "figures" / f"{name}_saliency.png"
        plot_word_saliency(examples, path=path, title=f"{name}: which words drive the prediction "
                                                      f"({len(examples)} test texts)")
        md = "\n".join([
            "**Which words drive the prediction** (test texts of 25 to 90 tokens, chosen with the seed): "
            "gradient × input of log p(predicted class) per token, and the attention each token receives in "
            "the last layer (mean over heads and pooled positions).", "",
            "| test text | true | predicted (p) | words for the prediction | words against it | most attended |",
            "|---|---|---|---|---|---|", *rows, "",
            f"![Which words drive the prediction](figures/{path.name})"])
        return {}, md

    return extra


AGNEWS_FULL_TRAIN = 120000      # rows of the official training set (the 20,000-row subset is a stand-in)


def training_set_note(task) -> tuple[dict, str]:
    """({"train_rows": rows of the training file}, a sentence naming the file and whether it is the full set)."""
    rows = task.train_rows
    which = ("the full official training set" if rows == AGNEWS_FULL_TRAIN else
             f"not the full {AGNEWS_FULL_TRAIN:,}-row training set, which was not available here "
             "(`numformer data fetch agnews` downloads it)")
    return {"train_rows": rows}, f"**Training set**: {task.train_source}: {which}."


def agnews_extra(trainer, task, ctx):
    """The saliency figure, and which training set was used (the full 120,000 rows or the subset)."""
    figures, md = saliency_extra("agnews")(trainer, task, ctx)
    rows, note = training_set_note(task)
    return {**figures, **rows}, note + "\n\n" + md


# ------------------------------------------------------------------------------------------ registration
register(Experiment(
    "imdb",
    "IMDB sentiment (Maas et al. 2011): EncoderClassifier trained from scratch on the 25,000 training reviews "
    "only (2,500 of them, chosen with the seed, held out for validation and early stopping), test accuracy on "
    "the full 25,000-review test set.",
    [Target("accuracy", 0.87)], quick_overrides=QUICK, time_limit_minutes=60, extra=saliency_extra("imdb")),
    group="text")
register(Experiment(
    "agnews",
    "AG News topics (World, Sports, Business, Sci/Tech; Zhang et al. 2015): EncoderClassifier trained from "
    "scratch on the training set (the full 120,000 rows when available, else the 20,000-row subset; "
    "train_rows says which; the rows held out for validation, chosen with the seed, come from it), test "
    "accuracy on the full 7,600-row test set.",
    [Target("accuracy", 0.90)], quick_overrides=QUICK, time_limit_minutes=60, extra=agnews_extra),
    group="text")
