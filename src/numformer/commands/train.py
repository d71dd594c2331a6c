"""numformer train CONFIG --out RUN_DIR [--set section.key=value ...] [--overwrite] [--quiet], or
numformer train --out RUN_DIR --resume [--set section.key=value ...] [--quiet] (the run's own config.json).

Under ``mpiexec -n N`` (or ``srun``) the N processes train one model together (``numformer.train.mpi``)."""
from __future__ import annotations

import os
import sys


def _build(args, world=None):
    from ..config import load_config
    from ..train import Trainer

    if args.config is None and not args.resume:
        raise ValueError("give a CONFIG.toml (or --resume to continue the run in --out)")
    if args.resume and args.config is not None:
        raise ValueError(f"--resume continues the run in {args.out} with its own config.json; leave out CONFIG "
                         f"({args.config}) and change values with --set")
    if args.resume and args.overwrite:
        raise ValueError("--resume continues the run, --overwrite replaces it: give one of them")
    config = None if args.resume else load_config(args.config)
    return Trainer(config, args.out, resume=args.resume, overwrite=args.overwrite,
                   overrides=args.set + _env_overrides(world), quiet=args.quiet, world=world)


def _env_overrides(world=None):
    """The --set items of the environment variable NUMFORMER_TRAIN_SET (space-separated, applied after the
    command's own): the tests shorten documented commands with it. Announced, so it never acts unseen."""
    items = os.environ.get("NUMFORMER_TRAIN_SET", "").split()
    if items and (world is None or world.is_writer):
        print(f"numformer train: NUMFORMER_TRAIN_SET adds --set {' --set '.join(items)}", file=sys.stderr)
    return items


def run(args):
    from ..train.launch import launch

    return launch(lambda world: _build(args, world))


def register(sub):
    p = sub.add_parser("train", help="train a model from a TOML config into a run folder "
                                     "(under mpiexec -n N: on N ranks, data-parallel)")
    p.add_argument("config", nargs="?", help="TOML config with [model], [data] and [train] (not needed with --resume)")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run folder to write (or to resume)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=3e-4 (repeatable)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in RUN_DIR from its checkpoint with its own config.json (give no CONFIG; "
                        "--set changes values)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in RUN_DIR")
    p.add_argument("--quiet", action="store_true", help="no progress bar or messages")
    p.set_defaults(func=run)
