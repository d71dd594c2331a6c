"""Running an experiment end to end and writing its results.

``numformer reproduce NAME`` trains ``configs/NAME.toml`` into ``runs/NAME``,
evaluates the weights the run kept (the best-ranked ones, or the last with
``[train] restore_best = false``) on the test split, draws the learning curve and
the attention heatmaps, and writes ``results/NAME.json`` (figures, resolved config,
seed, wall time, commit, machine) and ``results/NAME.md`` (a table and its
figures); ``results/README.md`` is regenerated to index every result. Nothing
in results/ is typed by hand.

Before anything trains, ``check_before_running`` checks every folder the experiment will write: each run
folder (``planned_runs``: runs/NAME, the runs beside it, each seed of a seed study, each row of an ablation)
must be new or empty, or reused after the checks of ``_runs.reusable_run``, unless ``--overwrite``; the
results folder must be new, empty or numformer's (``_results``).
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .._install import require
from .._limits import NUMBER, check_record, read_json_file
from .._results import INDEX_TITLE, check_results_folder
from ..analysis import GROUP_TITLES, attention_maps, plot_attention, plot_loss_curves, read_metrics
from ..config import find_config, load_config  # noqa: F401 (find_config: experiments import it from here)
from ..provenance import machine_info
from ..run_files import write_atomic, write_json_atomic
from ..train import evaluate_loss
from ._runs import holds_anything, refuse_taken, start_run


@dataclass
class Target:
    """A figure to reach: ``metric`` compared with ``value`` (">=" or "<=")."""
    metric: str
    value: float
    op: str = ">="

    def met(self, figures):
        """True or False (a Python bool, for the JSON record; a NumPy figure compares to np.bool_), or None
        when ``figures`` lack the metric."""
        v = figures.get(self.metric)
        if v is None:
            return None
        return bool(v >= self.value if self.op == ">=" else v <= self.value)

    def text(self):
        return f"{self.op} {self.value:g}"


@dataclass
class Experiment:
    """A reproducible experiment: a config, the figures it must reach, and optional extra steps."""
    name: str
    description: str
    targets: list = field(default_factory=list)
    config: str = ""                       # configs/<config>.toml; defaults to the name
    quick_overrides: list = field(default_factory=list)   # --set items for --quick (seconds, for tests)
    time_limit_minutes: float = 0.0        # the experiment's wall-time budget, shown next to its wall time
    extra: Callable | None = None          # extra(trainer, task, ctx) -> (figures dict, markdown)
    attention_groups: tuple = ()           # attention groups to draw, in this order (e.g. ("cross",)); () = all
    custom: Callable | None = None         # replaces the standard pipeline: custom(exp, ctx) -> (record, markdown)
    seed_study: Callable | None = None     # seed_study(exp, ctx): trains ctx.seeds seeds (reproduce --seeds N)
    seeds_in_custom: bool = False          # custom() trains ctx.seeds seeds itself
    # The seeds the --quick version trains when --seeds is left out (0: as without --quick); see
    # ``seeds_context``. An explicit --seeds N is trained in full, --quick or not.
    quick_seeds: int = 0
    # The run folders the experiment trains into, checked before it starts (``planned_runs``): each is
    # (folder, None), or (folder, why an earlier run there cannot be reused); reused folders are left out.
    run_dirs: Callable | None = None       # run_dirs(exp, ctx), for a custom experiment (required)
    extra_runs: tuple = ()                 # run folders under --runs that ``extra`` trains (parity's baseline)
    seed_study_runs: Callable | None = None    # seed_study_runs(exp, ctx): the seed study's
    requires: tuple = ()                   # optional packages it imports (``_install.PROVIDED_BY``'s import names)

    def config_name(self):
        return self.config or self.name


@dataclass
class Context:
    runs_dir: Path
    results_dir: Path
    quick: bool = False
    overrides: list = field(default_factory=list)
    quiet: bool = False
    overwrite: bool = False       # replace existing run folders (else a folder holding a run is an error)
    seeds: int = 0                # reproduce --seeds N: the seed study first, or the seeds custom() trains
    # the Trainers the experiment started (``_runs.start_run``): run_experiment releases their folders' locks
    # at its end (a Trainer left to the garbage collector would hold its folder until a collection, and a later
    # command of the same process could not lock a folder made anew there)
    trainers: list = field(default_factory=list, repr=False)


def seeds_context(exp, ctx):
    """``ctx`` with the number of seeds ``exp`` trains: ``exp.quick_seeds`` for a --quick run without --seeds,
    else ``ctx`` unchanged. The one place a quick run chooses its seeds, so that what an experiment trains and
    records (``ctx.seeds``, its command line) is what the command asked for, never silently fewer."""
    if ctx.quick and not ctx.seeds and exp.quick_seeds:
        return dataclasses.replace(ctx, seeds=exp.quick_seeds)
    return ctx


def planned_runs(exp, ctx):
    """[(folder, why not reused or None)]: every run folder ``exp`` will train into under ``ctx`` (folders it
    will reuse are left out)."""
    ctx = seeds_context(exp, ctx)
    if exp.custom is not None:
        if exp.run_dirs is None:
            raise TypeError(f"experiment {exp.name!r} has a custom pipeline but no run_dirs")
        return exp.run_dirs(exp, ctx)
    planned = [(ctx.runs_dir / name, None) for name in (exp.name, *exp.extra_runs)]
    if ctx.seeds and exp.seed_study_runs is not None:
        planned = exp.seed_study_runs(exp, ctx) + planned
    return planned


def read_record(path, schema, what="results record"):
    """A record numformer wrote (results/*.json), read within the bounds and checked against ``schema``
    (``_limits.check_record``): ValueError naming the file and the key."""
    return check_record(read_json_file(path, what), schema, f"{what} {path}")


def check_context(ctx):
    """One line for a number of seeds that is not a count."""
    if isinstance(ctx.seeds, bool) or not isinstance(ctx.seeds, int) or ctx.seeds < 0:
        raise ValueError(f"--seeds {ctx.seeds}: give a positive number of seeds (or leave it out for the "
                         f"experiment's default)")


def check_before_running(exp, ctx):
    """Refuse, before anything trains, what the experiment would write where it may not (see the module's
    docstring): one line naming each folder; or a package it needs that is not installed."""
    check_context(ctx)
    require(exp.requires, f"numformer reproduce {exp.name}")
    if ctx.seeds and not exp.seeds_in_custom and exp.seed_study is None:
        raise ValueError(f"--seeds: experiment {exp.name!r} takes no seeds (`numformer reproduce --help` names "
                         f"those that do)")
    check_results_folder(ctx.results_dir, "--results", ctx.overwrite)
    taken = [(folder, why) for folder, why in planned_runs(exp, ctx) if holds_anything(folder)]
    if taken and not ctx.overwrite:
        refuse_taken(taken)


def _figure_dir(ctx):
    d = ctx.results_dir / "figures"
    d.mkdir(parents=True, exist_ok=True)
    return d


def attention_figure(model, task, path, title, groups=()):
    """Heatmaps of every layer and head on the task's analysis example; returns [(group, path), ...].

    groups: the attention groups to draw, in order (default: all of the model's)."""
    inputs, labels = task.analysis_example("test")
    maps = attention_maps(model, inputs)
    groups = [g for g in groups if g in maps] or list(maps)
    written = []
    for group in groups:
        q_labels, k_labels = _group_labels(group, labels)
        out = Path(str(path).replace(".png", f"_{group}.png")) if len(maps) > 1 else Path(path)
        plot_attention(maps[group], q_labels, k_labels, path=out,
                       title=f"{title}: {GROUP_TITLES.get(group, group)}")
        written.append((group, out))
    return written


def _group_labels(group, labels):
    if "src" in labels:
        src, tgt = labels["src"], labels["tgt"]
        return {"encoder": (src, src), "decoder": (tgt, tgt), "cross": (tgt, src)}.get(group, (None, None))
    seq = next(iter(labels.values()))
    return seq, seq


def train_and_evaluate(exp, ctx, config_overrides=()):
    """The standard pipeline; returns (record, trainer, task, started), ``started`` the ``time.time()`` at
    which training began."""
    config = load_config(find_config(exp.config_name()))
    overrides = list(config_overrides) + (list(exp.quick_overrides) if ctx.quick else []) + list(ctx.overrides)
    run_dir = ctx.runs_dir / exp.name
    started = time.time()
    trainer = start_run(ctx, config, run_dir, overrides)
    summary = trainer.train()
    model, task = trainer.model.eval(), trainer.task
    t = trainer.config["train"]
    figures = {"test_loss": evaluate_loss(model, task, "test", t["eval_batch_size"] or t["batch_size"])}
    figures.update(task.evaluate(model, "test"))
    record = {
        "name": exp.name, "description": exp.description, "figures": figures,
        "targets": {tg.metric: tg.text() for tg in exp.targets},
        "met": {tg.metric: tg.met(figures) for tg in exp.targets},
        "steps": summary["steps"], "stopped_early": summary["stopped_early"],
        "best_val_loss": summary["best_val_loss"], "train_seconds": summary["train_seconds"],
        "wall_time_s": None, "time_limit_minutes": exp.time_limit_minutes or None,
        "seed": t["seed"], "config": trainer.config, "commit": summary["commit"],
        "date": datetime.date.today().isoformat(), "machine": machine_info(),
        "command": f"numformer reproduce {exp.name}" + (" --quick" if ctx.quick else ""),
        "run_dir": str(run_dir), "task": task.describe(),
    }
    if ctx.quick:
        record["quick_overrides"] = list(exp.quick_overrides)
    return record, trainer, task, started


def run_experiment(exp, ctx):
    """Run one experiment and write results/NAME.{json,md}; returns the record. The run folders' locks are
    released at its end (``Context.trainers``)."""
    try:
        return _run_experiment(exp, ctx)
    finally:
        for trainer in ctx.trainers:
            trainer.close()
        ctx.trainers.clear()


def _run_experiment(exp, ctx):
    check_before_running(exp, ctx)
    ctx = seeds_context(exp, ctx)
    if ctx.seeds and not exp.seeds_in_custom:
        exp.seed_study(exp, ctx)
    if exp.custom is not None:
        record, markdown = exp.custom(exp, ctx)
    else:
        record, trainer, task, started = train_and_evaluate(exp, ctx)
        figs = _figure_dir(ctx)

        images = []
        curve = figs / f"{exp.name}_loss.png"
        plot_loss_curves(read_metrics(Path(record["run_dir"]) / "metrics.jsonl"), path=curve,
                         title=f"{exp.name}: learning curve")
        images.append(("Learning curve", curve))
        for group, path in attention_figure(trainer.model, task, figs / f"{exp.name}_attention.png", exp.name,
                                            exp.attention_groups):
            what = "Attention" if group == "self" else GROUP_TITLES.get(group, group).capitalize()
            images.append((f"{what}: every layer and head on a test example", path))
        extra_md = ""
        if exp.extra is not None:
            extra_figures, extra_md = exp.extra(trainer, task, ctx)
            record["figures"].update(extra_figures)
            record["met"] = {tg.metric: tg.met(record["figures"]) for tg in exp.targets}
        record["wall_time_s"] = round(time.time() - started, 1)
        markdown = standard_markdown(record, images, extra_md, ctx.results_dir)
    ctx.results_dir.mkdir(parents=True, exist_ok=True)

    write_json_atomic(ctx.results_dir / f"{exp.name}.json", record)
    write_atomic(ctx.results_dir / f"{exp.name}.md", markdown.encode())
    write_index(ctx.results_dir)
    return record


def _fmt(v, key=""):
    if isinstance(v, float) and key.endswith("_per_s"):        # a rate: whole units, thousands separated
        return f"{v:,.0f}"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def figures_table(record):
    rows = ["| figure | value | target | reached |", "|---|---|---|---|"]
    for k, v in record["figures"].items():
        if isinstance(v, (dict, list)):
            continue
        target = record["targets"].get(k, "")
        met = record["met"].get(k)
        rows.append(f"| {k} | {_fmt(v, k)} | {target} | {'' if met is None else ('yes' if met else 'no')} |")
    return "\n".join(rows)


def standard_markdown(record, images, extra_md, results_dir):
    limit = record.get("time_limit_minutes")
    wall = record["wall_time_s"]
    quick = record.get("quick_overrides")
    lines = [
        f"# {record['name']}" + (" (quick run)" if quick is not None else ""), "", record["description"], "",
        *([f"This is the `--quick` version, a check of the pipeline in seconds, not the experiment described "
           f"above: its settings differ by `{' '.join(quick) or 'nothing'}`, and its data is described below.", ""]
          if quick is not None else []),
        f"Produced by `{record['command']}` on {record['date']} (commit {record['commit']}, "
        f"{record['machine']['cores']} cores). Data: {record['task']}.", "",
        figures_table(record), "",
        f"Training: {record['steps']} steps in {record['train_seconds']:.0f} s of training; wall time of the whole "
        f"experiment {wall:.0f} s ({wall / 60:.1f} min)"
        + (f", limit {limit:g} min" if limit else "") + (", stopped early" if record["stopped_early"] else "")
        + f". Seed {record['seed']}. The resolved config is in `{record['name']}.json`.", "",
    ]
    if extra_md:
        lines += [extra_md, ""]
    for caption, path in images:
        rel = os.path.relpath(path, results_dir)
        lines += [f"**{caption}**", "", f"![{caption}]({rel})", ""]
    return "\n".join(lines)


def write_index(results_dir):
    """results/README.md: one row per results/*.json, generated."""
    rows = []
    for path in sorted(Path(results_dir).glob("*.json")):
        r = _index_record(path)
        if r is None:
            continue
        heads = [f"{k} {_fmt(r['figures'][k])} ({r['targets'][k]})" for k in r["targets"] if k in r["figures"]]
        wall = r.get("wall_time_s")
        quick = " (quick run)" if r.get("quick_overrides") is not None else ""
        rows.append(f"| [{r['name']}]({r['name']}.md){quick} | {'; '.join(heads) or '-'} | "
                    f"{'' if wall is None else f'{wall / 60:.1f} min'} | {r.get('commit')} | {r.get('date')} |")
    bench = Path(results_dir) / "bench.md"
    lines = [INDEX_TITLE, "",
             "Every file in this folder is written by a command (`numformer reproduce NAME`, "
             "`numformer bench PART`); none is typed by hand. This index is regenerated after each run.", "",
             "| experiment | figures (target) | wall time | commit | date |", "|---|---|---|---|---|", *rows, ""]
    if bench.exists():
        lines += ["Speed and memory benchmarks: [bench.md](bench.md).", ""]
    write_atomic(Path(results_dir) / "README.md", "\n".join(lines).encode())


# The fields of a results/NAME.json the index reads (the experiments write more); other JSON files (bench.json,
# NAME_seeds.json) have no "figures" and are not experiments' records.
INDEX_RECORD = {"name": str, "figures": dict, "targets?": dict, "wall_time_s?": (NUMBER, type(None)),
                "commit?": (str, type(None)), "date?": str, "quick_overrides?": (list, type(None))}


def _index_record(path):
    """The record of results/NAME.json for the index, or None when the file is not an experiment's record; a
    damaged record is left out with one warning line naming the file and the key."""
    try:
        r = check_record(read_json_file(path, "results record"), {}, f"results record {path}")
        if "figures" not in r:           # bench.json, NAME_seeds.json: records of another kind
            return None
        check_record(r, INDEX_RECORD, f"results record {path}")
        if not all(isinstance(v, str) for v in r.setdefault("targets", {}).values()):
            raise ValueError(f"results record {path}: key 'targets' holds a value that is not a string")
    except ValueError as e:
        print(f"warning: {e}; left out of the index", file=sys.stderr)
        return None
    return r


def page_head(r, data):
    """The first lines of a results page: title, description, the command and machine, ``data`` (a sentence),
    and what a quick run is."""
    quick = r.get("quick_overrides")
    lines = [f"# {r['name']}" + (" (quick run)" if quick is not None else ""), "", r["description"], "",
             f"Produced by `{r['command']}` on {r['date']} (commit {r['commit']}, {r['machine']['cores']} cores, "
             f"{r['machine']['cpu']}). {data}", ""]
    if quick is not None:
        lines += [f"This is the `--quick` check of the pipeline (`{' '.join(quick)}`), not the experiment.", ""]
    return lines
