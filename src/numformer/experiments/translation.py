"""Translation with the encoder-decoder Transformer: Multi30k German -> English, greedy and beam search, BLEU.

``numformer reproduce multi30k`` trains ``configs/multi30k.toml`` and then, on
the 1,000 pairs of test_2016_flickr, reports sacrebleu's corpus BLEU (default
settings) of greedy decoding (``bleu_greedy``) and of beam search with a length
penalty (``bleu_beam``), both with the decoder's key/value cache. The extra step
here adds example translations, the translated test sets (so that anyone can
re-score them with the ``sacrebleu`` command) and a cross-attention heatmap of
one sentence pair.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..analysis import attention_maps, plot_attention
from ..data.batching import eval_mode
from ..data.text_tasks import bleu_signature, corpus_bleu
from . import Experiment, Target, register

QUICK = ["data.n_train=300", "data.n_eval=20", "data.vocab_size=400", "data.beam_size=2",
         "model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64",
         "train.max_steps=10", "train.batch_size=16", "train.warmup_steps=5", "train.eval_every=5",
         "train.checkpoint_every=5", "train.max_minutes=0.0"]

N_EXAMPLES = 6


def _md(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def cross_attention_figure(model, task, src_text, path, title):
    """Cross-attention of the last decoder layer while the model writes its own (beam) translation of src_text.

    Rows: the target token produced at each step (the query at position t is the decoder input
    ``<bos>`` y_1 … y_t and predicts y_{t+1}); columns: the source tokens. Writes PATH (every head of
    the last layer) and PATH with ``_mean`` (the average over heads). Returns (paths, translation).
    """
    src = np.asarray(task.encode_source([src_text])[0], dtype=np.int64)[None]
    k = max(1, int(task.config["beam_size"]))
    with eval_mode(model):
        if k > 1:
            hyp = model.generate(src, max_length=model.max_len, beam_size=k,
                                 length_penalty=task.config["length_penalty"], bos_id=task.bos_id,
                                 eos_id=task.eos_id)[0]
        else:
            hyp = model.generate(src, max_length=model.max_len, greedy=True, bos_id=task.bos_id,
                                 eos_id=task.eos_id)[0]
    hyp = list(hyp)[:model.max_len - 1]
    tgt = np.asarray([[task.bos_id] + hyp], dtype=np.int64)
    maps = attention_maps(model, {"src": src, "tgt": tgt})
    cross = maps["cross"]                                   # (layers, 1, heads, T, S)
    rows = task.token_labels(hyp, "tgt") + ["<eos>"]
    cols = task.token_labels(src[0], "src")
    last = cross[-1, 0]                                     # (heads, T, S)
    path = Path(path)
    per_head = plot_attention(last, rows, cols, title=f"{title}: cross-attention, last layer, every head")
    per_head.savefig(path, dpi=100)
    mean_path = path.with_name(path.stem + "_mean.png")
    fig = plot_attention(last.mean(axis=0), rows, cols, title=f"{title}: cross-attention, last layer")
    fig.axes[0].set_title("mean over heads", fontsize=9)
    fig.savefig(mean_path, dpi=100)
    return [mean_path, path], task.decode_target(hyp)


def multi30k_extra(trainer, task, ctx):
    """Examples, translated test sets and the cross-attention heatmap (after ``task.evaluate(model, 'test')``)."""
    model = trainer.model.eval()
    results_dir = Path(ctx.results_dir)
    c, t = task.config, trainer.config["train"]
    figures = {"epochs": round(trainer.step * t["batch_size"] * t["grad_accum"] / len(task.sources("train")), 2)}
    tr = task.last_translations
    if tr.get("split") != "test" or "greedy" not in tr:      # evaluate() did not run on test: decode now
        task.evaluate(model, "test")
        tr = task.last_translations
    srcs, refs = tr["sources"], tr["references"]
    kinds = [k for k in ("greedy", "beam") if k in tr]

    out_dir = results_dir / "translations"
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for kind in kinds:
        f = out_dir / f"multi30k_{c['test_name']}_{kind}.{c['tgt_lang']}"
        f.write_text("".join(h + "\n" for h in tr[kind]), encoding="utf-8")
        files.append(f)

    beam = f"beam search (beam {c['beam_size']}, length penalty {c['length_penalty']:g})"
    lines = ["## Translation", "",
             f"BLEU on {c['test_name']} ({len(refs):,} pairs, {c['src_lang']} -> {c['tgt_lang']}): "
             f"sacrebleu `corpus_bleu` with its default settings (`{bleu_signature(tr[kinds[0]], refs, c['lowercase'])}`), detokenized "
             "hypotheses against the raw reference lines. Greedy decoding and " + beam + ", both with the "
             "decoder's key/value cache, batched by source length.", "",
             "| decoding | BLEU | decoding time |", "|---|---|---|"]
    for kind in kinds:
        name = "greedy" if kind == "greedy" else beam
        lines.append(f"| {name} | {_md_bleu(tr, kind, refs, c['lowercase'])} | {_decode_time(kind, task)} |")
    lines += ["", "The translations: " + ", ".join(f"[{f.name}]({os.path.relpath(f, results_dir)})" for f in files)
              + f" (re-score with `sacrebleu REFERENCE.{c['tgt_lang']} -i FILE`).", ""]

    picks = sorted(set(np.linspace(0, len(srcs) - 1, min(N_EXAMPLES, len(srcs))).astype(int).tolist()))
    lines += ["### Example translations (test set)", "",
              "| # | source | reference | " + " | ".join(kinds) + " |",
              "|---|---|---|" + "---|" * len(kinds)]
    for i in picks:
        lines.append(f"| {i + 1} | {_md(srcs[i])} | {_md(refs[i])} | "
                     + " | ".join(_md(tr[k][i]) for k in kinds) + " |")
    lines.append("")

    example = _heatmap_source(task)
    fig_dir = results_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    paths, hyp = cross_attention_figure(model, task, example, fig_dir / "multi30k_cross_attention.png", "multi30k")
    lines += ["### Cross-attention of a sentence pair", "",
              f"Source: {_md(example)}  ", f"Model translation ({'beam' if c['beam_size'] > 1 else 'greedy'}): "
              f"{_md(hyp)}", "",
              "Rows are the target tokens the decoder produced (the query at each step predicts that token), "
              "columns the source tokens (`##` marks a subword that continues a word). The weights of the "
              "last decoder layer's cross-attention, averaged over heads and then head by head:", ""]
    for p in paths:
        lines += [f"![cross-attention]({os.path.relpath(p, results_dir)})", ""]
    return figures, "\n".join(lines)


def _md_bleu(tr, kind, refs, lowercase):
    return f"{corpus_bleu(tr[kind], refs, lowercase=lowercase):.2f}"


def _decode_time(kind, task):
    s = task.last_translations.get(f"{kind}_seconds")
    return "" if s is None else f"{s:.1f} s"


def _heatmap_source(task):
    """The test sentence drawn in the heatmap: the first with 8 to 14 source tokens."""
    srcs = task.sources("test")
    for s in srcs:
        if 8 <= len(task.encode_source([s])[0]) <= 14:
            return s
    return srcs[0]


register(Experiment(
    "multi30k",
    "Multi30k German -> English translation with the encoder-decoder Transformer (29,000 training pairs); "
    "sacrebleu BLEU on test_2016_flickr with greedy decoding and beam search.",
    [Target("bleu_beam", 30.0)], quick_overrides=QUICK, time_limit_minutes=120, extra=multi30k_extra,
    requires=("sacrebleu",)))
