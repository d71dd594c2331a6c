"""The main job as an experiment: ``numformer reproduce shakespeare_char [--seeds N]``.

Trains ``configs/shakespeare_char.toml`` (nanoGPT's CPU configuration, what
``make run`` trains) and records the loss of the saved weights on the whole
validation text, bits per character, the wall time, and a sample continuing
"ROMEO:" (seed 0), next to the learning curve and the attention maps.

With ``--seeds N`` it first trains the same model with seeds 0 .. N-1 and
writes ``results/shakespeare_char_seeds.json`` (``shakespeare_char_llama``, the
Llama-style counterpart registered here too, writes
``shakespeare_char_llama_seeds.json``): each seed's whole-validation loss,
their mean and standard deviation, and the spread of nanoGPT's own estimate
(the mean over 20 random batches of 12 windows) drawn many times on one model.
The page of the main run shows that study whenever the file exists. A seed whose run folder
holds a run of the same config trained by this same code (``_runs.reusable_run``) is resumed, or only scored
again when it finished; any other run there is replaced only with ``--overwrite``, which trains every seed
afresh.
"""
from __future__ import annotations

import datetime
import math
import sys
from pathlib import Path

import numpy as np

from ..config import apply_overrides, load_config, resolve_config
from ..data.base import Batch
from ..decoding import generate
from .._limits import NUMBER
from ..provenance import git_commit, machine_info
from ..run_files import write_json_atomic
from ..train import load_model
from ..train.evaluation import mean_loss
from . import register
from ._runs import reusable_run, start_run
from .runner import Experiment, Target, find_config, read_record

PROMPT = "ROMEO:"
SAMPLE_TOKENS = 300
# the sampling strategies of docs/tutorials/first-gpt.md, which prints their samples (checked against the results)
STRATEGIES = {"greedy": {"greedy": True}, "temperature 0.8": {"temperature": 0.8},
              "temperature 1.5": {"temperature": 1.5}, "top-k 5": {"top_k": 5}, "top-p 0.9": {"top_p": 0.9}}
STRATEGY_TOKENS = 80
SEEDS_FILE = "{name}_seeds.json"          # the seed study of experiment {name}
# nanoGPT's estimate_loss for this configuration: eval_iters = 20 batches of batch_size = 12 random windows
NANOGPT_BATCHES, NANOGPT_BATCH_SIZE, ESTIMATE_DRAWS, QUICK_DRAWS = 20, 12, 100, 4

WHY = ("nanoGPT's `shakespeare_char` CPU configuration: 4 pre-LN layers, 4 heads, d_model 128, context 64, "
       "batch 12, 2000 AdamW steps (lr 1e-3, beta2 0.99, weight decay 0.1), 100 warmup steps then a cosine "
       "down to 1e-4, no dropout, tied embeddings, no biases; the first 90% of the text for training, the "
       "last 10% for validation, as nanoGPT. nanoGPT reports a validation loss of 1.88 for it, estimated on "
       "20 random batches; the figure here is the loss on every character of the validation text.")


WHY_LLAMA = ("the Llama-style counterpart of `shakespeare_char` (`configs/shakespeare_char_llama.toml`): the "
             "same data, width (4 layers, 4 heads, d_model 128), batch, steps, optimizer and schedule, with rotary "
             "positions, RMSNorm, a SwiGLU feed-forward (d_ff 389), 2 key/value heads for 4 query heads and no "
             "biases: 803,584 parameters against 804,096.")


def make_extra(name, why, compare_with=None):
    """The extra step of a character-level LM experiment: bits per character, tokens/s, a sample, which weights
    were saved, the seed study (``{name}_seeds.json``) and, with ``compare_with``, a comparison of both seed
    studies."""
    def extra(trainer, task, ctx):
        figures, md = _sample_and_figures(trainer, task, why)
        write_strategy_samples(trainer.run_dir, task.tokenizer, ctx.results_dir, name, ctx.quick)
        seeds = ctx.results_dir / SEEDS_FILE.format(name=name)
        parts = [md, seeds_markdown(seeds, name, nanogpt=compare_with is None)]
        if compare_with is not None:
            parts.append(comparison_markdown(seeds, ctx.results_dir / SEEDS_FILE.format(name=compare_with), name,
                                             compare_with))
        return figures, "\n".join(parts)
    return extra


