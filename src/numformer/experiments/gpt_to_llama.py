"""``numformer reproduce gpt_to_llama``: from the GPT-2-style model to the Llama-style one, one change at a time.

``shakespeare_char`` (learned positions, LayerNorm, a GELU feed-forward, one key/value head per query head)
reaches a whole-validation loss of 1.906 over seeds 0-2 and ``shakespeare_char_llama`` (RoPE, RMSNorm, SwiGLU,
grouped-query attention) 1.678, with the same data, width, steps and optimizer. This experiment trains the
rungs between them, each the previous one with one more change (the order of the tutorial "From GPT to Llama
by hand"), over the same seeds, so that each change's share of the difference is measured:

    GPT-2 style  ->  + RMSNorm  ->  + SwiGLU (d_ff 389)  ->  + RoPE  ->  + grouped-query attention (= Llama)

The first rung is ``configs/shakespeare_char.toml`` and the last ``configs/shakespeare_char_llama.toml``, config
for config (tests/test_gpt_to_llama.py). Each run's loss is that of its saved weights on the whole validation
text. Writes results/gpt_to_llama.{json,md}; ``--seeds N`` (default 3) seeds per rung; ``--quick``: a tiny
model, 12 steps, one seed unless ``--seeds N`` is given (``runner.seeds_context``). A run folder that holds a
run of the same rung and seed is resumed (a finished one only scored again), so an interrupted ladder goes on
where it stopped.
"""
from __future__ import annotations

import datetime
import sys
import time

import numpy as np

from ..analysis import new_figure, save_figure
from ..config import apply_overrides, load_config, resolve_config
from ..models import build_model
from ..provenance import git_commit, machine_info
from . import Experiment, register
from ._runs import reusable_run, start_run
from .runner import find_config

BASE = "shakespeare_char"
# (rung, what changes, the overrides of configs/shakespeare_char.toml up to and including this rung)
RUNGS = (
    ("GPT-2 style", "configs/shakespeare_char.toml: learned positions, LayerNorm, GELU, 4 key/value heads", ()),
    ("+ RMSNorm", 'norm = "rms"', ("model.norm=rms",)),
    ("+ SwiGLU", 'activation = "swiglu", d_ff = 389', ("model.activation=swiglu", "model.d_ff=389")),
    ("+ RoPE", 'positional = "rope" (no position table)', ("model.positional=rope",)),
    ("+ grouped-query attention", "n_kv_heads = 2 (= configs/shakespeare_char_llama.toml)", ("model.n_kv_heads=2",)),
)
DEFAULT_SEEDS = 3
QUICK = ["train.max_steps=12", "train.eval_every=6", "train.checkpoint_every=12", "train.log_every=3",
         "train.warmup_steps=2", "model.n_layers=1", "data.block_size=16"]


def rung_overrides(n):
    """The overrides of configs/shakespeare_char.toml that make rung n (0 = the GPT-2-style model)."""
    return [o for _, _, changes in RUNGS[:n + 1] for o in changes]


def rung_config(n, extra=()):
    """The raw config of rung n, with ``extra`` overrides (quick settings, --set) applied last."""
    return apply_overrides(load_config(find_config(BASE)), rung_overrides(n) + list(extra))


def parameters(config):
    resolved, _ = resolve_config(config, sizes_only=True)
    return build_model(resolved["model"], rng=np.random.default_rng(0)).num_parameters()


def _ladder_plan(exp, ctx):
    """[(rung, config, seed, run folder, summary of a run to resume or None, why the run there is not resumed or
    None)]: a folder holding a run of the same config trained by this same code is resumed (an interrupted
    ladder goes on; a finished run is only scored again), unless ``--overwrite``."""
    seeds = ctx.seeds or DEFAULT_SEEDS
    extra = (QUICK if ctx.quick else []) + list(ctx.overrides)
    commit, plan = git_commit(), []
    for n in range(len(RUNGS)):
        config = rung_config(n, extra)
        for seed in range(seeds):
            run_dir = ctx.runs_dir / exp.name / f"rung_{n}_seed_{seed}"
            resolved = resolve_config(apply_overrides(config, [f"train.seed={seed}"]))[0]
            summary, why = (None, None) if ctx.overwrite else reusable_run(run_dir, resolved, commit, resumable=True)
            plan.append((n, config, seed, run_dir, summary, why))
    return plan


def ladder_runs(exp, ctx):
    """The ladder's run folders that will be trained afresh (for ``runner.planned_runs``)."""
    return [(run_dir, why) for _, _, _, run_dir, summary, why in _ladder_plan(exp, ctx) if summary is None]


