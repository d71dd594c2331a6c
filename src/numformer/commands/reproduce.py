"""numformer reproduce NAME: run an experiment end to end and write results/NAME.{json,md}.

Like ``numformer train``, it refuses to replace an existing run folder unless
given ``--overwrite``; ``--quick`` runs go to runs/quick (and results/quick), so
a quick check never touches a full run.
"""
from __future__ import annotations

from pathlib import Path


def run(args):
    from ..experiments import Context, resolve, run_experiment
    from ..train.run_folder import run_files

    experiments = resolve(args.name)
    results = Path(args.results) if args.results else Path("results") / ("quick" if args.quick else "")
    runs = Path(args.runs) if args.runs else Path("runs") / ("quick" if args.quick else "")
    if not args.overwrite:          # every run folder this command writes, checked before the first one starts
        taken = [str(runs / exp.name) for exp in experiments if run_files(runs / exp.name)]
        if taken:
            raise ValueError(f"{', '.join(taken)} already hold{'s' if len(taken) == 1 else ''} a run; give "
                             f"--overwrite to replace {'it' if len(taken) == 1 else 'them'}, or --runs DIR for "
                             f"another folder")
    ctx = Context(runs_dir=runs, results_dir=results, quick=args.quick, overrides=args.set, quiet=args.quiet,
                  overwrite=args.overwrite, seeds=args.seeds)
    for exp in experiments:
        record = run_experiment(exp, ctx)
        figures = ", ".join(f"{k} {v:.4f}" for k, v in record["figures"].items() if isinstance(v, float))
        print(f"{exp.name}: {figures}; wall time {record['wall_time_s'] / 60:.1f} min -> {results / exp.name}.md")


def _names():
    from ..experiments import EXPERIMENTS, GROUPS, load_all

    load_all()
    groups = "; ".join(f"{g}: {', '.join(names)}" for g, names in sorted(GROUPS.items()))
    return f"an experiment ({', '.join(sorted(EXPERIMENTS))}) or a group ({groups})"


def register(sub):
    p = sub.add_parser("reproduce", help="run an experiment end to end and write results/NAME.json and NAME.md")
    p.add_argument("name", help=_names())
    p.add_argument("--quick", action="store_true",
                   help="a tiny version that runs in seconds (runs go to runs/quick and results to results/quick "
                        "unless --runs / --results)")
    p.add_argument("--results", default=None, help="folder for the results (default results/)")
    p.add_argument("--runs", default=None, help="folder for the run folders (default runs/)")
    p.add_argument("--overwrite", action="store_true", help="replace existing run folders of these experiments")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value")
    p.add_argument("--seeds", type=int, default=0, metavar="N",
                   help="train the experiment with N seeds and report their spread (shakespeare_char, shakespeare_char_llama, shakespeare_speedrun, shakespeare_speedrun_ablation)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)
