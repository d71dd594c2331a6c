"""numformer params CONFIG|RUN_DIR [--set section.key=value ...] [--depth N]: parameter count of a config's
(or a run's) model, by component.

The sizes a config's data decides (vocabulary, classes, context) are taken from the [data] config
without reading the data where the task can tell them (``Task.sizes_from_config``: the built-in
datasets and tiny Shakespeare); a vocabulary built from the data is counted at its configured cap.
Only a task that needs its data to tell (a user's text file or classification file) reads it.
A run folder's config.json holds the exact sizes: nothing is read but that file.

The model is counted as training builds it: with a [lora] section, its adapters are in the table (under
their Hugging Face names, e.g. blocks.0.self_attn.q_proj) and in the total, listed again by target name
after it, and the trainable count (the adapters alone, the base frozen) follows the total.
"""
from __future__ import annotations

from pathlib import Path


def _model_config(source, overrides):
    """(model config, [lora] section or None, a line saying where the data's sizes came from, or "")."""
    from ..config import apply_overrides, check_sections, load_config, resolve_config, resolve_lora
    from ..models import check_model_section

    if Path(source).is_dir():
        from ..config import load_config_json

        if overrides:
            raise ValueError("--set applies to a TOML config, not to a run folder (its config.json is the run's)")
        saved = load_config_json(source)
        return saved["model"], saved.get("lora"), ""
    config = apply_overrides(load_config(source), overrides)
    check_sections(config)
    if "data" not in config:
        lora = resolve_lora(config["lora"]) if "lora" in config else None
        return check_model_section(config.get("model", {})), lora, ""
    resolved, task = resolve_config(config, sizes_only=True)
    lora = resolved.get("lora")
    if task is not None:
        return resolved["model"], lora, f"sizes from the {resolved['data']['task']} task's data"
    if "init_from" in resolved["model"]:
        return (resolved["model"], lora,
                f"the architecture of init_from = {resolved['model']['init_from']!r}, no data read")
    capped = [k for k in ("vocab_size", "src_vocab_size", "tgt_vocab_size") if k in resolved["model"]]
    note = "sizes from the [data] config, no data read"
    if capped and resolved["data"].get("task") != "text":
        note += (f"; {', '.join(capped)} = [data] vocab_size, the most the tokenizer holds (the vocabulary built "
                 f"from the data can be smaller: `numformer params RUN_DIR` counts a trained run exactly)")
    return resolved["model"], lora, note


def _after_total(model):
    """The rows after the total, (label, count, note): the LoRA adapters by target name, each over every layer
    it adapts (their parameters are in the table and the total already), then the trainable count when some
    parameters are frozen."""
    from ..lora import lora_adapters

    rows = []
    if getattr(model, "lora_config", None):
        groups = {}
        for prefix, adapter, _, _ in lora_adapters(model):
            name = ".".join(prefix.split(".")[-2:])             # self_attn.q_proj, ff.c_proj
            n, layers = groups.get(name, (0, 0))
            groups[name] = (n + adapter.lora_A.size + adapter.lora_B.size, layers + 1)
        r, alpha = model.lora_config["r"], model.lora_config["alpha"]
        rows.append((f"LoRA adapters (r = {r}, alpha = {alpha:g})", sum(n for n, _ in groups.values()), ""))
        rows += [(f"  {name} ({layers} layer{'s' if layers > 1 else ''})", n, "")
                 for name, (n, layers) in groups.items()]
    total = model.num_parameters()
    trainable = sum(p.size for p in model.parameters() if p.requires_grad)
    if trainable < total:
        what = "the adapters; the base frozen" if getattr(model, "lora_config", None) else "the rest frozen"
        rows.append(("trainable", trainable, f"  ({trainable / total:.2%} of the total: {what})"))
    return rows


def run(args):
    from ..lora import add_lora
    from ..models import build_model, format_parameter_report

    if args.depth < 1:
        raise ValueError(f"--depth must be at least 1 (the model's top-level modules), got {args.depth}")
    model_config, lora, note = _model_config(args.config, args.set)
    model = build_model({k: v for k, v in model_config.items() if k != "init_from"})
    if lora:                                    # as training builds it (train.build.build_trained_model)
        add_lora(model, **lora, rng=0)
    print(f"{type(model).__name__} from {args.config}")
    if note:
        print(f"({note})")
    table = format_parameter_report(model, depth=args.depth).splitlines()   # label column, then 14 for counts
    extra = _after_total(model)
    width = max([len(table[-1]) - 14] + [len(label) + 2 for label, _, _ in extra])
    for line in table:
        print(f"{line[:-14].rstrip():<{width}}{line[-14:]}")
    for label, n, note in extra:
        print(f"{label:<{width}}{n:>14,}{note}")


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
