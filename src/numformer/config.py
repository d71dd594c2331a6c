"""Experiment configs: TOML files with [model], [data] and [train] sections, plus --set overrides."""
from __future__ import annotations

import copy
import tomllib
from pathlib import Path


def load_config(path):
    """Read a TOML config into a dict of sections; a clear error for a missing or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config file {path} is not valid TOML: {e}") from None


def parse_value(text):
    """A --set value in TOML syntax (1e-3, true, "gelu", [1, 2]); a bare word is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(config, overrides):
    """Return a copy of config with each "section.key=value" applied."""
    config = copy.deepcopy(config)
    for item in overrides or ():
        if "=" not in item:
            raise ValueError(f"--set expects section.key=value, got {item!r}")
        dotted, value = item.split("=", 1)
        parts = dotted.strip().split(".")
        if len(parts) < 2:
            raise ValueError(f"--set expects section.key=value (for example train.lr=3e-4), got {item!r}")
        node = config
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {dotted}: {p} is not a section")
        node[parts[-1]] = parse_value(value.strip())
    return config
