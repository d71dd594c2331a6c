"""numformer train CONFIG --out RUN_DIR [--set section.key=value ...] [--resume] [--overwrite]."""
from __future__ import annotations



def run(args):
    from ..config import load_config
    from ..train import Trainer

    if args.resume and args.config is not None:
        raise ValueError(f"--resume continues the run in {args.out} with its own config.json; leave out CONFIG "
                         f"({args.config}) and change values with --set")
    if args.resume and args.overwrite:
        raise ValueError("--resume continues the run, --overwrite replaces it: give one of them")
    if args.config is None and not args.resume:
        raise ValueError("give a CONFIG.toml (or --resume to continue the run in --out)")
    config = None if args.resume else load_config(args.config)
    trainer = Trainer(config, args.out, resume=args.resume, overwrite=args.overwrite, overrides=args.set,
                      quiet=args.quiet)
    summary = trainer.train()         # a divergence (TrainingDiverged) is one line from the CLI
    return 130 if summary["interrupted"] else 0


def register(sub):
    p = sub.add_parser("train", help="train a model from a TOML config into a run folder")
    p.add_argument("config", nargs="?", help="TOML config with [model], [data] and [train] (not needed with --resume)")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run folder to write (or to resume)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=3e-4 (repeatable)")
    p.add_argument("--resume", action="store_true", help="continue the run in RUN_DIR from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in RUN_DIR")
    p.add_argument("--quiet", action="store_true", help="no progress bar or messages")
    p.set_defaults(func=run)
