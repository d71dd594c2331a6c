"""numformer reproduce NAME: run an experiment end to end and write results/NAME.{json,md}."""
from __future__ import annotations

from pathlib import Path


def run(args):
    from ..experiments import Context, resolve, run_experiment

    experiments = resolve(args.name)
    results = Path(args.results) if args.results else Path("results") / ("quick" if args.quick else "")
    ctx = Context(runs_dir=Path(args.runs), results_dir=results, quick=args.quick, overrides=args.set,
                  quiet=args.quiet, seeds=args.seeds)
    for exp in experiments:
        record = run_experiment(exp, ctx)
        figures = ", ".join(f"{k} {v:.4f}" for k, v in record["figures"].items() if isinstance(v, float))
        print(f"{exp.name}: {figures}; wall time {record['wall_time_s'] / 60:.1f} min -> {results / exp.name}.md")


def register(sub):
    p = sub.add_parser("reproduce", help="run an experiment end to end and write results/NAME.json and NAME.md")
    p.add_argument("name", help="an experiment (copy, reversal, parity, addition, sorting, imdb, agnews, multi30k, "
                                "positional) or a group (synthetic: the five synthetic tasks; text: imdb and agnews)")
    p.add_argument("--quick", action="store_true",
                   help="a tiny version that runs in seconds (results go to results/quick unless --results)")
    p.add_argument("--results", default=None, help="folder for the results (default results/)")
    p.add_argument("--runs", default="runs", help="folder for the run folders (default runs/)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value")
    p.add_argument("--seeds", type=int, default=0, metavar="N",
                   help="first train the experiment with N seeds and report their spread (shakespeare_char)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)
