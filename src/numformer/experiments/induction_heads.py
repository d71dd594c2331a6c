"""``numformer reproduce induction_heads``: the induction-head phase change (Olsson et al. 2022) on a CPU.

Two attention-only Transformers (no feed-forward sub-layers), one with 1 layer and one with 2, are trained
on tiny Shakespeare (byte-level BPE tokens by default, or its characters) with the same recipe. Every
``eval_every`` steps, on held-out text (fixed windows of the validation split), the experiment records

- the in-context score: the mean loss at the early positions (``early`` ± ``early_band``: 40 to 60) minus the
  mean loss at the late positions [``late_from``, ``context``) of ``context``-token windows (nats; positive when
  the earlier context helps; the negative of Olsson et al.'s in-context learning score, whose loss at token 50
  is a mean over far more text than these windows), each loss the mean over the windows, with its standard
  error over the windows (a band of early positions, not position 50 alone, keeps that error well below the
  0.1 nats the criteria ask to see);
- every head's scores on repeated random tokens (``analysis.head_scores``): induction (prefix matching),
  previous-token, duplicate-token.

An induction head needs a head of an earlier layer that writes the previous token into each position (a
previous-token head) for its keys to match: the 2-layer model can compose them, the 1-layer model cannot. So
the 2-layer model should show a rise of the in-context score, at the steps where an induction head appears
(the phase change), and the 1-layer model not. Finally the induction heads of the 2-layer model (the heads
whose induction score is at least ``INDUCTION_THRESHOLD`` and at least half the best one's) are mean-ablated
(their output z replaced by its mean over the held-out text, ``hook_z``): the loss at the late positions should
go up, the in-context gain vanish.

Writes results/induction_heads.{json,md} and figures/induction_heads_*.png. ``--set train.steps=N`` and the
other keys of ``SETTINGS`` change the recipe; ``--quick``: a tiny version in seconds (for the tests).
"""
from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

import numpy as np

from .. import ops
from ..analysis import (head_scores, in_context_score, new_figure, per_position_loss, per_window_loss, plot_layer_head,
                        save_figure)
from ..config import apply_overrides
from ..data.text import read_corpus
from ..data.tokenizers import ByteLevelBPE
from ..models import GPT
from ..optim import AdamW, clip_grad_norm, make_schedule
from ..provenance import git_commit, machine_info
from . import Experiment, Target, register

SETTINGS = {
    "data": {"corpus": "bpe", "vocab_size": 512},
    "model": {"d_model": 64, "n_heads": 4, "positional": "rope", "tie_weights": False},
    "train": {"steps": 12000, "one_layer_steps": 12000, "batch_size": 4, "lr": 3e-3, "warmup_steps": 200,
              "min_lr": 3e-4, "weight_decay": 0.0, "seed": 0},
    "eval": {"context": 256, "early": 50, "early_band": 10, "late_from": 200, "eval_every": 500, "windows": 128,
             "score_seq_len": 40, "score_batch": 4},
}
QUICK = ["data.corpus=char", "train.steps=6", "train.one_layer_steps=6", "train.batch_size=2", "train.warmup_steps=1",
         "eval.context=48", "eval.early=12", "eval.early_band=2", "eval.late_from=30", "eval.eval_every=3",
         "eval.windows=4", "eval.score_seq_len=8", "eval.score_batch=2", "model.d_model=16"]
INDUCTION_THRESHOLD = 0.2      # a head counts as an induction head from this induction score (and half the best)


