"""The tiny-Shakespeare speedrun: the best character-level model 2 cores train in 10 minutes.

    numformer reproduce shakespeare_speedrun --seeds 3        # the recipe at the full budget, 3 seeds
    numformer reproduce shakespeare_speedrun_ablation          # every recipe change, 3 seeds, proxy budget
    numformer reproduce shakespeare_speedrun_torch             # the same budget given to PyTorch
    numformer reproduce shakespeare_speedrun_profile           # where a step's time goes; MFU

``configs/shakespeare_speedrun.toml`` is the recipe. Its ``[train] budget_minutes`` is a wall-clock budget the
trainer enforces (train/budget.py): it covers the setup, the training steps, the periodic evaluations and
checkpoints, and the final loss of the saved weights on the whole validation text; the learning-rate schedule
is planned for the time, not for a step count. Each command writes ``results/<name>.json``; the page
``results/shakespeare_speedrun.md`` gathers all four (whichever exist).

Model FLOPs utilization (MFU) = the model's training operations per second (models/flops.py: 6 per parameter
of every matrix product and 12·T·d per attention layer, per token) over this CPU's measured float32
matrix-product peak on every core (bench/profile.py ``matmul_peak``).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from .._limits import NUMBER
from .._runtime import usable_cores
from ..analysis import plot_loss_curves, read_metrics
from ..bench.profile import matmul_peak, profile_training_step
from ..config import apply_overrides, load_config, resolve_config
from ..decoding import generate
from ..models import build_model
from ..models.flops import training_flops_per_token
from ..provenance import cpu_label, git_commit, machine_info
from ..run_files import write_atomic, write_json_atomic
from . import register
from ._runs import reusable_run, start_run
from .runner import Experiment, Target, find_config, read_record

NAME = "shakespeare_speedrun"
TARGET = 1.50
PROMPT, SAMPLE_TOKENS = "ROMEO:", 300
ABLATION_MINUTES = 2.0        # the proxy budget of the ablation rows
ABLATION_SEEDS = 3

# The nanoGPT CPU recipe (configs/shakespeare_char.toml's model and optimizer), planned for a time budget:
# the first row of the ablation, and the second PyTorch anchor. The evaluation and logging settings are the
# recipe's, so that every row pays the same overheads.
NANOGPT_CPU = {
    "model": {"type": "gpt", "n_layers": 4, "n_heads": 4, "d_model": 128, "dropout": 0.0, "positional": "learned",
              "activation": "gelu", "norm": "layer", "norm_first": True, "tie_weights": True, "bias": False},
    "data": {"task": "text", "block_size": 64},
    "train": {"batch_size": 12, "optimizer": "adamw", "lr": 1e-3, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.1,
              "schedule": "cosine", "warmup_steps": 100, "min_lr": 1e-4, "grad_clip": 1.0, "max_steps": 1000000,
              "eval_every": 500, "eval_batch_size": 64, "eval_batches": 2, "checkpoint_every": 1000000,
              "restore_best": False, "log_every": 50},
}


class Change:
    """A row of the ablation: ``overrides`` (dotted keys, as --set) applied to the last kept row; a change that
    is not ``kept`` is measured against that row and then dropped from the ladder."""

    def __init__(self, text, overrides, kept=True):
        self.text, self.overrides, self.kept = text, overrides, kept


# The ablation, from nanoGPT's CPU recipe to configs/shakespeare_speedrun.toml (the last kept row is the
# recipe: tests/test_speedrun.py checks it).
LADDER = [
    Change("nanoGPT's CPU recipe: GPT-2 style, 4 layers x 128, context 64, batch 12, AdamW 1e-3, cosine to 1e-4",
           {}),
    Change("Llama-style decoder at the same width: RoPE, RMSNorm, SwiGLU (d_ff 344), 2 key/value heads", {
        "model.positional": "rope", "model.norm": "rms", "model.activation": "swiglu", "model.d_ff": 344,
        "model.n_kv_heads": 2}),
    Change("warmup-stable-decay schedule (last 30% of the time decays to 0) at lr 2e-3", {
        "train.schedule": "wsd", "train.cooldown": 0.3, "train.min_lr": 0.0, "train.lr": 2e-3}),
    Change("wider: 6 layers x 192 (6 heads, 3 key/value heads, d_ff 512), context 128, batch 16", {
        "model.n_layers": 6, "model.d_model": 192, "model.n_heads": 6, "model.n_kv_heads": 3, "model.d_ff": 512,
        "data.block_size": 128, "train.batch_size": 16}, kept=False),
    Change("deeper, longer context: 6 layers x 128, context 128", {"model.n_layers": 6, "data.block_size": 128}),
    Change("Muon for the blocks' matrices (muon_lr 0.02, momentum 0.95, no weight decay), AdamW for the rest", {
        "train.optimizer": "muon", "train.weight_decay": 0.0}, kept=False),
    Change("weight decay 0.3 (from 0.1), chosen at the full 10-minute budget", {"train.weight_decay": 0.3}),
    Change("squared-ReLU feed-forward, max(0, x)^2 (d_ff 512, two matrices), in place of SwiGLU", {
        "model.activation": "relu2", "model.d_ff": 512}),
]


def _set(config, dotted, value):
    section, key = dotted.split(".", 1)
    config.setdefault(section, {})[key] = value


def ladder_configs(budget_minutes):
    """[(change, raw config)] of every ablation row, each planned for ``budget_minutes``."""
    kept = json.loads(json.dumps(NANOGPT_CPU))
    _set(kept, "train.budget_minutes", budget_minutes)
    rows = []
    for change in LADDER:
        config = json.loads(json.dumps(kept))
        for k, v in change.overrides.items():
            _set(config, k, v)
        rows.append((change, config))
        if change.kept:
            kept = config
    return rows


def recipe_of_ladder(budget_minutes):
    """The config of the last kept row: the recipe."""
    return [config for change, config in ladder_configs(budget_minutes) if change.kept][-1]


def speedrun_config():
    """The recipe, configs/shakespeare_speedrun.toml, as a raw config."""
    return load_config(find_config(NAME))


# -- one budgeted run and its figures ------------------------------------------------------------------------
def budgeted_run(ctx, config, run_dir, seed, overrides=(), peak=None):
    """Train ``config`` with ``seed`` under its time budget into ``run_dir`` (``_runs.start_run``: new or
    empty, or --overwrite); returns its figures and the trainer."""
    started = time.perf_counter()
    trainer = start_run(ctx, config, run_dir, list(overrides) + [f"train.seed={seed}"])
    s = trainer.train()
    wall = time.perf_counter() - started
    flops = training_flops_per_token(trainer.model, trainer.config["data"]["block_size"])
    row = {**_row(s, seed, round(wall, 2), flops, run_dir), "source": "trained"}
    if peak:
        row["mfu_training_steps"] = flops * s["tokens_per_s"] / peak
        row["mfu_whole_budget"] = flops * s["tokens_seen"] / wall / peak
    return row, trainer


def _row(summary, seed, wall_seconds, flops_per_token, run_dir):
    """A budgeted run's figures, from its summary.json (``_runs.SUMMARY``); ``commit``: the code that trained it."""
    s = summary
    return {"seed": seed, "val_loss": s["best_val_loss"], "steps": s["steps"], "tokens_seen": s["tokens_seen"],
            "tokens_per_s": s["tokens_per_s"], "train_seconds": s["train_seconds"],
            "budget_seconds": s.get("budget_seconds"), "budget_used_seconds": s.get("budget_used_seconds"),
            "wall_seconds": wall_seconds, "parameters": s["parameters"], "flops_per_token": flops_per_token,
            "run_dir": str(run_dir), "commit": s["commit"]}


