"""Language models on byte-level BPE, measured in bits per byte.

    numformer reproduce imdb_lm                   # a BPE GPT on the IMDB reviews, 30 minutes on 2 cores
    numformer reproduce shakespeare_tokenizers    # tiny Shakespeare: characters against BPE of 3 sizes

``imdb_lm`` trains ``configs/imdb_lm.toml`` under its time budget and records the learning curve, the loss
and bits per byte of the saved weights on the whole validation split (held-out training reviews; the test
reviews are never read), and samples. It is the starting point of the chat fine-tuning (issue 40).

``shakespeare_tokenizers`` trains the speedrun's recipe (``configs/shakespeare_speedrun.toml``, 10 minutes of
wall time each, everything included) once on characters and once per BPE vocabulary size, on the same text
split, and compares them in bits per byte: a loss per token cannot compare tokenizers, a loss per byte of
the same validation text can. The recipe is kept as it is, so every model sees ``block_size`` tokens: a BPE
model's context holds more text, and its embedding and output layers are larger.
"""
from __future__ import annotations

import datetime
import math
import time
from pathlib import Path

from ..analysis import plot_loss_curves, plot_runs_against_time, read_metrics
from ..config import load_config
from ..decoding import generate
from ..provenance import git_commit, machine_info
from . import register
from ._runs import start_run
from .runner import Experiment, find_config, page_head

IMDB_PROMPTS = ("This movie", "I have to say that", "The acting was")
SAMPLE_TOKENS = 120
BPE_SIZES = (512, 1024, 2048)
COMPARISON = "shakespeare_tokenizers"
QUICK_MODEL = ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.n_kv_heads=1", "model.d_ff=64",
               "data.block_size=32", "train.batch_size=8", "train.eval_every=20", "train.log_every=5",
               "train.warmup_steps=5"]


def budgeted_run(ctx, config, run_dir, overrides):
    """Train ``config`` with ``overrides`` under its time budget into ``run_dir`` (new, empty, or replaced with
    --overwrite); returns (trainer, figures)."""
    started = time.perf_counter()
    trainer = start_run(ctx, config, run_dir, overrides)
    s = trainer.train()
    task = trainer.task
    val_bytes = int(task.token_bytes()[task.splits["val"][:]].sum())
    figures = {"val_loss": s["best_val_loss"], "val_bpb": s.get("best_val_bpb"), "steps": s["steps"],
               "tokens_seen": s["tokens_seen"], "tokens_per_s": s["tokens_per_s"], "parameters": s["parameters"],
               "train_seconds": s["train_seconds"],
               "vocab_size": task.tokenizer.vocab_size, "train_tokens": len(task.splits["train"]),
               "val_tokens": len(task.splits["val"]), "val_bytes": val_bytes,
               "bytes_per_token": val_bytes / len(task.splits["val"]),
               "budget_seconds": s.get("budget_seconds"), "wall_seconds": round(time.perf_counter() - started, 1),
               "run_dir": str(run_dir)}
    return trainer, figures


def _record(exp, ctx, **fields):
    command = f"numformer reproduce {exp.name}" + (" --quick" if ctx.quick else "") + \
        "".join(f" --set {o}" for o in ctx.overrides)
    return {"name": exp.name, "description": exp.description, "command": command, "commit": git_commit(),
            "date": datetime.date.today().isoformat(), "machine": machine_info(), **fields}


def samples(trainer, prompts, n_tokens=SAMPLE_TOKENS):
    """{prompt: its continuation by the trained model (seed 0, temperature 0.8, top-k 50), cut at the end of
    the document}."""
    tok, model = trainer.task.tokenizer, trainer.model.eval()
    out = {}
    for prompt in prompts:
        ids = generate(model, tok.encode(prompt), n_tokens, temperature=0.8, top_k=50, rng=0)
        out[prompt] = tok.decode(ids).split("<|endoftext|>")[0]
    return out


# -- imdb_lm --------------------------------------------------------------------------------------------------
def run_imdb_lm(exp, ctx):
    config = load_config(find_config(exp.name))
    overrides = (list(exp.quick_overrides) if ctx.quick else []) + list(ctx.overrides)
    run_dir = ctx.runs_dir / exp.name
    trainer, figures = budgeted_run(ctx, config, run_dir, overrides)
    task = trainer.task
    figures["epochs"] = figures["tokens_seen"] / figures["train_tokens"]
    figs = ctx.results_dir / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    curve = figs / f"{exp.name}_loss.png"
    if (run_dir / "metrics.jsonl").is_file():            # a budget spent before the first step logs nothing
        plot_loss_curves(read_metrics(run_dir / "metrics.jsonl"), path=curve, title=f"{exp.name}: learning curve")
    record = _record(exp, ctx, figures=figures, targets={}, met={}, config=trainer.config,
                     task=task.describe(), samples=samples(trainer, IMDB_PROMPTS), wall_time_s=figures["wall_seconds"],
                     steps=figures["steps"], seed=trainer.config["train"]["seed"],
                     best_val_loss=figures["val_loss"], curve=curve.name if curve.is_file() else None)
    if ctx.quick:
        record["quick_overrides"] = list(exp.quick_overrides)
    return record, imdb_markdown(record)


