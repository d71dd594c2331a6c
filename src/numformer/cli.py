"""The ``numformer`` command.

Each sub-command lives in its own module under ``numformer.commands`` and
defines ``register(subparsers)``, which adds its parser and sets ``func``.
Modules are imported when the CLI starts, so keep their top-level imports light
(import NumPy-heavy code inside the command's function).
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from . import commands


def build_parser():
    parser = argparse.ArgumentParser(prog="numformer",
                                     description="A complete Transformer library in NumPy.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "bench":  # bench sets up (and compares) the runtime modes itself
        from numformer._runtime import set_fast_runtime
        set_fast_runtime()
    try:
        result = args.func(args)
    except ValueError as e:
        print(f"numformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0 if result is None else int(result)


if __name__ == "__main__":
    sys.exit(main())