def spread(values):
    v = np.asarray([x for x in values if x is not None], dtype=float)
    return {"mean": float(v.mean()) if v.size else math.nan,
            "sd": float(v.std(ddof=1)) if v.size > 1 else 0.0, "n": int(v.size)}


def _record(exp, ctx, **fields):
    return {"name": exp.name, "description": exp.description, "command": _command(exp, ctx),
            "commit": git_commit(), "date": datetime.date.today().isoformat(), "machine": machine_info(), **fields}


def _command(exp, ctx):
    parts = [f"numformer reproduce {exp.name}"]
    if ctx.seeds:
        parts.append(f"--seeds {ctx.seeds}")
    if ctx.quick:
        parts.append("--quick")
    parts += [f"--set {o}" for o in ctx.overrides]
    return " ".join(parts)


def _peaks(quick=False):
    """The float32 matrix-product peak on one thread and on every core; ``quick`` (the tests' runs): a
    256-size product for a moment, a rough figure in milliseconds instead of seconds. Every core can do what
    one thread does: a measured all-core rate below the one-thread one (BLAS threads waiting for a core another
    process holds, most often in the short quick measurement) is taken as the one-thread rate, so that the
    MFU is never computed against a peak below what one thread showed."""
    cores = usable_cores()
    size = {"n": 256, "min_seconds": 0.05} if quick else {}
    one_thread = matmul_peak(threads=1, **size)
    return {"cores": cores, "one_thread": one_thread,
            "all_cores": max(matmul_peak(threads=cores, **size), one_thread)}


# -- the experiments -------------------------------------------------------------------------------------------
def _speedrun_dirs(ctx):
    """[(seed, run folder)]: the first seed in runs/NAME, the others in runs/NAME_seeds/seed_K."""
    seeds = list(range(ctx.seeds)) if ctx.seeds else [0]
    return [(seed, ctx.runs_dir / NAME if seed == seeds[0] else ctx.runs_dir / f"{NAME}_seeds" / f"seed_{seed}")
            for seed in seeds]