def imdb_markdown(r):
    f, t = r["figures"], r["config"]["train"]
    run = Path(f["run_dir"]).as_posix()
    lines = page_head(r, f"Data: {r['task']}.")
    lines += [
        f"**Bits per byte {f['val_bpb']:.4f}** on the whole validation split ({f['val_bytes']:,} bytes of "
        f"held-out training reviews; loss {f['val_loss']:.4f} nats per token, {f['bytes_per_token']:.2f} bytes "
        f"per token) after {_spent(t['budget_minutes'], t['max_steps'])}.", "",
        "| figure | value |", "|---|---|",
        *[f"| {k} | {_fmt(f[k])} |" for k in ("val_bpb", "val_loss", "parameters", "vocab_size", "steps",
                                             "tokens_seen", "epochs", "tokens_per_s", "train_tokens",
                                             "val_tokens", "wall_seconds")], "",
        f"The test reviews were not read: `numformer eval {run}` prints the same validation figures.", "",
        "## Samples", "",
        f"`numformer generate {run} --prompt PROMPT --max-new-tokens {SAMPLE_TOKENS} --temperature 0.8 "
        f"--top-k 50 --seed 0`, cut at the end of the review:", ""]
    for prompt, text in r["samples"].items():
        lines += ["```text", text.strip(), "```", ""]
    if r["curve"]:
        lines += ["**Learning curve**", "", f"![Learning curve](figures/{r['curve']})", ""]
    return "\n".join(lines)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:,.4f}" if abs(v) < 10 else f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


# -- characters against BPE on tiny Shakespeare ----------------------------------------------------------------
def comparison_rows(quick):
    """(label, run folder name, --set overrides) of each tokenizer compared."""
    sizes = (300,) if quick else BPE_SIZES
    return [("characters", "char", ["data.tokenizer=char"])] + [
        (f"BPE {n:,}", f"bpe_{n}", ["data.tokenizer=bpe", f"data.vocab_size={n}"]) for n in sizes]


def comparison_runs(exp, ctx):
    """[((label, name, overrides), (seed, run folder))] of every run the comparison trains, in order."""
    return [(row, (seed, ctx.runs_dir / exp.name / f"{row[1]}_seed_{seed}"))
            for row in comparison_rows(ctx.quick) for seed in range(ctx.seeds or 1)]


def run_comparison(exp, ctx):
    config = load_config(find_config("shakespeare_speedrun"))
    quick = QUICK_MODEL + ["train.budget_minutes=0.05"] if ctx.quick else []
    seeds = list(range(ctx.seeds or 1))
    rows, started = [], time.perf_counter()
    for (label, _, overrides), (seed, run_dir) in comparison_runs(exp, ctx):
        trainer, figures = budgeted_run(ctx, config, run_dir, overrides + quick + list(ctx.overrides)
                                        + [f"train.seed={seed}"])
        rows.append({"tokenizer": label, "seed": seed, **figures, **epochs_and_lowest_estimate(figures)})
    figs = ctx.results_dir / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    plot_runs_against_time({f"{r['tokenizer']} (seed {r['seed']})": curve_with_final_score(r) for r in rows},
                           "val_bpb", figs / f"{exp.name}.png", ylabel="validation bits per byte",
                           title="tiny Shakespeare: characters against byte-level BPE")
    best = min(rows, key=lambda r: r["val_bpb"])
    record = _record(exp, ctx, figures={"best_val_bpb": best["val_bpb"], "char_val_bpb": rows[0]["val_bpb"]},
                     targets={}, met={}, rows=rows, seeds=seeds, best=best["tokenizer"],
                     budget_minutes=rows[0]["budget_seconds"] / 60 if rows[0]["budget_seconds"] else None,
                     wall_time_s=round(time.perf_counter() - started, 1), config=trainer.config)
    if ctx.quick:
        record["quick_overrides"] = quick
    return record, comparison_markdown(record)