def _sample_and_figures(trainer, task, why):
    model = trainer.model.eval()
    summary = trainer.last_summary
    run = Path(trainer.run_dir).as_posix()               # where this run is (runs/NAME unless reproduce --runs)
    loss = summary["best_val_loss"]                      # the saved weights on the whole validation text
    ids = generate(model, task.tokenizer.encode(PROMPT), SAMPLE_TOKENS, temperature=1.0, rng=0)
    sample = task.tokenizer.decode(ids)                  # the prompt and what follows
    figures = {"bits_per_character": loss / math.log(2), "train_tokens_per_s": summary["tokens_per_s"],
               "processes": summary["processes"]}
    md = "\n".join([
        f"Model: {why}", "",
        _selection_text(summary, run), "",
        f"Training ran data-parallel on {summary['processes']} process(es) at {summary['tokens_per_s']:,.0f} "
        f"tokens/s ({summary['train_seconds']:.1f} s of training steps; {summary['wall_seconds']:.1f} s with the "
        f"evaluations and checkpoints).", "",
        f"Sample (`numformer generate {run} --prompt \"{PROMPT}\" --max-new-tokens "
        f"{SAMPLE_TOKENS} --seed 0`):", "", "```text", sample, "```", ""])
    return figures, md


def strategy_samples(run_dir, tokenizer):
    """{strategy: text}: the saved weights continue PROMPT for STRATEGY_TOKENS characters with each strategy of
    STRATEGIES, seed 0 (what "Train your first GPT" runs on its model)."""
    model, prompt = load_model(run_dir), tokenizer.encode(PROMPT)
    return {name: tokenizer.decode(generate(model, prompt, STRATEGY_TOKENS, rng=0, **options))
            for name, options in STRATEGIES.items()}


def write_strategy_samples(run_dir, tokenizer, results_dir, name, quick=False):
    """results/{name}_samples.json: the samples of ``strategy_samples`` of the run's saved weights, with the
    whole-validation loss of those weights (the page that prints the samples is checked against this file)."""
    summary = read_record(run_dir / "summary.json", {"best_val_loss": NUMBER, "best_step": int}, "summary")
    record = {"command": f"numformer reproduce {name}" + (" --quick" if quick else ""), "commit": git_commit(),
              "date": datetime.date.today().isoformat(), "run_dir": str(run_dir),
              "val_loss": summary["best_val_loss"], "step": summary["best_step"], "prompt": PROMPT,
              "new_tokens": STRATEGY_TOKENS, "seed": 0, "strategies": STRATEGIES,
              "samples": strategy_samples(run_dir, tokenizer)}
    results_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(results_dir / f"{name}_samples.json", record)
    return record


def _selection_text(s, run):
    """Which weights were saved and why, from the summary of the run in folder ``run``."""
    how = (f"the periodic evaluations estimate the validation loss on a fixed sample of {s['estimate_examples']:,} "
           f"windows spread over the whole text" if s["selected_on"] == "val_loss_estimate"
           else "the periodic evaluations use the whole validation text")
    if s.get("selected_step") is None:
        return (f"Saved weights: those of the last step ({s['last_step']}), whole-text loss {s['best_val_loss']:.4f}; "
                f"`numformer eval {run}` prints this loss.")
    text = (f"Saved weights: {how}; the step they rank best (step {s['selected_step']}) and the last step "
            f"({s['last_step']}) are then scored on the whole text, and the better is kept: step {s['best_step']}, "
            f"{s['best_val_loss']:.4f}")
    if s.get("selected_step") not in (None, s["last_step"]):
        text += f" (step {s['selected_step']}: {s['selected_val_loss']:.4f}; step {s['last_step']}: " \
                f"{s['last_val_loss']:.4f})"
    return text + f". `numformer eval {run}` prints this loss."


