"""The run folders an experiment trains into: each new, reused after a check, or replaced only with --overwrite.

Before an experiment trains anything, ``reproduce`` checks every run folder it is going to write
(``runner.planned_runs``): a folder that holds anything is refused in one line naming it (and, for a run
that could have been reused, why it is not) unless ``--overwrite`` was given. Training then goes through
``start_run`` only, which checks the same rule again.

A run is reused (the ablation's rows, the seed study's seeds) only when its folder holds, readable and
well-formed, a config.json equal to the resolved config wanted, and a summary.json saying that the run
finished and was trained by this very code: the same git commit, or one whose src/ and configs/ are the same
(``provenance.same_source``), with no uncommitted changes on either side (``provenance.git_commit``; outside a
git checkout nothing is reused). ``--overwrite`` reuses nothing.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .._limits import NUMBER, check_record, read_json_file
from ..config import config_changes
from .._platform import LOCK_FILE
from ..train import Trainer
from ..provenance import same_source
from ..run_files import CHECKPOINT

# What a reused run's summary.json must hold (train/trainer.py writes more).
SUMMARY = {"steps": int, "best_val_loss": (NUMBER, type(None)), "tokens_seen": int, "tokens_per_s": NUMBER,
           "train_seconds": NUMBER, "parameters": int, "stopped_by": str, "interrupted": bool,
           "commit": (str, type(None)), "budget_seconds?": NUMBER, "budget_used_seconds?": NUMBER}
UNFINISHED = ("interrupted", "time limit", "diverged")        # stopped_by values of a run that did not finish


def holds_anything(folder):
    """Whether ``folder`` exists and holds any entry (the Windows lock file aside)."""
    folder = Path(folder)
    if not folder.is_dir():
        return os.path.lexists(folder)
    return any(entry.name != LOCK_FILE for entry in folder.iterdir())


def start_run(ctx, config, run_dir, overrides=(), resume=False):
    """The Trainer of a run of the experiment in ``run_dir``: a new run (the folder must be new or empty, or
    ``ctx.overwrite``), or ``resume`` the run a ``reusable_run`` check found there. The trainer is added to
    ``ctx.trainers``: ``runner.run_experiment`` releases their folders' locks when the experiment ends."""
    if resume:
        trainer = Trainer(None, run_dir, resume=True, quiet=ctx.quiet)
    elif holds_anything(run_dir) and not ctx.overwrite:
        raise ValueError(f"{run_dir} already holds files; give --overwrite to replace them, or --runs DIR for "
                         f"another folder")
    else:
        trainer = Trainer(config, run_dir, overwrite=ctx.overwrite, overrides=list(overrides), quiet=ctx.quiet)
    ctx.trainers.append(trainer)
    return trainer


def read_summary(run_dir):
    """A run's summary.json, checked against ``SUMMARY``; ValueError naming the file and the key."""
    path = Path(run_dir) / "summary.json"
    return check_record(read_json_file(path, "summary"), SUMMARY, f"summary {path}")


def read_run_config(run_dir):
    """A run's config.json as saved (an object); ValueError naming the file."""
    path = Path(run_dir) / "config.json"
    return check_record(read_json_file(path, "config file"), {"model": dict, "data": dict, "train": dict},
                        f"config file {path}")


def config_difference(saved, wanted, limit=3):
    """'section.key saved -> wanted, ...' for the keys whose values differ (the first ``limit``)."""
    diffs = [name if name.startswith("[") else f"{name} {a!r} -> {b!r}" for name, a, b in config_changes(saved, wanted)]
    return ", ".join(diffs[:limit]) + (f" and {len(diffs) - limit} more" if len(diffs) > limit else "")


def same_code(trained_by, commit):
    """None when a run trained by commit ``trained_by`` may be reused by code at ``commit``, else why not."""
    if commit is None:
        return "this numformer is not a git checkout, so no earlier run can be shown to come from the same code"
    if commit.endswith("+dirty"):
        return (f"this code has uncommitted changes (commit {commit}), so no earlier run can be shown to come "
                f"from the same code")
    if trained_by is None:
        return f"its summary.json records no commit, so it cannot be shown to come from this commit {commit}"
    if trained_by != commit and not same_source(trained_by, commit):
        return f"it was trained by commit {trained_by}, whose src/ or configs/ differ from this commit {commit}"
    return None


def reusable_run(run_dir, resolved, commit, resumable=False, same_commit=True):
    """(summary, None) when ``run_dir`` holds a run that may be reused in place of training ``resolved`` (the
    resolved config wanted) at ``commit``; (None, why not) when it holds anything else; (None, None) when it is
    new or empty. The run must have finished, or with ``resumable``, have a checkpoint to continue from.
    ``same_commit=False`` (a run the user names, used as it is) leaves the commit out of the check."""
    run_dir = Path(run_dir)
    if not holds_anything(run_dir):
        return None, None
    for name in ("config.json", "summary.json"):
        if not (run_dir / name).is_file():
            return None, f"it has no {name}, so its run cannot be checked"
    try:
        saved, summary = read_run_config(run_dir), read_summary(run_dir)
    except ValueError as e:
        return None, str(e)
    wanted = json.loads(json.dumps(resolved))
    if saved != wanted:
        return None, f"its config.json differs from the config wanted ({config_difference(saved, wanted)})"
    mixed = summary.get("commits")
    why = same_code(summary["commit"], commit) if same_commit else None
    if same_commit and not why and isinstance(mixed, list) and any(same_code(c, commit) for c in set(mixed)):
        why = f"it was trained by more than one version of numformer (commits {', '.join(map(str, mixed))})"
    if why:
        return None, why
    if resumable:
        if summary["stopped_by"] == "diverged" or not (run_dir / CHECKPOINT).is_file():
            return None, f"its run cannot be resumed (stopped by {summary['stopped_by']}, checkpoint " \
                         f"{'present' if (run_dir / CHECKPOINT).is_file() else 'missing'})"
    elif summary["interrupted"] or summary["stopped_by"] in UNFINISHED or summary["best_val_loss"] is None:
        return None, f"its run did not finish (stopped by {summary['stopped_by']})"
    return summary, None


def refuse_taken(taken):
    """One ValueError line naming the folders (with why each is not reused) that only --overwrite may replace."""
    shown = [f"{folder} (not reused: {why})" if why else str(folder) for folder, why in taken[:3]]
    more = f" and {len(taken) - 3} more" if len(taken) > 3 else ""
    one = len(taken) == 1
    raise ValueError(f"{'; '.join(shown)}{more} already hold{'s' if one else ''} a run (or other files); give "
                     f"--overwrite to replace {'it' if one else 'them'} (training again), or --runs DIR for another "
                     f"folder")