def epochs_and_lowest_estimate(figures):
    """The passes over the training tokens a run made, and the lowest of its periodic validation estimates
    (bits per byte) with its step: the recipe measures its last weights, so a run whose last figure lies above
    its lowest estimate was over-fitting its training tokens when it stopped."""
    path = Path(figures["run_dir"]) / "metrics.jsonl"
    estimates = [r for r in (read_metrics(path) if path.is_file() else []) if "val_bpb_estimate" in r]
    lowest = min(estimates, key=lambda r: r["val_bpb_estimate"], default=None)
    return {"epochs": figures["tokens_seen"] / figures["train_tokens"],
            "lowest_val_bpb_estimate": lowest and lowest["val_bpb_estimate"],
            "lowest_estimate_step": lowest and lowest["step"]}


def curve_with_final_score(row):
    """A run's metrics records, and the whole-split bits per byte of its saved weights at its last step."""
    path = Path(row["run_dir"]) / "metrics.jsonl"
    records = read_metrics(path) if path.is_file() else []
    return records + [{"step": row["steps"], "elapsed_s": row["train_seconds"]},
                      {"step": row["steps"], "val_bpb": row["val_bpb"]}]


def _spent(budget_minutes, max_steps):
    """What a run was given: its wall-time budget, or (budget 0 or unset) its steps."""
    if budget_minutes:
        return f"{budget_minutes:g} minutes of wall time, everything included"
    return f"{max_steps:,} steps" if max_steps else "its step count"


def comparison_markdown(r):
    lines = page_head(r, f"Each run trains `configs/shakespeare_speedrun.toml` with its tokenizer for "
                         f"{_spent(r['budget_minutes'], r.get('max_steps'))} (learning the BPE and "
                         f"encoding the text when they are not cached); the validation text is the same for every "
                         f"row (the last 10% of tiny Shakespeare, {r['rows'][0]['val_bytes']:,} bytes).")
    lines += ["| tokenizer | seed | vocabulary | parameters | steps | tokens/s | bytes per token | epochs | "
              "validation loss (nats per token) | **bits per byte** | lowest periodic estimate (step) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lowest = row.get("lowest_val_bpb_estimate")
        lowest = "" if lowest is None else f"{lowest:.4f} ({row['lowest_estimate_step']:,})"
        lines.append(f"| {row['tokenizer']} | {row['seed']} | {row['vocab_size']:,} | {row['parameters']:,} | "
                     f"{row['steps']:,} | {row['tokens_per_s']:,.0f} | {row['bytes_per_token']:.2f} | "
                     f"{row['epochs']:.1f} | {row['val_loss']:.4f} | "
                     f"**{row['val_bpb']:.4f}** | {lowest} |")
    lines += ["", f"Lowest bits per byte: {r['best']} ({r['figures']['best_val_bpb']:.4f}; characters: "
                  f"{r['figures']['char_val_bpb']:.4f}). Bits per byte = the loss of the whole validation split in "
                  f"bits over its bytes (special tokens left out; `numformer.train.bits_per_byte`); for "
                  f"characters of this ASCII text it is the loss in bits per character, "
                  f"{r['figures']['char_val_bpb'] * math.log(2):.4f} nats.", "",
              "The recipe measures its last weights (no dropout, `restore_best` off), as the speedrun does. A BPE "
              "model has fewer training tokens (the same text in fewer, longer pieces) and passes over them more "
              "often in the same time (epochs); the lowest periodic estimate (on a sample of the validation split) "
              "shows where each run stood at its best: a run whose last figure lies well above it was over-fitting "
              "its training tokens when the budget ended.", "",
              f"![Validation bits per byte against training time](figures/{COMPARISON}.png)", ""]
    return "\n".join(lines)


register(Experiment(
    "imdb_lm", "A byte-level BPE GPT on the IMDB reviews (the training reviews, and the unlabelled ones when the "
    "data has them), trained for 30 minutes on 2 cores; the test reviews are never read.",
    [], time_limit_minutes=30.0,
    quick_overrides=QUICK_MODEL + ["train.budget_minutes=0.1", "data.vocab_size=300", "data.val_size=100",
                                   "data.unlabelled=false"],
    custom=run_imdb_lm, run_dirs=lambda exp, ctx: [(ctx.runs_dir / exp.name, None)], requires=("regex",)),
    group="bpe_lm")
register(Experiment(
    COMPARISON, "Tiny Shakespeare: a character-level model against byte-level BPE of 512, 1,024 and 2,048 tokens, "
    "each trained with the speedrun's recipe for 10 minutes, compared in bits per byte.",
    custom=run_comparison, seeds_in_custom=True,
    run_dirs=lambda exp, ctx: [(run_dir, None) for _, (_, run_dir) in comparison_runs(exp, ctx)],
    requires=("regex",)), group="bpe_lm")
