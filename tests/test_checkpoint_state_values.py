"""Every number a checkpoint's trainer or optimizer state holds is checked when --resume reads it (issue 36: a
damaged Muon lr_ratio resumed with a negative learning rate). Each number is replaced in turn by NaN, infinity
and -1: the resume is refused with one line naming the checkpoint, or (for a value that may be negative) it
trains with finite losses and learning rates >= 0."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from numformer.train import Trainer
from numformer.run_files import CHECKPOINT

safetensors_numpy = pytest.importorskip("safetensors.numpy")

CONFIG = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
          "data": {"task": "copy", "length": 4, "n_val": 8, "n_test": 8},
          "train": {"max_steps": 3, "batch_size": 4, "eval_every": 3, "log_every": 1, "processes": 1,
                    "optimizer": "muon", "early_stopping_patience": 5, "budget_minutes": 10.0}}


def numbers(tree, path=()):
    """The paths of every number (not a bool) in a JSON tree."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from numbers(v, path + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from numbers(v, path + (i,))
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield path


def replaced(tree, path, value):
    tree = json.loads(json.dumps(tree))
    node = tree
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return tree


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    run = tmp_path_factory.mktemp("run") / "r"
    Trainer(CONFIG, run, quiet=True).train()
    from safetensors import safe_open

    with safe_open(str(run / CHECKPOINT), framework="np") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return run, tensors, meta


def _leaves():
    """(part, path) of every number of a checkpoint of CONFIG, found on a run made here once."""
    import tempfile
    from pathlib import Path

    from safetensors import safe_open

    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "r"
        Trainer(CONFIG, run, quiet=True).train()
        with safe_open(str(run / CHECKPOINT), framework="np") as f:
            meta = f.metadata()
    return [(part, path) for part in ("state", "optimizer") for path in numbers(json.loads(meta[part]))]


LEAVES = _leaves()


def test_the_muon_checkpoint_has_the_numbers_of_the_issue():
    paths = {path for part, path in LEAVES if part == "optimizer"}
    assert ("groups", 0, "lr_ratio") in paths and ("adamw", "groups", 0, "eps") in paths
    assert any(path[0] == "budget" for part, path in LEAVES if part == "state")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1])
@pytest.mark.parametrize("part, path", LEAVES, ids=[f"{p}:{'.'.join(map(str, q))}" for p, q in LEAVES])
def test_a_damaged_number_is_refused_naming_the_checkpoint_or_trains_sanely(saved, tmp_path, part, path, bad):
    run, tensors, meta = saved
    value = json.loads(meta[part])
    for p in path[:-1]:
        value = value[p]
    if value[path[-1]] == bad:
        return
    out = tmp_path / "r"
    out.mkdir()
    for name in ("config.json", "tokenizer.json", "metrics.jsonl"):
        if (run / name).exists():
            (out / name).write_bytes((run / name).read_bytes())
    damaged = {**meta, part: json.dumps(replaced(json.loads(meta[part]), path, bad))}
    safetensors_numpy.save_file(tensors, str(out / CHECKPOINT), metadata=damaged)
    try:
        trainer = Trainer(None, out, resume=True, quiet=True, overrides=["train.max_steps=5"])
    except ValueError as e:
        line = str(e)
        assert "\n" not in line and str(out / CHECKPOINT) in line, line
        return
    assert not (isinstance(bad, float) and not math.isfinite(bad)), f"{part} {path} = {bad} was accepted"
    lrs = []
    set_lr = trainer.optimizer.set_lr

    def recorded(lr):
        set_lr(lr)
        lrs.extend(g["lr"] for g in trainer.optimizer.param_groups + trainer.optimizer.adamw.param_groups)
    trainer.optimizer.set_lr = recorded
    summary = trainer.train()
    trainer.close()
    assert lrs and all(lr >= 0 and math.isfinite(lr) for lr in lrs), (part, path, lrs)
    assert np.isfinite(summary["best_val_loss"])
