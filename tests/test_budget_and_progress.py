"""Time budgets cover everything a training command does, and progress is shown once per interval with the
latest figures (issue 36). Budgets are checked on a fake clock (conftest.FakeClock) on which a model's forward
pass costs time in proportion to its batch: never on wall time."""
from __future__ import annotations

import io
import json
import math
import re

import pytest

from numformer.config import apply_overrides, resolve_config
from numformer.train import Trainer
from numformer.train.progress import PlainProgress, progress

GPT = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
       "data": {"task": "copy", "length": 4, "n_val": 16, "n_test": 16},
       "train": {"max_steps": 30, "batch_size": 4, "eval_every": 1000, "log_every": 10, "processes": 1,
                 "dtype": "float64"}}


def costly_forwards(monkeypatch, clock, seconds_per_row):
    """Every forward pass of a classifier advances the fake clock by ``seconds_per_row`` per example."""
    from numformer.models import EncoderClassifier

    forward = EncoderClassifier.forward

    def timed(self, ids, *args, **kwargs):
        clock.now += seconds_per_row * len(ids)
        return forward(self, ids, *args, **kwargs)
    monkeypatch.setattr(EncoderClassifier, "forward", timed)


def classifier_config(tmp_path, **train):
    rows = "".join(f"{i},{'good fine great' if i % 2 else 'bad poor awful'} film {i},{i % 2}\n" for i in range(400))
    (tmp_path / "t.csv").write_text("id,text,label\n" + rows, encoding="utf-8")
    return {"model": {"type": "classifier", "d_model": 16, "n_heads": 2, "n_layers": 1},
            "data": {"task": "classification", "path": str(tmp_path / "t.csv"), "min_freq": 1, "val_size": 40,
                     "test_size": 200},
            "train": {"max_steps": 100000, "batch_size": 8, "eval_every": 25, "processes": 1, "log_every": 5,
                      "budget_minutes": 0.5, **train}}


# -- budgets cover everything -----------------------------------------------------------------------------------
@pytest.mark.parametrize("eval_metrics", [True, False])
def test_a_budgeted_classifier_run_scores_its_test_split_within_the_budget(tmp_path, fake_clock, monkeypatch,
                                                                          eval_metrics):
    """The closing scoring of the test split (its loss and accuracy: two forward passes over 200 examples, 4 s)
    is part of the plan: the whole command, test scoring included, ends within the 30 s budget."""
    costly_forwards(monkeypatch, fake_clock, 0.01)
    start = fake_clock.now
    trainer = Trainer(classifier_config(tmp_path, eval_metrics=eval_metrics), tmp_path / "run", quiet=True)
    s = trainer.train()
    assert s["stopped_by"] == "time budget" and "test_accuracy" in s["test"] and s["steps"] > 20
    assert s["budget_used_seconds"] <= s["budget_seconds"] == 30.0
    assert fake_clock.now - start <= 30.0           # measured from the trainer's construction to the summary


@pytest.mark.parametrize("key", ["budget_minutes", "max_minutes"])
def test_a_time_key_is_bounded_so_that_the_summary_stays_valid_json(key):
    with pytest.raises(ValueError, match=rf"\[train\] {key} = 1e\+307 is out of range; {key} must be in \[0, 1e\+06\]"):
        resolve_config(apply_overrides(GPT, [f"train.{key}=1e307"]))


