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


def with_seeds():
    """The names of the experiments that take ``--seeds N`` (a seed study, or seeds trained by their own code)."""
    load_all()
    return sorted(name for name, exp in EXPERIMENTS.items() if exp.seed_study is not None or exp.seeds_in_custom)


def resolve(name):
    """The experiments a name stands for (a group or one experiment)."""
    load_all()
    if name in GROUPS:
        return [EXPERIMENTS[n] for n in GROUPS[name]]
    if name in EXPERIMENTS:
        return [EXPERIMENTS[name]]
    raise ValueError(f"unknown experiment {name!r}; choose one of {sorted(EXPERIMENTS)} or a group {sorted(GROUPS)}")


__all__ = ["EXPERIMENTS", "GROUPS", "Context", "Experiment", "Target", "register", "resolve", "run_experiment"]
