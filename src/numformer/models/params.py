"""Parameter counts broken down by component."""
from __future__ import annotations

from collections import OrderedDict


def parameter_counts(model):
    """{module path: number of parameters under it} for every module ("" is the whole model).

    A tied parameter is counted once, under the first name it is reached by.
    """
    counts = OrderedDict((name, 0) for name, _ in model.named_modules())
    for name, p in model.named_parameters():
        parts = name.split(".")[:-1]
        for i in range(len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in counts:
                counts[prefix] += p.size
    return counts


def parameter_report(model, depth=2):
    """(rows, total): rows (path, count) down to ``depth`` levels, plus the sub-modules of the first layer of
    each stack (components without parameters left out), and the model's total.

    The first layer's breakdown (attention, feed-forward, norms) is what the
    per-layer counts of the textbook exercises are about; the other layers repeat it.
    """
    counts = parameter_counts(model)
    rows = []
    for path, n in counts.items():
        if not path:
            continue
        parts = path.split(".")
        first_layer = any(parts[i].isdigit() and parts[i] == "0" for i in range(len(parts)))
        if len(parts) <= depth or (first_layer and n and len(parts) <= depth + 2):
            if n:
                rows.append((path, n))
    return rows, counts[""]


def format_parameter_report(model, depth=2):
    """A text table of parameter_report, each row indented by its nesting, with the total."""
    rows, total = parameter_report(model, depth)
    width = max([len(p) + 2 * p.count(".") for p, _ in rows] + [len("component")]) + 2  # generous bound
    lines = [f"{'component':<{width}}{'parameters':>14}"]
    for path, n in rows:
        parts = path.split(".")
        name = ".".join(parts[-2:]) if parts[-1].isdigit() else parts[-1]   # "layers.0", "self_attn"
        label = "  " * (len(parts) - 1) + name
        lines.append(f"{label:<{width}}{n:>14,}")
    lines.append(f"{'total':<{width}}{total:>14,}")
    return "\n".join(lines)