# -- the seed study ---------------------------------------------------------------------------------------------
def _seed_plan(exp, ctx):
    """(raw config, [(seed, run folder, --set overrides, summary of a run to resume or None, why the run there
    is not resumed or None)]) of the seed study."""
    if ctx.seeds < 2:
        raise ValueError(f"--seeds {ctx.seeds}: a spread needs at least 2 seeds")
    config = load_config(find_config(exp.config_name()))
    overrides = (list(exp.quick_overrides) if ctx.quick else []) + list(ctx.overrides)
    commit = git_commit()
    plan = []
    for seed in range(ctx.seeds):
        run_dir = ctx.runs_dir / f"{exp.name}_seeds" / f"seed_{seed}"
        seed_overrides = overrides + [f"train.seed={seed}"]
        resolved = resolve_config(apply_overrides(config, seed_overrides))[0]
        summary, why = (None, None) if ctx.overwrite else reusable_run(run_dir, resolved, commit, resumable=True)
        plan.append((seed, run_dir, seed_overrides, summary, why))
    return config, plan


def seed_study_runs(exp, ctx):
    """The seed study's run folders that will be trained afresh (for ``runner.planned_runs``)."""
    return [(run_dir, why) for _, run_dir, _, summary, why in _seed_plan(exp, ctx)[1] if summary is None]


def seed_study(exp, ctx):
    """Train seeds 0 .. ctx.seeds - 1, score each saved model on the whole validation text, and draw nanoGPT's
    20-batch estimate many times on the first; writes results/NAME_seeds.json (NAME: the experiment's name,
    e.g. shakespeare_char_seeds.json). A seed whose run
    folder holds a run of the same config trained by this code is resumed (a finished one is only scored
    again); see the module's docstring."""
    config, plan = _seed_plan(exp, ctx)
    rows, first = [], None
    for seed, run_dir, seed_overrides, summary, _ in plan:
        if summary is not None and not ctx.quiet:
            print(f"seed {seed}: resuming the run of this config and commit in {run_dir}", file=sys.stderr)
        trainer = start_run(ctx, config, run_dir, seed_overrides, resume=summary is not None)
        s = trainer.train()
        rows.append({"seed": seed, "val_loss": s["best_val_loss"], "step": s["best_step"],
                     "last_val_loss": s["last_val_loss"], "last_step": s["last_step"],
                     "selected_step": s.get("selected_step"), "train_seconds": s["train_seconds"]})
        first = first or trainer
    draws = ESTIMATE_DRAWS if not ctx.quick else QUICK_DRAWS
    estimates = nanogpt_estimates(first.model, first.task, draws, rng=0)
    record = {
        "command": f"numformer reproduce {exp.name} --seeds {ctx.seeds}" + (" --quick" if ctx.quick else ""),
        "commit": git_commit(), "date": datetime.date.today().isoformat(), "machine": machine_info(),
        "config": first.config, "seeds": rows,
        "val_loss": _spread([r["val_loss"] for r in rows]), "last_val_loss": _spread([r["last_val_loss"] for r in rows]),
        "nanogpt_estimate": {"seed": rows[0]["seed"], "whole_val_loss": rows[0]["val_loss"], "draws": draws,
                             "batches": NANOGPT_BATCHES, "batch_size": NANOGPT_BATCH_SIZE,
                             "block_size": first.config["data"]["block_size"], **_spread(estimates),
                             "min": float(np.min(estimates)), "max": float(np.max(estimates)),
                             "at_or_below_1.88": float(np.mean(np.asarray(estimates) <= 1.88))},
    }
    ctx.results_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(ctx.results_dir / SEEDS_FILE.format(name=exp.name), record)
    return record


