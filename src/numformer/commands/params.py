"""numformer params CONFIG|RUN_DIR [--set section.key=value ...] [--depth N]: parameter count of a config's
(or a run's) model, by component.

The sizes a config's data decides (vocabulary, classes, context) are taken from the [data] config
without reading the data where the task can tell them (``Task.sizes_from_config``: the built-in
datasets and tiny Shakespeare); a vocabulary built from the data is counted at its configured cap.
Only a task that needs its data to tell (a user's text file or classification file) reads it.
A run folder's config.json holds the exact sizes: nothing is read but that file.
"""
from __future__ import annotations

from pathlib import Path


def _model_config(source, overrides):
    """(model config, a line saying where the data's sizes came from, or "")."""
    from ..config import apply_overrides, check_sections, load_config, resolve_config
    from ..models import check_model_section

    if Path(source).is_dir():
        from ..config import load_config_json

        if overrides:
            raise ValueError("--set applies to a TOML config, not to a run folder (its config.json is the run's)")
        return load_config_json(source)["model"], ""
    config = apply_overrides(load_config(source), overrides)
    check_sections(config)
    if "data" not in config:
        return check_model_section(config.get("model", {})), ""
    resolved, task = resolve_config(config, sizes_only=True)
    if task is not None:
        return resolved["model"], f"sizes from the {resolved['data']['task']} task's data"
    if "init_from" in resolved["model"]:
        return resolved["model"], f"the architecture of init_from = {resolved['model']['init_from']!r}, no data read"
    capped = [k for k in ("vocab_size", "src_vocab_size", "tgt_vocab_size") if k in resolved["model"]]
    note = "sizes from the [data] config, no data read"
    if capped and resolved["data"].get("task") != "text":
        note += (f"; {', '.join(capped)} = [data] vocab_size, the most the tokenizer holds (the vocabulary built "
                 f"from the data can be smaller: `numformer params RUN_DIR` counts a trained run exactly)")
    return resolved["model"], note


def run(args):
    from ..models import build_model, format_parameter_report

    if args.depth < 1:
        raise ValueError(f"--depth must be at least 1 (the model's top-level modules), got {args.depth}")
    model_config, note = _model_config(args.config, args.set)
    model = build_model({k: v for k, v in model_config.items() if k != "init_from"})
    print(f"{type(model).__name__} from {args.config}")
    if note:
        print(f"({note})")
    print(format_parameter_report(model, depth=args.depth))


def register(sub):
    p = sub.add_parser("params", help="parameter count of a config's (or a run's) model, broken down by "
                                      "component")
    p.add_argument("config", help="TOML config with a [model] section (and [data] for the sizes it sets), "
                                  "or a run folder")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value, e.g. --set model.n_layers=2 (repeatable; a TOML config only)")
    p.add_argument("--depth", type=int, default=2,
                   help="levels of modules to list (default 2); the first layer of each stack is broken down two "
                        "levels further")
    p.set_defaults(func=run)