def run_speedrun(exp, ctx):
    """The recipe at its full budget over ``--seeds`` seeds (default 1); the page gathers the other parts."""
    config = speedrun_config()
    overrides = (list(exp.quick_overrides) if ctx.quick else []) + list(ctx.overrides)
    peaks = _peaks(ctx.quick)
    rows, first = [], None
    for seed, run_dir in _speedrun_dirs(ctx):
        row, trainer = budgeted_run(ctx, config, run_dir, seed, overrides, peaks["all_cores"])
        rows.append(row)
        if first is None:
            first = trainer
            sample = _sample(trainer)
    loss = spread(r["val_loss"] for r in rows)
    figures = {"val_loss": loss["mean"], "val_loss_sd": loss["sd"], "seeds": loss["n"],
               "tokens_per_s": spread(r["tokens_per_s"] for r in rows)["mean"],
               "mfu_training_steps": spread(r["mfu_training_steps"] for r in rows)["mean"],
               "budget_used_seconds_max": max(r["budget_used_seconds"] for r in rows)}
    record = _record(exp, ctx, figures=figures, targets={"val_loss": f"<= {TARGET:g}"},
                     met={"val_loss": figures["val_loss"] <= TARGET}, runs=rows, peaks=peaks,
                     config=first.config, sample=sample, task=first.task.describe(),
                     wall_time_s=round(sum(r["wall_seconds"] for r in rows), 1),
                     best_val_loss=loss["mean"], steps=rows[0]["steps"], seed=rows[0]["seed"])
    if ctx.quick:
        record["quick_overrides"] = list(exp.quick_overrides)
    figs = ctx.results_dir / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    metrics = Path(rows[0]["run_dir"]) / "metrics.jsonl"
    record["curve"] = metrics.is_file()                 # a budget too short for one step logs nothing
    if record["curve"]:
        plot_loss_curves(read_metrics(metrics), path=figs / f"{NAME}_loss.png",
                         title=f"{NAME}: learning curve (seed {rows[0]['seed']})")
    return record, speedrun_markdown(record, saved_parts(ctx.results_dir))


def _sample(trainer):
    ids = generate(trainer.model.eval(), trainer.task.tokenizer.encode(PROMPT), SAMPLE_TOKENS, temperature=1.0,
                   rng=0)
    return trainer.task.tokenizer.decode(ids)


# -- the ablation: its rows, the runs each trains or reuses ----------------------------------------------------
def _ablation_rows(ctx):
    """(seeds, [(row, change, raw config, {seed: resolved config})]) of every LADDER row under ``ctx``."""
    seeds = list(range(ctx.seeds or ABLATION_SEEDS))     # --quick: 2 unless --seeds N (runner.seeds_context)
    minutes = 0.05 if ctx.quick else ABLATION_MINUTES
    rows = []
    for i, (change, config) in enumerate(ladder_configs(minutes)):
        config = apply_overrides(config, (_quick_overrides(config) if ctx.quick else []) + list(ctx.overrides))
        resolved = {seed: resolve_config(apply_overrides(config, [f"train.seed={seed}"]))[0] for seed in seeds}
        rows.append((i, change, config, resolved))
    return seeds, rows


def _ablation_plan(exp, ctx, seeds, rows):
    """{(config key, seed): (run folder, summary of a run to reuse or None, why the run there is not reused)}:
    one entry per distinct config and seed (rows of equal configs share it). Folders are named by the config,
    so that an edited ladder reuses the runs of the rows it did not change (``_runs.reusable_run``)."""
    commit = git_commit()
    plan = {}
    for _, _, _, resolved in rows:
        for seed in seeds:
            key = (_config_key(resolved[seed]), seed)
            if key not in plan:
                run_dir = ctx.runs_dir / exp.name / key[0] / f"seed_{seed}"
                summary, why = (None, None) if ctx.overwrite else reusable_run(run_dir, resolved[seed], commit)
                plan[key] = (run_dir, summary, why)
    return plan


def ablation_run_dirs(exp, ctx):
    """The ablation's run folders that will be trained (for ``runner.planned_runs``)."""
    seeds, rows = _ablation_rows(ctx)
    return [(run_dir, why) for run_dir, summary, why in _ablation_plan(exp, ctx, seeds, rows).values()
            if summary is None]


