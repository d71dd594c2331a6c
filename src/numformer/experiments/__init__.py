"""Reproducible experiments: ``numformer reproduce NAME`` (see ``runner``).

Each module of this package registers its experiments with ``register``;
``GROUPS`` names sets of them (``numformer reproduce synthetic`` runs all five
synthetic tasks).
"""
from __future__ import annotations

import importlib
import pkgutil

from .runner import Context, Experiment, Target, run_experiment

EXPERIMENTS: dict[str, Experiment] = {}
GROUPS: dict[str, list[str]] = {}


def register(experiment, group=None):
    EXPERIMENTS[experiment.name] = experiment
    if group:
        GROUPS.setdefault(group, []).append(experiment.name)
    return experiment


def load_all():
    for info in pkgutil.iter_modules(__path__):
        if info.name != "runner" and not info.name.startswith("_"):     # _modules: helpers (e.g. torch's)
            importlib.import_module(f"{__name__}.{info.name}")


def resolve(name):
    """The experiments a name stands for (a group or one experiment)."""
    load_all()
    if name in GROUPS:
        return [EXPERIMENTS[n] for n in GROUPS[name]]
    if name in EXPERIMENTS:
        return [EXPERIMENTS[name]]
    raise ValueError(f"unknown experiment {name!r}; choose one of {sorted(EXPERIMENTS)} or a group {sorted(GROUPS)}")


__all__ = ["EXPERIMENTS", "GROUPS", "Context", "Experiment", "Target", "register", "resolve", "run_experiment"]