def nanogpt_estimate(model, task, rng, batches=NANOGPT_BATCHES, batch_size=NANOGPT_BATCH_SIZE):
    """nanoGPT's ``estimate_loss`` on the validation text: the mean loss over ``batches`` batches of
    ``batch_size`` windows starting at random characters (``torch.randint(len(data) - block_size, ...)``)."""
    data, T = task.splits["val"], task.config["block_size"]
    starts = rng.integers(0, len(data) - T, size=(batches, batch_size))
    chars = [data[s[:, None] + np.arange(T + 1)] for s in starts]
    return mean_loss(model, [Batch({"idx": c[:, :-1]}, c[:, 1:]) for c in chars])[0]


def nanogpt_estimates(model, task, draws, rng=0):
    """``draws`` independent nanoGPT estimates of the validation loss of one model."""
    rng = np.random.default_rng(rng)
    return [nanogpt_estimate(model, task, rng) for _ in range(draws)]


def _spread(values):
    v = np.asarray(values, dtype=float)
    return {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if v.size > 1 else 0.0, "n": int(v.size)}


def seeds_markdown(path, name, nanogpt=True):
    """The seed study's section of the page, from results/{name}_seeds.json (or how to make it); with
    ``nanogpt``, what the spread says about nanoGPT's 20-batch estimate."""
    if not path.is_file():
        return (f"No seed study yet: `numformer reproduce {name} --seeds 8` trains 8 seeds and adds "
                f"their spread here ({path.name}).")
    r = _seeds_record(path, name)
    if isinstance(r, str):
        return r
    n, e, v, last = len(r["seeds"]), r["nanogpt_estimate"], r["val_loss"], r["last_val_loss"]
    chars = e["batches"] * e["batch_size"] * e["block_size"]
    rows = [f"| {s['seed']} | {s['step']} | {s['val_loss']:.4f} | {s['last_val_loss']:.4f} |" for s in r["seeds"]]
    return "\n".join([
        f"## {n} seeds: how far apart two measurements of the same model quality are", "",
        f"Produced by `{r['command']}` on {r['date']} (commit {r['commit']}). Each seed trains the model above; "
        f"its losses are on every character of the validation text.", "",
        "| seed | saved step | loss of the saved weights | loss at the last step |", "|---|---|---|---|", *rows, "",
        f"Saved weights: {v['mean']:.4f} ± {v['sd']:.4f} (mean ± sd over {n} seeds); last step: "
        f"{last['mean']:.4f} ± {last['sd']:.4f}.", ""] + ([] if not nanogpt else [
        f"nanoGPT's 1.88 is not a loss on the whole validation text: its `estimate_loss` averages "
        f"{e['batches']} batches of {e['batch_size']} windows of {e['block_size']} characters starting at random "
        f"places ({chars:,} characters), and the README reports that estimate. Drawn {e['draws']} times on the "
        f"seed-{e['seed']} model (whole-text loss {e['whole_val_loss']:.4f}), that estimate has mean "
        f"{e['mean']:.4f} and sd {e['sd']:.4f} (from {e['min']:.4f} to {e['max']:.4f}; "
        f"{100 * e['at_or_below_1.88']:.0f}% of the draws at or below 1.88). " + _verdict(v, e)]))