def run_ablation(exp, ctx):
    """Every row of LADDER over ``--seeds`` seeds (default 3) at the proxy budget; a run of a config and seed
    that an earlier row of this command trained is shared, a finished run of this code is reused."""
    seeds, rows = _ablation_rows(ctx)
    plan = _ablation_plan(exp, ctx, seeds, rows)
    done, records = {}, []
    for i, change, config, resolved in rows:
        runs = []
        for seed in seeds:
            key = (_config_key(resolved[seed]), seed)
            run_dir, summary, _ = plan[key]
            if key in done:
                run = {**done[key], "source": "shared", "shared_with_row": done[key]["row"]}
            elif summary is not None:
                run = {**_reused_row(summary, resolved[seed], seed, run_dir), "row": i}
            else:
                run = {**budgeted_run(ctx, config, run_dir, seed)[0], "row": i}
            done.setdefault(key, run)
            runs.append(run)
        records.append({"row": i, "change": change.text, "kept": change.kept, "config": resolved[seeds[-1]],
                        "val_loss": spread(r["val_loss"] for r in runs), "runs": runs})
    figures = {f"row_{r['row']}_val_loss{k}": r["val_loss"][m] for r in records for k, m in (("", "mean"),
                                                                                               ("_sd", "sd"))}
    budgets = sorted({r["config"]["train"]["budget_minutes"] for r in records})
    record = _record(exp, ctx, figures=figures, targets={}, met={}, rows=records,
                     budget_minutes=budgets[0] if len(budgets) == 1 else budgets, seeds=seeds,
                     wall_time_s=round(sum(r["wall_seconds"] for row in records for r in row["runs"]
                                           if r["source"] == "trained"), 1))
    refresh_speedrun_page(ctx.results_dir, exp.name, record)
    return record, ablation_markdown(record) + "\n"


def _config_key(resolved):
    """A short name of a resolved config without its seed: the folder of its ablation runs."""
    train = {k: v for k, v in resolved["train"].items() if k != "seed"}
    text = json.dumps({**resolved, "train": train}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _reused_row(summary, resolved, seed, run_dir):
    """The figures of a finished run of this config, seed and code, from its (checked) summary.json."""
    model = build_model(dict(resolved["model"]), rng=np.random.default_rng(0))
    flops = training_flops_per_token(model, resolved["data"]["block_size"])
    wall = summary.get("budget_used_seconds", summary["train_seconds"])
    return {**_row(summary, seed, wall, flops, run_dir), "source": "reused"}


def _quick_overrides(config):
    """--quick: a model of one small layer (one key/value head where the row has grouped-query attention)."""
    quick = ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "data.block_size=32",
             "train.batch_size=8"]
    return quick + (["model.n_kv_heads=1"] if "n_kv_heads" in config["model"] else [])


# The profile times this many rounds of 20 steps and reports the median round (bench.profile).
PROFILE_ROUNDS = 5


def run_profile(exp, ctx):
    """Where a training step of the recipe's model goes, and the MFU; appends this commit's profile to the
    earlier ones of results/shakespeare_speedrun_profile.json (replacing an earlier profile of the same commit;
    the first kept is the 'before'). A damaged file is refused before the profile runs: its history would be
    lost."""
    config = speedrun_config()
    if ctx.quick:
        config = apply_overrides(config, ["model.n_layers=1", "model.d_model=32", "model.n_heads=2",
                                          "model.n_kv_heads=1", "model.d_ff=64", "data.block_size=32"])
    config = apply_overrides(config, ctx.overrides)
    path = ctx.results_dir / f"{exp.name}.json"
    earlier = _profile_history(read_record(path, PROFILE_RECORD)) if path.is_file() else []
    started = time.perf_counter()
    peaks = _peaks(ctx.quick)
    cores = peaks["cores"]
    profile = profile_training_step(config, processes=cores, steps=3 if ctx.quick else 20,
                                    rounds=1 if ctx.quick else PROFILE_ROUNDS)
    entry = {"commit": git_commit(), "date": datetime.date.today().isoformat(), "cpu": cpu_label(machine_info()),
             **profile, "mfu_one_worker": profile["flops_per_s"] / peaks["one_thread"], "peaks": peaks}
    history = [e for e in earlier if (e["commit"], e["cpu"]) != (entry["commit"], entry["cpu"])] + [entry]
    record = _record(exp, ctx, figures={"mfu_one_worker": entry["mfu_one_worker"]}, targets={}, met={},
                     profiles=history, wall_time_s=round(time.perf_counter() - started, 1))
    refresh_speedrun_page(ctx.results_dir, exp.name, record)
    return record, profile_markdown(record) + "\n"


def _profile_history(record):
    """The profiles a record keeps, each naming its CPU model ("cpu"); a profile written before they did gets
    the label of the machine the record names (``provenance.cpu_label``: the model marked as not recorded)."""
    label = cpu_label(record.get("machine") or {})
    return [{"cpu": label, **p} for p in record["profiles"]]


def _shown_profiles(profiles):
    """The profiles the page shows: the earliest kept (the 'before'), then the latest on each CPU model."""
    latest = {p.get("cpu"): p for p in profiles}
    return [profiles[0]] + [p for p in latest.values() if p is not profiles[0]]