def test_a_budget_of_a_million_minutes_writes_finite_figures(tmp_path):
    s = Trainer(apply_overrides(GPT, ["train.budget_minutes=1e6"]), tmp_path / "r", quiet=True).train()
    text = (tmp_path / "r" / "summary.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"summary.json holds {c}"))
    assert s["budget_seconds"] == 6e7 and s["steps"] == 30


def test_a_budget_too_small_for_one_step_names_only_the_files_it_saved(tmp_path, fake_clock, capsys):
    fake_clock.tick = 0.5
    run = tmp_path / "r"
    s = Trainer(apply_overrides(GPT, ["train.budget_minutes=0.01"]), run).train()
    assert s["steps"] == 0 and not (run / "metrics.jsonl").exists()
    saved = capsys.readouterr().err.split(f"Saved to {run}: ", 1)[1].splitlines()[0]
    named = re.findall(r"[\w.]+\.(?:safetensors|jsonl|json)", saved)
    assert named and all((run / name).is_file() for name in named) and "metrics.jsonl" not in named


def test_a_budgeted_run_on_a_terminal_shows_the_time_left():
    out = io.StringIO()
    left = [75.0]
    bar = progress(None, 0, terminal=True, stream=out, time_left=lambda: left[0])
    bar.set_postfix(loss="2.5000")
    for _ in range(3):
        left[0] -= 10
        bar.update(1)
    bar.close()
    assert "left=0:45" in out.getvalue() and "loss=2.5000" in out.getvalue()


def test_plain_progress_under_a_budget_writes_a_line_every_tenth_of_the_budget(fake_clock):
    out = io.StringIO()
    fake_clock.tick = 0.0
    bar = PlainProgress(None, 0, out, time_left=lambda: 20.0)      # a tenth: a line every 2 s
    for _ in range(100):
        fake_clock.now += 0.1
        bar.update(1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and lines[0].startswith("step 20: ") and lines[0].endswith("0:20 left")


# -- progress: the latest figures, once per interval ------------------------------------------------------------
def _plain_losses(err):
    return {int(m[1]): m[2] for m in re.finditer(r"^step (\d+)/\d+: train loss ([\d.]+)", err, flags=re.M)}


def test_the_progress_line_shows_the_latest_steps_loss(tmp_path, capsys):
    """A 30-step run writes a line every 3 steps; each shows that step's training loss (not the mean of the
    last metrics line, repeated)."""
    Trainer(apply_overrides(GPT, ["train.log_every=1"]), tmp_path / "each", quiet=True).train()
    per_step = {m["step"]: m["train_loss"] for m in map(json.loads, (tmp_path / "each" / "metrics.jsonl")
                                                         .read_text().splitlines()) if "train_loss" in m}
    Trainer(GPT, tmp_path / "r").train()
    shown = _plain_losses(capsys.readouterr().err)
    assert sorted(shown) == [3, 6, 9, 12, 15, 18, 21, 24, 27]
    assert all(shown[s] == f"{per_step[s]:.4f}" for s in shown)
    assert len(set(shown.values())) == len(shown)


def test_progress_is_one_line_per_interval_not_one_per_evaluation(tmp_path, capsys):
    Trainer(apply_overrides(GPT, ["train.eval_every=1", "train.eval_batches=1"]), tmp_path / "r").train()
    err = capsys.readouterr().err
    assert "val_loss_estimate" in err
    lines = [line for line in err.splitlines() if line.startswith("step ")]
    assert len(lines) == 9 and all(re.search(r"val_loss_estimate [\d.]+ \(\d+ tokens\).* at step \d+", line)
                                   for line in lines)


def test_plain_progress_shows_the_latest_evaluation_in_its_next_line():
    out = io.StringIO()
    bar = PlainProgress(total=100, initial=0, stream=out)
    for step in range(1, 101):
        bar.set_postfix(loss=f"{5 - step / 50:.4f}", tok_s="1,234")
        bar.evaluation(step, f"val_loss {step / 10:.4f}")
        bar.update(1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 9
    assert lines[0].startswith("step 10/100: train loss 4.8000, val_loss 1.0000 at step 10, 1,234 tokens/s, 0:0")


def test_a_terminal_bar_writes_an_evaluation_line_once_per_interval():
    out = io.StringIO()
    bar = progress(100, 0, terminal=True, stream=out)
    for step in range(1, 101):
        bar.set_postfix(loss="1.0000")
        bar.evaluation(step, f"val_loss {step / 10:.4f}")
        bar.update(1)
    bar.close()
    written = [line for line in re.split(r"[\r\n]", out.getvalue()) if line.startswith("step ")]
    assert len(written) == 9 and written[0] == "step 10: train loss 1.0000, val_loss 1.0000 at step 10"


# -- the class: every kind of run ends within its budget ----------------------------------------------------------
def costly_module_calls(monkeypatch, clock, seconds_per_value=1e-5):
    """Every call of a numformer module (a model, a block, a layer: training, evaluation, decoding, beam search)
    advances the fake clock in proportion to the size of its first array argument."""
    from numformer.nn import Module

    call = Module.__call__

    def timed(self, *args, **kwargs):
        first = next((a for a in (*args, *kwargs.values()) if hasattr(a, "size")), None)
        clock.now += seconds_per_value * (getattr(first, "size", 1) or 1)
        return call(self, *args, **kwargs)
    monkeypatch.setattr(Module, "__call__", timed)


def _text_file(tmp_path):
    from numformer.data.text import read_corpus

    (tmp_path / "small.txt").write_text(read_corpus("")[:20000], encoding="utf-8")
    return str(tmp_path / "small.txt")


def _kind_config(kind, tmp_path):
    """A budgeted run of each kind whose end differs: the test split scored (classifier: accuracy; translation:
    greedy and beam-search BLEU), bits per byte (BPE), a frozen base with adapters, DPO's reference and rewards."""
    train = {"max_steps": 100000, "batch_size": 8, "eval_every": 25, "processes": 1, "log_every": 5,
             "budget_minutes": 1.0}
    if kind == "classifier":
        return classifier_config(tmp_path, budget_minutes=1.0)
    if kind == "translation":
        from test_translation import write_reversal_corpus

        data = write_reversal_corpus(tmp_path / "data")
        return {"model": {"type": "transformer", "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
                "data": {"task": "multi30k", "path": str(data), "tokenizer": "word", "min_freq": 1, "max_len": 12,
                         "buckets": 1, "beam_size": 3},
                "train": train}
    text = {"task": "text", "path": _text_file(tmp_path), "block_size": 16}
    if kind == "gpt":
        return {**GPT, "data": text, "train": train}
    if kind == "bpe":
        return {**GPT, "data": {**text, "tokenizer": "bpe", "vocab_size": 300}, "train": train}
    if kind == "lora":
        Trainer({**GPT, "data": text, "train": {**train, "budget_minutes": 0.0, "max_steps": 2}}, tmp_path / "base",
                quiet=True).train()
        return {"model": {"init_from": str(tmp_path / "base")}, "data": text, "train": train,
                "lora": {"r": 2, "alpha": 4.0, "target_modules": ["c_attn", "c_fc"]}}
    from test_dpo import dpo_config, sft_base

    config = dpo_config(tmp_path, sft_base(tmp_path))
    return {**config, "train": {**config["train"], **train, "max_steps": 100000, "batch_size": 4}}


@pytest.mark.parametrize("kind", ["gpt", "bpe", "classifier", "translation", "lora", "dpo"])
def test_every_kind_of_run_ends_within_its_budget(tmp_path, fake_clock, monkeypatch, kind):
    """Budgets cover everything the command does, for each kind of run: setup (DPO's reference log-probabilities
    included), steps, evaluations, checkpoints and each end (the whole-split scoring, the test split's metrics,
    the saves), on a fake clock where every module call costs time."""
    config = _kind_config(kind, tmp_path)
    costly_module_calls(monkeypatch, fake_clock)
    start = fake_clock.now
    s = Trainer(config, tmp_path / "run", quiet=True).train()
    end = fake_clock.now
    assert s["stopped_by"] == "time budget" and s["steps"] >= 10, s
    assert s["budget_used_seconds"] <= s["budget_seconds"] == 60.0
    assert end - start <= 60.0, (kind, end - start)
    if kind in ("classifier", "translation"):
        assert s["test"]


def test_a_budgeted_training_on_a_terminal_shows_the_time_left(tmp_path, fake_clock, monkeypatch, capsys):
    """The trainer gives its terminal bar the budget's time left (training.md's promise), not only the bar."""
    import sys

    fake_clock.tick = 0.01
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    Trainer(apply_overrides(GPT, ["train.budget_minutes=0.05", "train.max_steps=100000"]), tmp_path / "r").train()
    shown = re.findall(r"left=(\d+):(\d\d)", capsys.readouterr().err)
    assert shown and int(shown[0][0]) * 60 + int(shown[0][1]) <= 3
