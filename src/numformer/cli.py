"""The ``numformer`` command."""
from __future__ import annotations

import argparse
import sys


def cmd_params(args):
    from .config import apply_overrides, load_config
    from .models import build_model, format_parameter_report

    config = apply_overrides(load_config(args.config), args.set)
    model_cfg = dict(config.get("model", {}))
    model = build_model(model_cfg)
    print(f"{type(model).__name__} from {args.config}")
    print(format_parameter_report(model, depth=args.depth))


def build_parser():
    parser = argparse.ArgumentParser(prog="numformer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("params", help="parameter count of a config's model, broken down by component")
    p.add_argument("config", help="TOML config with a [model] section")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value")
    p.add_argument("--depth", type=int, default=2, help="levels of modules to list (default 2)")
    p.set_defaults(func=cmd_params)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except ValueError as e:
        print(f"numformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