def run_torch_anchor(exp, ctx):
    """The recipe and nanoGPT's CPU recipe, each trained by PyTorch under the same budget (one seed each)."""
    from . import _torch_anchor          # imports torch and transformers (Experiment.requires)

    seed = 0
    recipe = speedrun_config()
    if ctx.quick:
        recipe = apply_overrides(recipe, list(EXPERIMENTS_QUICK))
    recipe = apply_overrides(recipe, ctx.overrides)
    minutes = recipe["train"]["budget_minutes"]
    nanogpt = json.loads(json.dumps(NANOGPT_CPU))
    _set(nanogpt, "train.budget_minutes", minutes)
    if ctx.quick:
        nanogpt = apply_overrides(nanogpt, ["model.n_layers=1", "model.d_model=32", "model.n_heads=2"])
    runs = {"recipe": _torch_anchor.budgeted_torch_run(recipe, seed),
            "nanogpt_cpu": _torch_anchor.budgeted_torch_run(nanogpt, seed)}
    record = _record(exp, ctx, figures={"recipe_val_loss": runs["recipe"]["val_loss"],
                                        "nanogpt_cpu_val_loss": runs["nanogpt_cpu"]["val_loss"]},
                     targets={}, met={}, runs=runs, budget_minutes=minutes, seed=seed,
                     wall_time_s=round(sum(r["wall_seconds"] for r in runs.values()), 1))
    refresh_speedrun_page(ctx.results_dir, exp.name, record)
    return record, torch_markdown(record) + "\n"


# -- the pages ---------------------------------------------------------------------------------------------------
def refresh_speedrun_page(results_dir, name, record):
    """Write a part's record (results/NAME.json) and, when the speedrun's own record exists, rewrite
    results/shakespeare_speedrun.md from it so that the page shows the new part. Another part's damaged record
    is a warning line naming the file and the key, and the page says so: the new record is kept."""
    results_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(results_dir / f"{name}.json", record)
    parts = saved_parts(results_dir)
    for part, render in PART_PAGES.items():            # every part's page, with this code's wording
        saved, _ = parts[part]
        if saved is not None and part != name:
            write_atomic(results_dir / f"{part}.md", (render(saved) + "\n").encode())
    main, _ = parts[NAME]
    if main is not None:
        write_atomic(results_dir / f"{NAME}.md", speedrun_markdown(main, parts).encode())


def saved_parts(results_dir):
    """{name: (record, None) | (None, why it cannot be shown) | (None, None) when absent} of the four parts'
    records in ``results_dir``, each checked against its schema; one warning line per damaged record."""
    parts = {}
    for name, schema in RECORDS.items():
        path = Path(results_dir) / f"{name}.json"
        try:
            parts[name] = (read_record(path, schema), None) if path.is_file() else (None, None)
        except ValueError as e:
            print(f"warning: {e}", file=sys.stderr)
            parts[name] = (None, f"{e}; `numformer reproduce {name}` writes it again.")
    return parts


def _pm(s):
    return f"{s['mean']:.4f} ± {s['sd']:.4f}"


def speedrun_markdown(record, parts):
    """The speedrun's page: ``record`` and the other parts (``saved_parts``)."""
    rows = record["runs"]
    loss = spread(r["val_loss"] for r in rows)
    t = record["config"]["train"]
    quick = record.get("quick_overrides")
    lines = [f"# {NAME}" + (" (quick run)" if quick is not None else ""), "", record["description"], "",
             f"Produced by `{record['command']}` on {record['date']} (commit {record['commit']}, "
             f"{record['machine']['cores']} cores, {cpu_label(record['machine'])}). Data: {record['task']}.", ""]
    if quick is not None:
        lines += [f"This is the `--quick` check of the pipeline (`{' '.join(quick)}`), not the speedrun.", ""]
    lines += [
        f"**Whole-validation loss {_pm(loss)}** (mean ± sd over {loss['n']} seed(s)) in a budget of "
        f"{t['budget_minutes']:g} minutes of wall time per run; target <= {TARGET:g}: "
        f"{'reached' if loss['mean'] <= TARGET else 'not reached'}.", "",
        "| seed | steps | tokens seen | tokens/s | MFU (training steps) | wall time of the run (s) | "
        "budget used (s) | whole-validation loss |", "|---|---|---|---|---|---|---|---|",
        *[f"| {r['seed']} | {r['steps']:,} | {r['tokens_seen']:,} | {r['tokens_per_s']:,.0f} | "
          f"{100 * r['mfu_training_steps']:.1f}% | {r['wall_seconds']:.1f} | {r['budget_used_seconds']:.1f} | "
          f"{r['val_loss']:.4f} |" for r in rows], "",
        "The wall time of a run is measured by the command around the trainer, from building the model and "
        "the data to the saved weights' whole-validation loss; the budget, which the trainer enforces, counts "
        "the same span. Each run's model has "
        f"{rows[0]['parameters']:,} parameters and costs {rows[0]['flops_per_token'] / 1e6:.1f} MFLOP per "
        f"trained token; the CPU's float32 matrix-product peak measured before the runs: "
        f"{record['peaks']['all_cores'] / 1e9:.1f} GFLOP/s on {record['peaks']['cores']} cores "
        f"({record['peaks']['one_thread'] / 1e9:.1f} on one).", ""]
    lines += ["## The recipe", "", f"`configs/{NAME}.toml`"
              + (" (the quick run changes it as said above)" if quick is not None else "")
              + f"; every resolved key is in `{NAME}.json`:", "", "```toml", _config_text(), "```", ""]
    for name, render in ((f"{NAME}_ablation", ablation_markdown), (f"{NAME}_torch", torch_markdown),
                         (f"{NAME}_profile", profile_markdown)):
        part, damaged = parts[name]
        lines += [render(part, level="##", main=record) if part else f"## {name}\n\n" + (
            damaged or f"Not run yet: `numformer reproduce {name}` writes it."), ""]
    lines += ["## Sample", "", f"`numformer generate runs/{NAME} --prompt \"{PROMPT}\" --max-new-tokens "
              f"{SAMPLE_TOKENS} --seed 0`:", "", "```text", record["sample"], "```", "",
              *(["**Learning curve**", "", f"![Learning curve](figures/{NAME}_loss.png)", ""] if record.get("curve")
                else [])]
    return "\n".join(lines)


