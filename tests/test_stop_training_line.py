"""Every run that stops records a training line for its last step (train/state.py ``LogWindow``:
``log_stop``): at max_steps, and at a stop between two regular lines (early stopping, the time limit,
the time budget, Ctrl-C, ``train(stop_after=...)``) a line marked ``"partial": true`` that averages the steps
since the previous line as the regular lines do. A resumed run (or a further ``train()`` call) drops that line
at its first step and logs the steps again in its next line: the same lines as an uninterrupted run, never two
for one step; a resumed run that takes no step keeps it."""
from __future__ import annotations

import json
import shutil
import signal

import numpy as np
import pytest

from numformer.config import apply_overrides
from numformer.train import Trainer, TrainingDiverged

CONFIG = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
          "data": {"task": "copy", "length": 4, "n_val": 16, "n_test": 16},
          "train": {"max_steps": 12, "batch_size": 4, "eval_every": 3, "checkpoint_every": 100, "log_every": 4,
                    "processes": 1, "dtype": "float64", "lr": 1e-2}}
SAME = ("step", "train_loss", "lr", "grad_norm", "val_loss", "partial")     # not the times: tokens/s, elapsed_s


def config(*overrides):
    return apply_overrides(CONFIG, list(overrides))


def lines(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def training_lines(run):
    return [r for r in lines(run) if "train_loss" in r]


def figures(run):
    """What must match between a resumed and an uninterrupted run: every line's figures but the rates."""
    return [{k: r[k] for k in SAME if k in r} for r in lines(run)]


def per_step(run, *overrides):
    """{step: training line} of the same run with a line at every step (log_every does not change training)."""
    Trainer(config(*overrides, "train.log_every=1"), run, quiet=True).train()
    return {r["step"]: r for r in training_lines(run)}


def expected_line(reference, first, last):
    """The line of ``last`` over steps first..last, from the per-step lines: the mean loss, the last step's
    learning rate and gradient norm."""
    return {"step": last, "train_loss": float(np.mean([reference[s]["train_loss"] for s in range(first, last + 1)])),
            "lr": reference[last]["lr"], "grad_norm": reference[last]["grad_norm"]}


def stop_at(trainer, step, how):
    """Make ``trainer`` stop after update ``step``: Ctrl-C, or the time limit reached, while it takes it."""
    take = trainer.task.train_batch

    def batch(size, rng):
        if trainer.step == step - 1:
            if how == "ctrl-c":
                trainer._on_stop_signal(signal.SIGINT)
            else:
                trainer.train_cfg["max_minutes"] = 1e-9
        return take(size, rng)
    trainer.task.train_batch = batch


def test_the_normal_end_logs_max_steps_over_the_steps_since_the_last_line(tmp_path):
    reference = per_step(tmp_path / "each", "train.max_steps=10")
    Trainer(config("train.max_steps=10"), tmp_path / "run", quiet=True).train()
    got = training_lines(tmp_path / "run")
    assert [r["step"] for r in got] == [1, 4, 8, 10] and not any("partial" in r for r in got)
    assert {k: got[-1][k] for k in ("step", "train_loss", "lr", "grad_norm")} == expected_line(reference, 9, 10)


@pytest.mark.parametrize("how", ["early stopping", "ctrl-c", "time limit", "stop_after"])
def test_a_stop_between_two_lines_logs_its_last_step(tmp_path, how):
    """Stopped after step 7 (early stopping: at the evaluation of step 6), between the lines of steps 4 and 8:
    a partial line for the last step, over the steps since step 4, with the regular lines' fields."""
    early = ("train.early_stopping_patience=1", "train.early_stopping_min_delta=100") if how == "early stopping" else ()
    last = 6 if early else 7
    reference = per_step(tmp_path / "each", *early)
    trainer = Trainer(config(*early), tmp_path / "run", quiet=True)
    if how in ("ctrl-c", "time limit"):
        stop_at(trainer, last, how)
    summary = trainer.train(stop_after=7 if how == "stop_after" else None)
    trainer.close()
    stopped_by = {"early stopping": "stopped early", "ctrl-c": "interrupted", "time limit": "time limit"}
    assert summary["steps"] == last and summary["stopped_by"] == stopped_by.get(how, summary["stopped_by"])
    got = training_lines(tmp_path / "run")
    assert [r["step"] for r in got] == [1, 4, last]
    assert {k: got[-1][k] for k in ("step", "train_loss", "lr", "grad_norm")} == expected_line(reference, 5, last)
    assert got[-1]["partial"] is True and set(got[-1]) == set(got[1]) | {"partial"}
    assert got[-1]["tokens_per_s"] > 0 and got[-1]["elapsed_s"] >= got[1]["elapsed_s"]


@pytest.mark.parametrize("how", ["ctrl-c", "stop_after"])
def test_a_run_resumed_after_a_stop_logs_the_lines_of_an_uninterrupted_run(tmp_path, how):
    """The partial line of step 7 is dropped by the resumed run's first step, whose line at step 8 averages
    steps 5-8 again (the checkpoint keeps them): the lines of a run never stopped, bit for bit."""
    straight, run = tmp_path / "straight", tmp_path / "run"
    Trainer(config(), straight, quiet=True).train()
    trainer = Trainer(config(), run, quiet=True)
    if how == "ctrl-c":
        stop_at(trainer, 7, how)
    trainer.train(stop_after=7 if how == "stop_after" else None)
    trainer.close()
    assert training_lines(run)[-1]["step"] == 7
    Trainer(None, run, resume=True, quiet=True).train()
    assert figures(run) == figures(straight)


def test_a_further_train_call_logs_the_lines_of_an_uninterrupted_run(tmp_path):
    straight, run = tmp_path / "straight", tmp_path / "run"
    Trainer(config(), straight, quiet=True).train()
    trainer = Trainer(config(), run, quiet=True)
    trainer.train(stop_after=7)
    assert training_lines(run)[-1]["step"] == 7
    trainer.train()
    trainer.close()
    assert figures(run) == figures(straight)


def test_a_budgeted_run_logs_its_last_step_and_a_resumed_run_replaces_that_line(tmp_path, fake_clock):
    """Under a time budget (a constant learning rate: the steps do not depend on the clock) the run ends
    between two lines; resumed with its budget spent, it takes no step and keeps that line; resumed with more
    budget, it drops it and logs its own last step over all the steps since step 1's line."""
    budgeted = ("train.max_steps=100000", "train.log_every=100000", "train.eval_every=100000",
                "train.budget_minutes=0.05")
    fake_clock.tick = 0.01
    run = tmp_path / "run"
    first = Trainer(config(*budgeted), run, quiet=True).train()
    stop = first["steps"]
    assert first["stopped_by"] == "time budget" and 3 <= stop < 60
    reference = per_step(tmp_path / "each", "train.max_steps=200", "train.eval_every=100000")
    got = training_lines(run)
    assert [r["step"] for r in got] == [1, stop] and got[-1]["partial"] is True
    assert {k: got[-1][k] for k in ("step", "train_loss", "lr", "grad_norm")} == expected_line(reference, 2, stop)

    spent = tmp_path / "spent"
    shutil.copytree(run, spent)
    assert Trainer(None, spent, resume=True, quiet=True).train()["steps"] == stop       # no step: the budget is spent
    assert lines(spent) == lines(run)

    more = Trainer(None, run, resume=True, overrides=["train.budget_minutes=0.1"], quiet=True).train()
    end = more["steps"]
    assert more["stopped_by"] == "time budget" and stop < end < 200
    got = training_lines(run)
    assert [r["step"] for r in got] == [1, end] and got[-1]["partial"] is True
    assert {k: got[-1][k] for k in ("step", "train_loss", "lr", "grad_norm")} == expected_line(reference, 2, end)


def test_a_diverged_run_logs_its_last_finite_step(tmp_path, monkeypatch):
    """The loss becomes NaN at step 7: the run stops as diverged, its last line logs steps 5-6."""
    reference = per_step(tmp_path / "each")
    trainer = Trainer(config(), tmp_path / "run", quiet=True)
    forward = trainer.model.forward
    monkeypatch.setattr(trainer.model, "forward", lambda idx, **kw: forward(idx, **kw) * (
        np.nan if trainer.step >= 6 and trainer.model.training else 1.0))
    with pytest.raises(TrainingDiverged, match="became nan at step 7"):
        trainer.train()
    trainer.close()
    got = training_lines(tmp_path / "run")
    assert [r["step"] for r in got] == [1, 4, 6] and got[-1]["partial"] is True
    assert {k: got[-1][k] for k in ("step", "train_loss", "lr", "grad_norm")} == expected_line(reference, 5, 6)


def test_tokens_per_second_after_a_resume_counts_the_steps_timed_since(monkeypatch):
    """A window restored from a checkpoint holds the tokens of steps taken before the stop: the first line after
    the resume averages their loss but times only the tokens of its own steps (it divided all of them by the
    time since the resume)."""
    from numformer.train import state

    clock = [100.0]
    monkeypatch.setattr(state.time, "perf_counter", lambda: clock[0])
    window = state.LogWindow(losses=[2.0, 4.0], tokens=1_000)     # restored: two steps, 1,000 tokens, untimed
    window.restart_clock()
    clock[0] += 2.0
    window.add(3.0, 10, 1e-3, 0.5)
    line = window.line(3, 12.0)
    assert line["train_loss"] == 3.0 and line["tokens_per_s"] == 10 / 2.0
    fresh = state.LogWindow()                                    # an uninterrupted window: every token timed
    clock[0] += 4.0
    fresh.add(1.0, 20, 1e-3, 0.5)
    assert fresh.line(4, 16.0)["tokens_per_s"] == 20 / 4.0


def saved_weights(run):
    """model.safetensors's metadata and tensors (as bytes): the file's content, whatever its header's key order."""
    from safetensors import safe_open

    with safe_open(str(run / "model.safetensors"), "np") as f:
        return f.metadata(), {k: f.get_tensor(k).tobytes() for k in f.keys()}


SUMMARY_SAME = ("steps", "best_step", "best_val_loss", "weights", "stopped_early", "stopped_by", "last_step",
                "last_val_loss", "selected_step", "selected_val_loss")


@pytest.mark.parametrize("crashed", [False, True])
def test_resuming_a_run_that_stopped_early_trains_nothing(tmp_path, crashed):
    """A run stopped by early stopping (step 6) is over: resumed, it takes no step and ends with the files of the
    run that was never resumed (before: it trained on past the stop, replacing model.safetensors and summary.json
    by those of a longer run). ``crashed``: killed after the stop's checkpoint and line, before the weights were chosen and summary.json
    written (the resumed run does both, as the stopped run would have)."""
    early = ("train.early_stopping_patience=1", "train.early_stopping_min_delta=100")
    straight, run = tmp_path / "straight", tmp_path / "run"
    Trainer(config(*early), straight, quiet=True).train()
    if crashed:
        trainer = Trainer(config(*early), run, quiet=True)

        def killed(*args):
            raise RuntimeError("killed")
        trainer._finish = killed
        with pytest.raises(RuntimeError, match="killed"):
            trainer.train()
        trainer.close()
        assert not (run / "summary.json").exists()
    else:
        shutil.copytree(straight, run)
    resumed = Trainer(None, run, resume=True, quiet=True)
    assert resumed.step == 6
    summary = resumed.train()
    before = json.loads((straight / "summary.json").read_text())
    assert summary["steps"] == 6 and {k: summary.get(k) for k in SUMMARY_SAME} == {k: before.get(k) for k in SUMMARY_SAME}
    assert figures(run) == figures(straight)
    assert saved_weights(run) == saved_weights(straight)
    resumed.close()
    longer = Trainer(None, run, resume=True, quiet=True,
                     overrides=["train.early_stopping_patience=3"])      # the way to train on
    assert longer.train()["steps"] > 6
