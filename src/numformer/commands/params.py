"""numformer params CONFIG: parameter count of a config's model, by component."""
from __future__ import annotations


def run(args):
    from ..config import apply_overrides, check_model_section, load_config, resolve_config
    from ..models import build_model, format_parameter_report

    config = apply_overrides(load_config(args.config), args.set)
    if "data" in config:          # sizes fixed by the data (vocabulary, classes, context) come from the task
        model_config = resolve_config(config)[0]["model"]
    else:
        model_config = check_model_section(config.get("model", {}))
    model = build_model(model_config)
    print(f"{type(model).__name__} from {args.config}")
    print(format_parameter_report(model, depth=args.depth))


def register(sub):
    p = sub.add_parser("params", help="parameter count of a config's model, broken down by component")
    p.add_argument("config", help="TOML config with a [model] section (and [data] for the sizes it sets)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value")
    p.add_argument("--depth", type=int, default=2, help="levels of modules to list (default 2)")
    p.set_defaults(func=run)