def _config_text():
    return find_config(NAME).read_text(encoding="utf-8").strip()


def _beats(a, b):
    """Whether row a's mean differs from row b's by more than twice the standard error of the difference; None
    with fewer than 2 seeds a side (no scatter to compare with)."""
    if a["n"] < 2 or b["n"] < 2:
        return None
    se = math.sqrt(a["sd"] ** 2 / a["n"] + b["sd"] ** 2 / b["n"])
    return abs(a["mean"] - b["mean"]) > 2 * se


def _budget_text(minutes):
    if isinstance(minutes, list):
        return f"proxy budgets of {', '.join(map(str, minutes))} minutes (each row's is in its config)"
    return f"a proxy budget of {minutes:g} minutes"


def ablation_markdown(record, level="#", main=None):
    rows = record["rows"]
    lines = [f"{level} Ablation: every recipe change against the row it changes", "",
             f"Produced by `{record['command']}` on {record['date']} (commit {record['commit']}): each row trains "
             f"{len(record['seeds'])} seeds under {_budget_text(record['budget_minutes'])} of wall "
             f"time (everything included) and scores the whole validation text. A change is 'beyond the scatter' "
             f"when its mean moves by more than twice the standard error of the difference of the two means."
             + _provenance_text(record), "",
             "| row | change | steps | tokens/s | whole-validation loss | vs the row it changes | beyond the scatter |",
             "|---|---|---|---|---|---|---|"]
    base = None
    for row in rows:
        steps = spread(r["steps"] for r in row["runs"])["mean"]
        tps = spread(r["tokens_per_s"] for r in row["runs"])["mean"]
        if base is None:
            delta, beats = "", ""
        else:
            delta = f"{row['val_loss']['mean'] - base['val_loss']['mean']:+.4f} (row {base['row']})"
            better = row["val_loss"]["mean"] < base["val_loss"]["mean"]
            beats = {None: "n/a (one seed)", False: "no", True: "yes, better" if better else "yes, worse"}[
                _beats(row["val_loss"], base["val_loss"])]
        change = row["change"] + ("" if row.get("kept", True) else " (not kept)")
        lines.append(f"| {row['row']} | {change} | {steps:,.0f} | {tps:,.0f} | {_pm(row['val_loss'])} | "
                     f"{delta} | {beats} |")
        if row.get("kept", True):
            base = row
    lines += ["", "Each row changes the last kept row above it; a row marked 'not kept' was measured and dropped, "
                  "and the next row builds on the row before it. The last kept row is the recipe of "
                  "`configs/shakespeare_speedrun.toml` at the proxy budget. A short budget favours the models "
                  "that take the most steps: a change that costs speed for capacity can lose here and win at the "
                  "full budget, so such a change was decided by longer probes (docs/experiments.md, \"The "
                  "tiny-Shakespeare speedrun\"), and the full-budget figures above are the recipe's own."]
    return "\n".join(lines)


def _source(run):
    """trained, reused or shared (records written before the runs said so mark a reused run ``reused``)."""
    return run.get("source") or ("reused" if run.get("reused") else "trained")


