"""numformer reproduce NAME [--quick] [--runs DIR] [--results DIR] [--overwrite] [--set section.key=value ...]
[--seeds N] [--quiet]: run an experiment end to end and write results/NAME.{json,md}.

Like ``numformer train``, it refuses to replace anything in a run folder it would train into (runs/NAME, and
every per-seed, per-row or baseline folder of the experiment: ``experiments.runner.planned_runs``) unless
given ``--overwrite``, and to write results into a folder that is not numformer's (``numformer._results``);
an ablation row or a seed of a seed study whose earlier run passes the checks of
``experiments._runs.reusable_run`` is reused instead, except with ``--overwrite``, which trains everything
again. ``--quick`` runs go to runs/quick (and results/quick), so a quick check never touches a full run.
"""
from __future__ import annotations

from pathlib import Path


def run(args):
    from ..experiments import Context, resolve, run_experiment
    from ..experiments.runner import check_before_running, check_context

    results = Path(args.results) if args.results else Path("results") / ("quick" if args.quick else "")
    runs = Path(args.runs) if args.runs else Path("runs") / ("quick" if args.quick else "")
    experiments = resolve(args.name)
    least = 2 if any(exp.seed_study is not None for exp in experiments) else 1     # a seed study's spread: 2
    if args.seeds is not None and args.seeds < least:   # 0 is no count of seeds either (left out: the default)
        raise ValueError(f"--seeds {args.seeds}: give " + ("at least 2 seeds (a seed study's spread needs 2)"
                         if least > 1 else "a positive number of seeds") + " or leave it out for the experiment's "
                         "default")
    ctx = Context(runs_dir=runs, results_dir=results, quick=args.quick, overrides=args.set, quiet=args.quiet,
                  overwrite=args.overwrite, seeds=args.seeds or 0)
    check_context(ctx)
    for exp in experiments:         # every folder this command writes, checked before the first one starts
        check_before_running(exp, ctx)
    for exp in experiments:
        record = run_experiment(exp, ctx)
        figures = ", ".join(f"{k} {v:.4f}" for k, v in record["figures"].items() if isinstance(v, float))
        print(f"{exp.name}: {figures}; wall time {record['wall_time_s'] / 60:.1f} min -> {results / exp.name}.md")


def _with_seeds():
    from ..experiments import with_seeds

    return with_seeds()


def _names():
    from ..experiments import EXPERIMENTS, GROUPS, load_all

    load_all()
    groups = "; ".join(f"{g}: {', '.join(names)}" for g, names in sorted(GROUPS.items()))
    return f"an experiment ({', '.join(sorted(EXPERIMENTS))}) or a group ({groups})"


def register(sub):
    p = sub.add_parser("reproduce", help="run an experiment end to end and write results/NAME.json and NAME.md "
                                         "(or into --results)")
    p.add_argument("name", help=_names())
    p.add_argument("--quick", action="store_true",
                   help="a tiny version that runs in seconds (runs go to runs/quick and results to results/quick "
                        "unless --runs / --results)")
    p.add_argument("--results", default=None,
                   help="folder for the results (default results/, or results/quick/ with --quick)")
    p.add_argument("--runs", default=None,
                   help="folder for the run folders (default runs/, or runs/quick/ with --quick)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run folders these experiments train into, training every run again (no earlier "
                        "run is reused); write results into a folder that is not numformer's")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value of every run the experiments train (repeatable)")
    p.add_argument("--seeds", type=int, default=None, metavar="N",
                   help=f"train the experiment with N seeds and report their spread ({', '.join(_with_seeds())})")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)