def resolved_settings(overrides):
    """SETTINGS with the ``section.key=value`` overrides applied; an unknown key is one clear error."""
    settings = apply_overrides(SETTINGS, overrides)
    for section, keys in settings.items():
        unknown = set(keys) - set(SETTINGS.get(section, {}))
        if section not in SETTINGS or unknown:
            raise ValueError(f"induction_heads has no setting {section}.{sorted(unknown)[0] if unknown else ''}; "
                             f"its settings: {', '.join(f'{s}.{k}' for s in SETTINGS for k in SETTINGS[s])}")
    e = settings["eval"]
    if not (0 <= e["early_band"] <= e["early"] and e["early"] + e["early_band"] < e["late_from"] < e["context"]):
        raise ValueError(f"induction_heads: the eval positions need 0 <= early - early_band and "
                         f"early + early_band < late_from < context, got early {e['early']}, early_band "
                         f"{e['early_band']}, late_from {e['late_from']}, context {e['context']}")
    return settings


# -- data -------------------------------------------------------------------------------------------------------
def shakespeare_characters():
    """(train ids, validation ids, vocabulary): tiny Shakespeare's characters, the first 90% for training."""
    text = read_corpus()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text))
    split = int(0.9 * len(ids))
    return ids[:split], ids[split:], vocab


def shakespeare_bpe(vocab_size):
    """(train ids, validation ids, vocabulary): tiny Shakespeare in byte-level BPE tokens, the tokenizer learnt
    from the first 90% of the text (the training split) alone; the vocabulary as token strings."""
    text = read_corpus()
    split = int(0.9 * len(text))
    tokenizer = ByteLevelBPE.train([text[:split]], vocab_size)
    train, val = (np.array(tokenizer.encode(part), dtype=np.int64) for part in (text[:split], text[split:]))
    return train, val, [tokenizer.token(i) for i in range(tokenizer.vocab_size)]


def corpus(data):
    """The corpus of the ``data`` settings: (train ids, validation ids, vocabulary, its description)."""
    if data["corpus"] == "char":
        train, val, vocab = shakespeare_characters()
        return train, val, vocab, f"tiny Shakespeare characters ({len(vocab)} symbols)"
    if data["corpus"] == "bpe":
        train, val, vocab = shakespeare_bpe(data["vocab_size"])
        return train, val, vocab, f"tiny Shakespeare in byte-level BPE tokens ({len(vocab)}, learnt on the training split)"
    raise ValueError(f"induction_heads: data.corpus must be \"char\" or \"bpe\", got {data['corpus']!r}")


def windows(ids, n, length, rng):
    """(n, length) windows of ``ids`` starting at random offsets."""
    starts = rng.integers(0, len(ids) - length, n)
    return np.stack([ids[s:s + length] for s in starts])


# -- one model's training, measured along the way -----------------------------------------------------------------
def early_positions(e):
    """The early positions [start, stop): ``early`` ± ``early_band``."""
    return e["early"] - e["early_band"], e["early"] + e["early_band"] + 1


def in_context(losses, e):
    """The in-context score of per-position losses (T,), or one per window of (B, T): the mean loss at the
    early positions minus the mean at the late ones."""
    return in_context_score(losses, early_positions(e), (e["late_from"], e["context"]))


def measure(model, held_out, e, step):
    window_losses = per_window_loss(model, held_out, batch_size=32)
    losses = window_losses.mean(axis=0)
    per_window = in_context(window_losses, e)                  # their mean is the score of the mean losses
    scores = head_scores(model, seq_len=e["score_seq_len"], batch=e["score_batch"], rng=1)
    start, stop = early_positions(e)
    return {"step": step, "loss": float(losses.mean()), "in_context_score": float(per_window.mean()),
            "in_context_score_se": float(per_window.std(ddof=1) / np.sqrt(len(per_window))),
            "early_loss": float(losses[start:stop].mean()),
            "late_loss": float(np.mean(losses[e["late_from"]:e["context"]])),
            "induction": scores.induction.tolist(), "previous_token": scores.previous_token.tolist(),
            "duplicate_token": scores.duplicate_token.tolist()}