def _provenance_text(record):
    """What the rows' runs are: which rows share another row's runs (the same config under this command's
    settings), which reuse an earlier command's runs, and the commits that trained them."""
    text, rows = [], record["rows"]
    shared = {}
    for r in rows:
        if r["runs"] and all(_source(run) == "shared" for run in r["runs"]):
            shared.setdefault(r["runs"][0].get("shared_with_row"), []).append(r["row"])
    for origin, same in shared.items():
        one = len(same) == 1
        text.append(f"{_rows(same)} {'has' if one else 'have'} the same config as row {origin} under this "
                    f"command's settings (its --quick model or --set values leave out {'its' if one else 'their'} "
                    f"change), so {'it shows' if one else 'they show'} row {origin}'s runs, not runs of "
                    f"{'its' if one else 'their'} own.")
    reused = [r["row"] for r in rows if any(_source(run) == "reused" for run in r["runs"])]
    if reused:
        whole = all(_source(run) == "reused" for r in rows if r["row"] in reused for run in r["runs"])
        commits = sorted({str(run["commit"]) for r in rows for run in r["runs"] if "commit" in run
                          and _source(run) == "reused"})
        by = f"at commit {', '.join(commits)}" if commits else "(this record does not say by which commit)"
        text.append(f"{_rows(reused)} {'reuse' if whole else 'reuse some of'} the runs that an earlier "
                    f"`numformer reproduce` of this ablation trained with the same configs and seeds {by}.")
    others = sorted({str(run["commit"]) for r in rows for run in r["runs"] if "commit" in run}
                    - {str(record["commit"])})
    if others:
        text.append(f"Runs trained by another commit than this record's: {', '.join(others)}.")
    return "".join(f" {t}" for t in text)


def _rows(numbers):
    return f"Row {numbers[0]}" if len(numbers) == 1 else f"Rows {', '.join(map(str, numbers))}"


def torch_markdown(record, level="#", main=None):
    runs = record["runs"]
    lines = [f"{level} The PyTorch anchor", "",
             f"Produced by `{record['command']}` on {record['date']} (commit {record['commit']}, "
             f"{cpu_label(record.get('machine') or {})}; PyTorch "
             f"{runs['recipe']['torch']}, {runs['recipe']['threads']} threads): the same {record['budget_minutes']:g}"
             f"-minute budget, enforced the same way (train/budget.py), given to PyTorch eager with the same "
             f"initial weights, batches, optimizer and time-planned schedule; seed {record['seed']}. The recipe "
             f"runs as transformers' model class named below; nanoGPT's CPU recipe as numformer's PyTorch "
             f"reference of its GPT (bench/torch_reference.py).", "",
             "| run | model | steps | tokens/s | wall time (s) | whole-validation loss |", "|---|---|---|---|---|---|"]
    if main is not None:
        ours = {k: spread(r[k] for r in main["runs"]) for k in ("steps", "tokens_per_s", "wall_seconds", "val_loss")}
        lines.append(f"| numformer, the recipe (mean over {ours['val_loss']['n']} seeds) | GPT | "
                     f"{ours['steps']['mean']:,.0f} | {ours['tokens_per_s']['mean']:,.0f} | "
                     f"{ours['wall_seconds']['mean']:.1f} | {_pm(ours['val_loss'])} |")
    for key, label in (("recipe", "PyTorch, the recipe"), ("nanogpt_cpu", "PyTorch, nanoGPT's CPU recipe")):
        r = runs[key]
        lines.append(f"| {label} | {r['model_class']} | {r['steps']:,} | {r['tokens_per_s']:,.0f} | "
                     f"{r['wall_seconds']:.1f} | {r['val_loss']:.4f} |")
    if main is not None:
        lines += [""] + _comparison(ours, runs["recipe"], cpu_label(main.get("machine") or {}),
                                    cpu_label(record.get("machine") or {}))
    return "\n".join(lines)


def _comparison(ours, theirs, our_cpu, their_cpu):
    """The line comparing numformer's runs of the recipe with PyTorch's: drawn only when both ran on one CPU
    model (a budget's steps, and so the loss, depend on the CPU)."""
    if our_cpu != their_cpu:
        return [f"numformer's runs ran on {our_cpu} and PyTorch's on {their_cpu}: in a time budget the loss "
                f"depends on the CPU, so the two are not compared here; `numformer reproduce {NAME}_torch` on "
                f"the CPU of numformer's runs compares them."]
    return [f"numformer's loss minus PyTorch's on the same recipe and budget: "
            f"{ours['val_loss']['mean'] - theirs['val_loss']:+.4f}; tokens/s, numformer over "
            f"PyTorch: {ours['tokens_per_s']['mean'] / theirs['tokens_per_s']:.2f}×."]


SPREAD = {"mean": NUMBER, "sd": NUMBER, "n": int}
# What each part's page reads of its record (the records hold more); a damaged record is refused by these.
SPEEDRUN_RECORD = {
    "description": str, "command": str, "date": str, "commit": (str, type(None)), "task": str, "sample": str,
    "machine": {"cores": int, "cpu": str}, "config": {"train": {"budget_minutes": NUMBER}},
    "peaks": {"cores": int, "one_thread": NUMBER, "all_cores": NUMBER}, "quick_overrides?": [str], "curve?": bool,
    "runs": [{"seed": int, "steps": int, "tokens_seen": int, "tokens_per_s": NUMBER, "mfu_training_steps": NUMBER,
              "wall_seconds": NUMBER, "budget_used_seconds": NUMBER, "val_loss": NUMBER, "parameters": int,
              "flops_per_token": int}, 1]}