def run_ladder(exp, ctx):
    """Train every rung with seeds 0 .. N-1; the record holds each run's whole-validation loss and their mean."""
    started, commit = time.time(), git_commit()          # the code that trains, not the one at the end
    seeds = ctx.seeds or DEFAULT_SEEDS
    plan, rungs = _ladder_plan(exp, ctx), []
    for n, (name, change, _) in enumerate(RUNGS):
        losses = []
        for _, config, seed, run_dir, resumable, _ in (step for step in plan if step[0] == n):
            if not ctx.quiet:
                print(f"gpt_to_llama: {name}, seed {seed} -> {run_dir}", file=sys.stderr, flush=True)
            trainer = start_run(ctx, config, run_dir, [f"train.seed={seed}"], resume=resumable is not None)
            summary = trainer.train()
            losses.append({"seed": seed, "val_loss": summary["best_val_loss"], "step": summary["best_step"],
                           "train_seconds": round(summary["train_seconds"], 1)})
        values = np.array([r["val_loss"] for r in losses])
        rungs.append({"rung": name, "change": change, "overrides": rung_overrides(n), "parameters": parameters(config),
                      "runs": losses, "mean": float(values.mean()),
                      "sd": float(values.std(ddof=1)) if len(values) > 1 else 0.0})
    figures = {f"rung_{n}_mean": r["mean"] for n, r in enumerate(rungs)}
    figures |= {f"rung_{n}_step": (rungs[n - 1]["mean"] - r["mean"]) if n else 0.0 for n, r in enumerate(rungs)}
    record = {
        "name": exp.name, "description": exp.description, "figures": figures, "rungs": rungs,
        "targets": {}, "met": {}, "seeds": seeds, "steps": int(config["train"]["max_steps"]), "stopped_early": False,
        "wall_time_s": round(time.time() - started, 1), "time_limit_minutes": None, "commit": commit,
        "date": datetime.date.today().isoformat(), "machine": machine_info(),
        "command": f"numformer reproduce {exp.name}" + (" --quick" if ctx.quick else "")
                   + (f" --seeds {ctx.seeds}" if ctx.seeds else ""),
    }
    plot_ladder(record, ctx.results_dir / "figures" / f"{exp.name}.png")
    return record, markdown(record)


def plot_ladder(record, path):
    """The loss of every rung: each seed a dot, the mean a line."""
    fig = new_figure(7.0, 3.4)
    ax = fig.subplots()
    rungs = record["rungs"]
    x = np.arange(len(rungs))
    for n, r in enumerate(rungs):
        ax.plot([n] * len(r["runs"]), [s["val_loss"] for s in r["runs"]], "o", color="0.6", ms=4,
                label="one seed" if n == 0 else None)
    ax.plot(x, [r["mean"] for r in rungs], "s-", color="tab:blue", label=f"mean over {record['seeds']} seed(s)")
    for n, r in enumerate(rungs):
        ax.annotate(f"{r['mean']:.3f}", (n, r["mean"]), textcoords="offset points", xytext=(6, 6), fontsize=8)
    ax.set_xticks(x, [r["rung"].replace("grouped-query attention", "GQA") for r in rungs], fontsize=8)
    ax.set_ylabel("validation loss (whole text)")
    ax.set_title(f"From GPT to Llama, one change at a time (tiny Shakespeare, {record['steps']:,} steps)",
                 fontsize=10)
    ax.margins(y=0.15)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _sd(rung):
    """The standard deviation over the seeds, or n/a for one seed (no spread to show)."""
    return f"{rung['sd']:.4f}" if len(rung["runs"]) > 1 else "n/a (one seed)"


def markdown(record):
    rows = [f"| {n} | {r['rung']} | {r['change']} | {r['parameters']:,} | {r['mean']:.4f} | {_sd(r)} | "
            f"{_gain(record, n)} |" for n, r in enumerate(record["rungs"])]
    first, last = record["rungs"][0]["mean"], record["rungs"][-1]["mean"]
    seeds = ", ".join(str(r["seed"]) for r in record["rungs"][0]["runs"])
    per_seed = ["| rung | " + " | ".join(f"seed {r['seed']}" for r in record["rungs"][0]["runs"]) + " |",
                "|---|" + "---|" * record["seeds"]]
    per_seed += [f"| {r['rung']} | " + " | ".join(f"{x['val_loss']:.4f}" for x in r["runs"]) + " |"
                 for r in record["rungs"]]
    return "\n".join([
        f"# {record['name']}" + (" (quick run)" if "--quick" in record["command"] else ""), "",
        record["description"], "",
        f"Produced by `{record['command']}` on {record['date']} (commit {record['commit']}, "
        f"{record['machine']['cores']} cores) in {_timing(record)}. Each rung is the one "
        f"above with one more change, trained with seeds {seeds}; the loss is that of the saved weights on the "
        f"whole validation text (mean and sd over the seeds); the last column is what the rung's change gained.",
        "", "| # | rung | change | parameters | loss | sd | gain |", "|---|---|---|---|---|---|---|", *rows, "",
        f"From {first:.4f} to {last:.4f}: {first - last:.4f} in all.", "", "Each seed:", "", *per_seed, "",
        f"![The loss of every rung](figures/{record['name']}.png)", ""])


def _timing(record):
    """The call's wall time, and the runs' own training time where earlier calls trained them (the call then
    resumed them, or only scored a finished run again)."""
    runs = [x for r in record["rungs"] for x in r["runs"]]
    wall, trained = record["wall_time_s"] / 60, sum(x["train_seconds"] for x in runs) / 60
    if trained <= wall:
        return f"{wall:.1f} minutes"
    return (f"{wall:.1f} minutes of this call; the {len(runs)} runs' training took {trained:.0f} minutes in all, "
            f"partly in earlier calls (a run trained before is resumed, or only scored again when it finished)")


def _gain(record, n):
    return "" if n == 0 else f"{record['rungs'][n - 1]['mean'] - record['rungs'][n]['mean']:+.4f}"


register(Experiment(
    "gpt_to_llama",
    "From the GPT-2-style character model to the Llama-style one, one change at a time: RMSNorm, SwiGLU, RoPE, "
    "grouped-query attention.",
    config=BASE, quick_overrides=QUICK, custom=run_ladder, run_dirs=ladder_runs, seeds_in_custom=True, quick_seeds=1))