def build_model(n_layers, settings, vocab_size):
    """An attention-only GPT of ``n_layers`` (no feed-forward sub-layers, no dropout), as Olsson et al.'s: the
    token embedding and the unembedding are separate matrices unless ``model.tie_weights`` (tied, the direct
    path from a token to the next-token logits, E·Eᵀ, is symmetric and cannot hold the bigram statistics that an
    attention-only model has no MLP to learn elsewhere)."""
    m = settings["model"]
    return GPT(vocab_size, settings["eval"]["context"], n_layers=n_layers, n_heads=m["n_heads"], d_model=m["d_model"],
               positional=m["positional"], tie_weights=m["tie_weights"], feed_forward=False, dropout=0.0,
               rng=settings["train"]["seed"])


def train_model(n_layers, steps, settings, data, quiet):
    """Train one attention-only GPT; returns (model, [measurement, ...])."""
    train_ids, held_out, vocab_size = data
    t, e = settings["train"], settings["eval"]
    model = build_model(n_layers, settings, vocab_size)
    optimizer = AdamW(list(model.parameters()), lr=t["lr"], weight_decay=t["weight_decay"])
    schedule = make_schedule("cosine", t["lr"], t["warmup_steps"], steps, t["min_lr"])
    rng = np.random.default_rng(t["seed"] + 1)
    history, started = [], time.time()
    for step in range(steps + 1):
        if step % e["eval_every"] == 0 or step == steps:
            history.append(measure(model, held_out, e, step))
            if not quiet:
                h = history[-1]
                print(f"induction_heads: {n_layers}-layer step {step}/{steps} loss {h['loss']:.3f} in-context "
                      f"{h['in_context_score']:+.3f} induction {np.max(h['induction']):.2f} "
                      f"({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
        if step == steps:
            break
        batch = windows(train_ids, t["batch_size"], e["context"] + 1, rng)
        model.zero_grad()
        loss, cache = ops.cross_entropy_forward(model(batch[:, :-1]), batch[:, 1:])
        model.backward(ops.cross_entropy_backward(cache))
        clip_grad_norm(model.parameters(), 1.0)
        optimizer.set_lr(schedule(step))
        optimizer.step()
    model.clear_cache()
    return model.eval(), history


# -- reading the curves -------------------------------------------------------------------------------------------
def phase_change(history):
    """(index, step) of the phase change: the middle of the steepest rise of the best head's induction score
    between two evaluations."""
    best = np.array([np.max(h["induction"]) for h in history])
    i = int(np.argmax(np.diff(best))) if len(best) > 1 else 0
    return i, (history[i]["step"] + history[min(i + 1, len(history) - 1)]["step"]) / 2


def induction_heads_of(scores):
    """The induction heads [(layer, head), ...] of induction scores (L, H): those with a score of at least
    ``INDUCTION_THRESHOLD`` and at least half the best one's."""
    scores = np.asarray(scores)
    return [tuple(int(i) for i in ix) for ix in np.argwhere(scores >= max(INDUCTION_THRESHOLD, 0.5 * scores.max()))]


def ablation(model, held_out, heads):
    """Mean-ablate ``heads`` [(layer, head), ...]: (per-position losses with them ablated, without)."""
    names = sorted({f"blocks.{layer}.attn.hook_z" for layer, _ in heads})
    _, cache = model.run_with_cache(held_out[:, :-1], names_filter=names)
    means = {n: cache[n].mean(axis=(0, 1)) for n in names}           # (H, d_head): over the text and positions

    def ablate(act, hook):
        for layer, head in heads:
            if hook.name == f"blocks.{layer}.attn.hook_z":
                act[:, :, head] = means[hook.name][head]
        return act

    plain = per_position_loss(model, held_out, batch_size=32)
    with model.hooks(fwd_hooks=[(n, ablate) for n in names]):
        ablated = per_position_loss(model, held_out, batch_size=32)
    return ablated, plain


def load_average():
    """The 1-minute load average (None where the platform has none): the machine's other work, beside a time."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def run_induction_heads(exp, ctx):
    started, cpu_started, load_start = time.time(), time.process_time(), load_average()
    settings = resolved_settings((exp.quick_overrides if ctx.quick else []) + list(ctx.overrides))
    t, e = settings["train"], settings["eval"]
    train_ids, val_ids, vocab, described = corpus(settings["data"])
    held_out = windows(val_ids, e["windows"], e["context"] + 1, np.random.default_rng(t["seed"] + 2))
    data = (train_ids, held_out, len(vocab))
    two, two_history = train_model(2, t["steps"], settings, data, ctx.quiet)
    one, one_history = train_model(1, t["one_layer_steps"], settings, data, ctx.quiet)
    final = np.array(two_history[-1]["induction"])
    heads = induction_heads_of(final)
    ablated, plain = ablation(two, held_out, heads) if heads else (None, per_position_loss(two, held_out, 32))
    index, step = phase_change(two_history)
    figures = {
        "in_context_score_before": two_history[index]["in_context_score"],
        "in_context_score_after": two_history[-1]["in_context_score"],
        "one_layer_in_context_score_after": one_history[-1]["in_context_score"],
        "in_context_score_after_se": two_history[-1]["in_context_score_se"],
        "one_layer_in_context_score_after_se": one_history[-1]["in_context_score_se"],
        "induction_score_max": float(final.max()),
        # the first half of the circuit: the best previous-token head of layer 0 (0.05 or so at random)
        "previous_token_score_max": float(np.max(two_history[-1]["previous_token"][0])),
        "one_layer_induction_score_max": float(np.max(one_history[-1]["induction"])),
        "loss_after": two_history[-1]["loss"], "one_layer_loss_after": one_history[-1]["loss"],
    }
    if heads:                            # with no induction head no phase change to place, nothing to ablate
        figures["phase_change_step"] = step
        late = slice(e["late_from"], e["context"])
        figures["ablation_loss_increase"] = float(np.mean(ablated[late] - plain[late]))
        figures["ablated_in_context_score"] = in_context(ablated, e)
    figures["in_context_score_rise"] = figures["in_context_score_after"] - figures["in_context_score_before"]
    figures["in_context_score_gap"] = figures["in_context_score_after"] - figures["one_layer_in_context_score_after"]
    paths = draw_figures(Path(ctx.results_dir) / "figures", two_history, one_history, ablated, plain, heads, e,
                         two, step)
    record = {
        "name": exp.name, "description": exp.description, "figures": figures,
        "targets": {tg.metric: tg.text() for tg in exp.targets},
        "met": {tg.metric: tg.met(figures) for tg in exp.targets},
        "induction_heads": [list(h) for h in heads], "settings": settings,
        "history": {"two_layers": two_history, "one_layer": one_history},
        "per_position_loss": {"two_layers": plain.round(4).tolist(),
                              "ablated": None if ablated is None else ablated.round(4).tolist()},
        "steps": t["steps"] + t["one_layer_steps"], "stopped_early": False, "wall_time_s": round(time.time() - started, 1),
        "cpu_time_s": round(time.process_time() - cpu_started, 1),
        "load_average": {"start": load_start, "end": load_average()},
        "time_limit_minutes": exp.time_limit_minutes, "seed": t["seed"], "commit": git_commit(),
        "date": datetime.date.today().isoformat(), "machine": machine_info(),
        "command": f"numformer reproduce {exp.name}" + (" --quick" if ctx.quick else "")
                   + "".join(f" --set {o}" for o in ctx.overrides),
        "task": f"{described}, {len(train_ids):,} for training; "
                f"{e['windows']} held-out windows of {e['context'] + 1} from the last 10%",
    }
    if ctx.quick:
        record["quick_overrides"] = list(exp.quick_overrides)
    return record, markdown(record, paths, ctx.results_dir)


# -- figures and the page ----------------------------------------------------------------------------------------
def draw_figures(folder, two_history, one_history, ablated, plain, heads, e, model, step):
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    fig = new_figure(9.0, 3.4)
    left, right = fig.subplots(1, 2)
    for history, label, style in ((two_history, "2 layers", "-"), (one_history, "1 layer", "--")):
        steps = [h["step"] for h in history]
        score = np.array([h["in_context_score"] for h in history])
        se = np.array([h["in_context_score_se"] for h in history])
        line, = left.plot(steps, score, style, marker=".", label=label)
        left.fill_between(steps, score - se, score + se, color=line.get_color(), alpha=0.2, lw=0)   # ± 1 s.e.
        induction = np.array([h["induction"] for h in history])              # (evals, L, H)
        for layer in range(induction.shape[1]):
            for head in range(induction.shape[2]):
                right.plot(steps, induction[:, layer, head], style, lw=1.0,
                           label=f"{label}: head {layer}.{head}" if len(heads) < 12 else None)
    for ax in (left, right):
        if heads:                        # a phase change only where an induction head formed
            ax.axvline(step, color="0.5", ls=":", lw=1.0, label="phase change" if ax is left else None)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    start, stop = early_positions(e)
    left.set_ylabel("in-context score (nats)")
    left.set_title(f"loss at {start}-{stop - 1} minus loss at {e['late_from']}-{e['context'] - 1}, held-out text\n"
                   "(band: ± 1 standard error over the windows)", fontsize=9)
    left.legend(fontsize=7)
    right.set_ylabel("induction score (prefix matching)")
    right.set_ylim(-0.02, 1.02)
    right.set_title("every head's induction score", fontsize=9)
    right.legend(fontsize=6, ncol=2)
    paths["curves"] = folder / "induction_heads_curves.png"
    save_figure(fig, paths["curves"])

    fig = new_figure(6.0, 3.2)
    ax = fig.subplots()
    ax.plot(np.arange(1, len(plain) + 1), plain, lw=1.0, label="2 layers")
    if heads:
        ax.plot(np.arange(1, len(ablated) + 1), ablated, lw=1.0,
                label=f"2 layers, induction heads {', '.join(f'{a}.{b}' for a, b in heads)} mean-ablated")
    ax.set_xlabel("position in the context (tokens seen)")
    ax.set_ylabel("loss (nats), held-out text")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("loss by position: the context helps through the induction heads" if heads else
                 "loss by position (no induction head formed: none ablated)", fontsize=9)
    paths["positions"] = folder / "induction_heads_positions.png"
    save_figure(fig, paths["positions"])

    paths["scores"] = folder / "induction_heads_scores.png"
    plot_layer_head(np.array(two_history[-1]["induction"]), "induction score", paths["scores"],
                    "2-layer model: induction score of each head at the end", vmin=0.0, vmax=1.0)
    paths["pattern"] = folder / "induction_heads_pattern.png"
    final = np.array(two_history[-1]["induction"])
    draw_pattern(model, np.unravel_index(int(np.argmax(final)), final.shape), e, paths["pattern"])
    return paths


def draw_pattern(model, head, e, path):
    """The best induction head's attention on one sequence of repeated random tokens."""
    n = e["score_seq_len"]
    ids = np.random.default_rng(3).integers(0, model.vocab_size, (1, n))
    ids = np.concatenate([ids, ids], axis=1)
    layer, h = head
    _, cache = model.run_with_cache(ids, names_filter=f"blocks.{layer}.attn.hook_pattern")
    fig = new_figure(4.2, 3.8)
    ax = fig.subplots()
    im = ax.imshow(cache["pattern", layer][0, h], cmap="viridis", vmin=0, vmax=1)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    ax.set_title(f"head {layer}.{h} on {n} random tokens repeated:\nthe stripe after the first copy", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    save_figure(fig, path)


def markdown(record, paths, results_dir):
    f, s = record["figures"], record["settings"]
    met, early, heads = record["met"], early_positions(record["settings"]["eval"]), record["induction_heads"]
    rows = ["| figure | value | target | reached |", "|---|---|---|---|"]
    for k, v in f.items():
        rows.append(f"| {k} | {v:.4f} | {record['targets'].get(k, '')} | "
                    f"{'' if met.get(k) is None else ('yes' if met[k] else 'no')} |")
    wall, cpu, load = record["wall_time_s"], record["cpu_time_s"], record["load_average"]
    missed = [k for k, ok in met.items() if ok is False]
    unmeasured = [k for k, ok in met.items() if ok is None]          # no induction head: nothing to ablate
    verdict = "reproduced: every criterion is met" if all(met.values()) else "not reproduced: " + "; ".join(
        [f"{', '.join(missed)} missed"] * bool(missed) + [f"{', '.join(unmeasured)} not measured"] * bool(unmeasured))
    found = ", ".join(f"{a}.{b}" for a, b in heads) or \
        f"none (no head reaches an induction score of {INDUCTION_THRESHOLD}: nothing to ablate)"
    lines = [
        f"# {record['name']}" + (" (quick run)" if "quick_overrides" in record else ""), "", record["description"],
        "", f"Produced by `{record['command']}` on {record['date']} (commit {record['commit']}, "
        f"{record['machine']['cpu']}, {record['machine']['cores']} cores); wall time {wall:.0f} s ({wall / 60:.1f} min, "
        f"limit {record['time_limit_minutes']:g} min), CPU time {cpu:.0f} s (all threads), load average "
        f"{load['start']} at the start and {load['end']} at the end. Data: {record['task']}.", "",
        f"Models: attention-only GPTs, d_model {s['model']['d_model']}, {s['model']['n_heads']} heads, "
        f"{s['model']['positional']} positions, context {s['eval']['context']}; AdamW lr {s['train']['lr']:g} "
        f"(warm-up {s['train']['warmup_steps']}, cosine to {s['train']['min_lr']:g}), batch "
        f"{s['train']['batch_size']}, {s['train']['steps']} steps (2 layers) and {s['train']['one_layer_steps']} "
        f"(1 layer), seed {record['seed']}.", "",
        f"Verdict: {verdict}. " + (f"Phase change (steepest rise of the best induction score) at step "
                                   f"{f['phase_change_step']:.0f}; " if heads else
                                   "No phase change to place (no induction head formed); ")
        + f"induction heads (score at least {INDUCTION_THRESHOLD} and half the best): {found}.", "",
        *rows, "",
        f"in-context score = the mean loss at positions {early[0]} to "
        f"{early[1] - 1} minus the mean loss at positions {s['eval']['late_from']} to "
        f"{s['eval']['context'] - 1} of the held-out windows (its _se: the standard error over the windows); "
        "in_context_score_rise = after - before (the score at the evaluation where the steepest rise starts); "
        "in_context_score_gap = the 2-layer model's final score minus the 1-layer model's.", "",
    ]
    captions = {"curves": "In-context score and every head's induction score through training"
                          + (" (dotted: the phase change)" if heads else ""),
                "positions": "Loss at each position of held-out windows"
                             + (", with and without the induction heads" if heads else ""),
                "scores": "Induction score of each head of the 2-layer model",
                "pattern": "The head with the best induction score, on repeated random tokens"}
    for key, caption in captions.items():
        rel = os.path.relpath(paths[key], results_dir)
        lines += [f"**{caption}**", "", f"![{caption}]({rel})", ""]
    return "\n".join(lines)


register(Experiment(
    "induction_heads",
    "The induction-head phase change (Olsson et al. 2022): attention-only Transformers of 1 and 2 layers on tiny "
    "Shakespeare (byte-level BPE tokens, or characters); the in-context score and every head's induction score "
    "through training, and the in-context gain erased by ablating the induction heads.",
    targets=[Target("in_context_score_rise", 0.1), Target("in_context_score_gap", 0.1),
             Target("induction_score_max", 0.5), Target("ablation_loss_increase", 0.1)],
    quick_overrides=QUICK, time_limit_minutes=15, custom=run_induction_heads,
    run_dirs=lambda exp, ctx: []))      # the models train in memory: no run folder is written