ABLATION_RECORD = {
    "command": str, "date": str, "commit": (str, type(None)), "seeds": [int, 1], "budget_minutes": (NUMBER, list),
    "rows": [{"row": int, "change": str, "kept?": bool, "val_loss": SPREAD,
              "runs": [{"steps": int, "tokens_per_s": NUMBER, "source?": str, "reused?": bool,
                        "commit?": (str, type(None)), "shared_with_row?": int}, 1]}, 1]}
TORCH_RUN = {"model_class": str, "steps": int, "tokens_per_s": NUMBER, "wall_seconds": NUMBER, "val_loss": NUMBER,
             "torch": str, "threads": int}
TORCH_RECORD = {"command": str, "date": str, "commit": (str, type(None)), "budget_minutes": NUMBER, "seed": int,
                "runs": {"recipe": TORCH_RUN, "nanogpt_cpu": TORCH_RUN}}
PROFILE_RECORD = {"command": str, "date": str,
                  "profiles": [{"commit": (str, type(None)), "cpu?": str, "families": {"*": NUMBER},
                                "step_seconds": NUMBER, "mfu_one_worker": NUMBER, "processes": int,
                                "batch_share": int}, 1]}


def _rounds_text(profile):
    """How the latest profile was timed: its rounds and the median kept (profiles before rounds: nothing)."""
    rounds = profile.get("round_step_seconds") or []
    if len(rounds) < 2:
        return ""
    spread = ", ".join(f"{1e3 * s:.2f}" for s in rounds)
    return f"; the latest profile timed {len(rounds)} rounds of steps (ms per step {spread}), its median round shown"


def profile_markdown(record, level="#", main=None):
    profiles = _profile_history(record)
    last = profiles[-1]
    shown = _shown_profiles(profiles)
    families = list(dict.fromkeys(f for p in reversed(shown) for f in p["families"]))
    head = "| op family | " + " | ".join(f"ms/step, {p['commit']}, {p['cpu']}" for p in shown) + " |"
    lines = [f"{level} Where a training step's time goes", "",
             f"Produced by `{record['command']}` (latest on {record['date']}): training steps of the recipe's "
             f"model as one of the {last['processes']} data-parallel workers runs them (its share of "
             f"{last['batch_share']} windows, one thread), every op timed{_rounds_text(last)}. The first "
             f"column is the earliest "
             f"profile kept in the file (before the speed work), then the latest on each CPU model.", "",
             head, "|---|" + "---|" * len(shown)]
    for fam in families:
        lines.append(f"| {fam} | " + " | ".join(f"{1e3 * p['families'].get(fam, 0.0):.2f}" for p in shown) + " |")
    lines.append("| **step** | " + " | ".join(f"**{1e3 * p['step_seconds']:.2f}**" for p in shown) + " |")
    lines.append("| MFU of the worker (one thread's peak) | "
                 + " | ".join(f"{100 * p['mfu_one_worker']:.1f}%" for p in shown) + " |")
    return "\n".join(lines)


PART_PAGES = {f"{NAME}_ablation": ablation_markdown, f"{NAME}_torch": torch_markdown,
              f"{NAME}_profile": profile_markdown}
RECORDS = {NAME: SPEEDRUN_RECORD, f"{NAME}_ablation": ABLATION_RECORD, f"{NAME}_torch": TORCH_RECORD,
           f"{NAME}_profile": PROFILE_RECORD}

EXPERIMENTS_QUICK = ("model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.n_kv_heads=1",
                     "model.d_ff=64", "data.block_size=32", "train.batch_size=8", "train.eval_every=20",
                     "train.log_every=5", "train.budget_minutes=0.25")

register(Experiment(
    NAME, "The best character-level model of tiny Shakespeare that 2 CPU cores train in 10 minutes of wall "
    "time, training and the final whole-validation evaluation included.",
    [Target("val_loss", TARGET, "<=")], quick_overrides=list(EXPERIMENTS_QUICK), custom=run_speedrun,
    seeds_in_custom=True, run_dirs=lambda exp, ctx: [(d, None) for _, d in _speedrun_dirs(ctx)]), group="speedrun")
register(Experiment(
    f"{NAME}_ablation", "The speedrun's recipe changes, one at a time, each over 3 seeds at a proxy budget.",
    custom=run_ablation, seeds_in_custom=True, quick_seeds=2, run_dirs=ablation_run_dirs), group="speedrun")
register(Experiment(
    f"{NAME}_torch", "The speedrun's budget given to PyTorch: the same recipe, and nanoGPT's CPU recipe.",
    custom=run_torch_anchor, run_dirs=lambda exp, ctx: [], requires=("torch", "transformers")), group="speedrun")
register(Experiment(
    f"{NAME}_profile", "Where a training step of the speedrun's model spends its time, op family by op family.",
    custom=run_profile, run_dirs=lambda exp, ctx: []), group="speedrun")