def comparison_markdown(path, other_path, name, other):
    """Experiment ``name`` against ``other`` over the seeds both studies trained (equal steps and data)."""
    if not (path.is_file() and other_path.is_file()):
        return (f"No comparison yet: it needs `numformer reproduce {name} --seeds N` and "
                f"`numformer reproduce {other} --seeds N`.")
    records = [_seeds_record(p, n) for p, n in ((path, name), (other_path, other))]
    damaged = [r for r in records if isinstance(r, str)]
    if damaged:
        return "\n\n".join(damaged)
    ours, theirs = (r["seeds"] for r in records)
    common = sorted({r["seed"] for r in ours} & {r["seed"] for r in theirs})
    a = _spread([r["val_loss"] for r in ours if r["seed"] in common])
    b = _spread([r["val_loss"] for r in theirs if r["seed"] in common])
    return "\n".join([
        f"## Against `{other}`", "",
        f"Whole-validation-text loss of the saved weights over seeds {', '.join(map(str, common))} (from "
        f"`{path.name}` and `{other_path.name}`; same data, steps and optimizer):", "",
        "| model | mean | sd | seeds |", "|---|---|---|---|",
        f"| {name} | {a['mean']:.4f} | {a['sd']:.4f} | {a['n']} |",
        f"| {other} | {b['mean']:.4f} | {b['sd']:.4f} | {b['n']} |", "",
        f"Difference ({name} − {other}): {a['mean'] - b['mean']:+.4f}."])


SPREAD = {"mean": NUMBER, "sd": NUMBER, "n": int}
SEEDS_RECORD = {   # results/NAME_seeds.json, as seed_study writes it (the fields the pages read)
    "command": str, "date": str, "commit": (str, type(None)), "val_loss": SPREAD, "last_val_loss": SPREAD,
    "seeds": [{"seed": int, "step": (int, type(None)), "val_loss": NUMBER, "last_val_loss": NUMBER}],
    "nanogpt_estimate": {"seed": int, "whole_val_loss": NUMBER, "draws": int, "batches": int, "batch_size": int,
                         "block_size": int, "mean": NUMBER, "sd": NUMBER, "min": NUMBER, "max": NUMBER,
                         "at_or_below_1.88": NUMBER}}


def _seeds_record(path, name):
    """The seed study's record, or the page's line saying it is damaged (and a warning line naming the file
    and the key): the page of a finished run is still written."""
    try:
        return read_record(path, SEEDS_RECORD, "seed study")
    except ValueError as e:
        print(f"warning: {e}", file=sys.stderr)
        return (f"The seed study could not be read: {e}. `numformer reproduce {name} --seeds N` writes it "
                f"again.")


def _verdict(v, e):
    """What the measured spreads say about 1.88 against the mean whole-text loss over seeds."""
    z = (v["mean"] - 1.88) / e["sd"]
    text = (f"One draw scatters by about {e['sd']:.3f} around the whole-text loss and one seed by about "
            f"{v['sd']:.3f}; the seeds' mean whole-text loss {v['mean']:.4f} is {z:.1f} estimate sd above 1.88")
    if abs(z) <= 2.5:
        return text + (", within the scatter of a single 20-batch draw: 1.88 and this figure describe the same "
                       "model quality. Compare whole-text losses, or means over seeds, to tell two trainings apart.")
    return text + ", more than a single draw's scatter explains."


register(Experiment(
    "shakespeare_char", "Character-level GPT on tiny Shakespeare: `make run`'s model (nanoGPT's CPU configuration).",
    # nanoGPT's README figure, 1.88, is its 20-batch estimate; on the whole validation text nanoGPT's own
    # train.py gives 1.907 +- 0.010 over 8 seeds, so the target on this yardstick is that mean + 2 sd.
    [Target("test_loss", 1.93, "<=")],
    quick_overrides=["train.max_steps=12", "train.eval_every=6", "train.checkpoint_every=6", "train.log_every=3",
                     "model.n_layers=1", "data.block_size=16"],
    extra=make_extra("shakespeare_char", WHY), seed_study=seed_study, seed_study_runs=seed_study_runs))

register(Experiment(
    "shakespeare_char_llama", "Character-level Llama-style decoder on tiny Shakespeare, against `make run`'s "
    "GPT-2-style model at the same parameter count.",
    [], quick_overrides=["train.max_steps=12", "train.eval_every=6", "train.checkpoint_every=6",
                         "train.log_every=3", "model.n_layers=1", "data.block_size=16"],
    extra=make_extra("shakespeare_char_llama", WHY_LLAMA, compare_with="shakespeare_char"),
    seed_study=seed_study, seed_study_runs=seed_study_runs))
