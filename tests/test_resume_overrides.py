"""`--resume --set train.KEY=VALUE` (issue 36): every [train] key is either in effect from the resumed step on
(and recorded in config.json) or refused by name in one line; never recorded and ignored. The table below has
a case for every key of the code's key table (``config._train_keys``): a test fails when a key is added without
one. Each case resumes a 4-step run to step 10 with the value set and checks the value's effect on what the
run does (its batches, optimizer options, learning rates, evaluations, checkpoints, stop), not only its config."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from numformer.config import RESUME_REFUSED, _train_keys, resume_changes
from numformer.optim import train_schedule
from numformer.train import Trainer

BASE = {"max_steps": 4, "batch_size": 4, "lr": 1e-2, "eval_every": 2, "checkpoint_every": 2, "log_every": 1,
        "processes": 1, "dtype": "float64", "eval_batches": 1, "eval_batch_size": 4}
BASES = {
    "adamw": {},
    "sgd": {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9},
    "muon": {"optimizer": "muon", "muon_lr": 0.02},
    "cosine": {"schedule": "cosine", "warmup_steps": 2, "min_lr": 1e-3},
    "wsd": {"schedule": "wsd", "cooldown": 0.5, "min_lr": 1e-3},
    "budget": {"budget_minutes": 10.0},
}
RESUMED_TO = 10


def _lines(run, kind):
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m for m in lines if kind in m and m["step"] > BASE["max_steps"]}


def _schedule_of(run, step):
    """The learning rate a new run of config.json's [train] would use at update ``step``."""
    t = json.loads((run / "config.json").read_text())["train"]
    return train_schedule(t)(step)


def _lrs_follow_the_new_schedule(run, trainer, spy, summary):
    lrs = {s: m["lr"] for s, m in _lines(run, "train_loss").items()}
    return lrs and all(lr == pytest.approx(_schedule_of(run, s - 1), rel=1e-12) for s, lr in lrs.items())


def _group(trainer, key, adamw=False):
    opt = trainer.optimizer.adamw if adamw else trainer.optimizer
    return opt.param_groups[0][key]


# key -> (base, value, probe(run, trainer, spy, summary) -> truthy when the value is in effect), or "refused"
CASES = {
    "max_steps": ("adamw", 7, lambda r, t, spy, s: s["steps"] == 7 and max(_lines(r, "train_loss")) == 7),
    "batch_size": ("adamw", 2, lambda r, t, spy, s: set(spy["batch_sizes"]) == {2}),
    "lr": ("adamw", 5e-3, lambda r, t, spy, s: {m["lr"] for m in _lines(r, "train_loss").values()} == {5e-3}),
    "eval_every": ("adamw", 3, lambda r, t, spy, s: sorted(_lines(r, "val_tokens")) == [6, 9, 10]),
    "checkpoint_every": ("adamw", 3, lambda r, t, spy, s: spy["checkpoints"] == [6, 9, 10]),
    "seed": ("adamw", 7, "refused"),
    "optimizer": ("adamw", "sgd", "refused"),
    "beta1": ("adamw", 0.5, lambda r, t, spy, s: _group(t, "betas")[0] == 0.5),
    "beta2": ("adamw", 0.9, lambda r, t, spy, s: _group(t, "betas")[1] == 0.9),
    "eps": ("adamw", 1e-3, lambda r, t, spy, s: _group(t, "eps") == 1e-3),
    "weight_decay": ("adamw", 0.1, lambda r, t, spy, s: _group(t, "weight_decay") == 0.1),
    "no_decay": ("adamw", ["bias"], "refused"),
    "momentum": ("sgd", 0.5, lambda r, t, spy, s: _group(t, "momentum") == 0.5),
    "nesterov": ("sgd", True, lambda r, t, spy, s: _group(t, "nesterov") is True),
    "muon_lr": ("muon", 0.05, lambda r, t, spy, s: _group(t, "lr") == pytest.approx(0.05, rel=1e-12)),
    "muon_momentum": ("muon", 0.5, lambda r, t, spy, s: _group(t, "momentum") == 0.5),
    "muon_nesterov": ("muon", False, lambda r, t, spy, s: _group(t, "nesterov") is False),
    "muon_ns_steps": ("muon", 3, lambda r, t, spy, s: _group(t, "ns_steps") == 3),
    "schedule": ("adamw", "linear", _lrs_follow_the_new_schedule),
    "cooldown": ("wsd", 0.9, _lrs_follow_the_new_schedule),
    "cooldown_shape": ("wsd", "sqrt", _lrs_follow_the_new_schedule),
    "warmup_steps": ("cosine", 6, _lrs_follow_the_new_schedule),
    "min_lr": ("cosine", 5e-3, _lrs_follow_the_new_schedule),
    "decay_steps": ("cosine", 8, _lrs_follow_the_new_schedule),
    "grad_clip": ("adamw", 1e-3, lambda r, t, spy, s: spy["grad_norms"]
                  and max(spy["grad_norms"]) <= 1e-3 * (1 + 1e-9)),
    "grad_accum": ("adamw", 3, lambda r, t, spy, s: len(spy["batch_sizes"]) == 3 * (RESUMED_TO - 4)),
    "label_smoothing": ("adamw", 0.9, lambda r, t, spy, s: spy["first_loss"] != spy["first_loss_unsmoothed"]),
    "eval_batches": ("adamw", 0, lambda r, t, spy, s: all("val_loss" in m for m in _lines(r, "val_tokens").values())),
    "eval_batch_size": ("adamw", 2, lambda r, t, spy, s: {m["val_tokens"] for m in _lines(r, "val_tokens").values()}
                        == {spy["val_tokens_before"] // 2}),
    "eval_metrics": ("adamw", False, lambda r, t, spy, s: all("exact_match" not in m
                                                              for m in _lines(r, "val_tokens").values())),
    "early_stopping_patience": ("adamw", 1, lambda r, t, spy, s: t.early.patience == 1),
    "early_stopping_min_delta": ("adamw", 0.5, lambda r, t, spy, s: t.early.min_delta == 0.5),
    "restore_best": ("adamw", False, lambda r, t, spy, s: "selected_step" not in s),
    "log_every": ("adamw", 3, lambda r, t, spy, s: sorted(_lines(r, "train_loss")) == [6, 9, 10]),
    # already past it: the run ends at its checkpoint, by the time limit, without another step
    "max_minutes": ("adamw", 1e-9, lambda r, t, spy, s: s["time_limit_reached"] and s["steps"] == 4),
    "budget_minutes": ("budget", 20.0, lambda r, t, spy, s: t.budget.seconds == 1200.0),
    "dtype": ("adamw", "float32", "refused"),
    "processes": ("adamw", 2, lambda r, t, spy, s: t.processes == 2 and s["processes"] == 2),
    "objective": ("adamw", "dpo", "refused"),
    # the DPO step reads beta from the trainer's [train] at every step (tests/test_dpo.py trains DPO runs)
    "beta": ("adamw", 0.5, lambda r, t, spy, s: t.train_cfg["beta"] == 0.5),
}


def test_every_train_key_has_a_case():
    assert set(CASES) == set(_train_keys())
    assert {k for k, case in CASES.items() if case[2] == "refused"} == set(RESUME_REFUSED)


@pytest.fixture(scope="module")
def base_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    runs = {}
    for name, train in BASES.items():
        runs[name] = root / name
        config = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
                  "data": {"task": "copy", "length": 4, "n_val": 16, "n_test": 16},
                  "train": {**BASE, **train}}
        Trainer(config, runs[name], quiet=True).train()
    return runs


def _spy(trainer, spy):
    """Record what the resumed run does: its batch sizes, checkpoints' steps, the norm of the gradients each
    update applies."""
    train_batch, save = trainer.task.train_batch, trainer.save_checkpoint
    spy.update(batch_sizes=[], checkpoints=[], grad_norms=[])

    def batch(size, rng):
        spy["batch_sizes"].append(size)
        return train_batch(size, rng)

    def checkpoint():
        spy["checkpoints"].append(trainer.step)
        save()
    trainer.task.train_batch, trainer.save_checkpoint = batch, checkpoint
    step = trainer.optimizer.step

    def measured_step():
        spy["grad_norms"].append(math.sqrt(sum(float(np.sum(p.grad ** 2)) for p in trainer.optimizer.params)))
        step()
    trainer.optimizer.step = measured_step


@pytest.mark.parametrize("key", sorted(CASES))
def test_a_train_key_set_on_resume_is_in_effect_or_refused_by_name(key, base_runs, tmp_path, capsys):
    base, value, probe = CASES[key]
    run = tmp_path / "run"
    shutil.copytree(base_runs[base], run)
    val_tokens_before = next(iter({m["val_tokens"] for m in _lines_all(run) if "val_tokens" in m}))
    overrides = [f"train.{key}={json.dumps(value)}"] + ([] if key == "max_steps" else [f"train.max_steps={RESUMED_TO}"])
    if probe == "refused":
        with pytest.raises(ValueError) as e:
            Trainer(None, run, resume=True, overrides=overrides, quiet=True)
        line = str(e.value)
        assert "\n" not in line and f"--resume cannot change [train] {key} " in line and "new run" in line
        assert json.loads((run / "config.json").read_text())["train"][key] != value     # nothing recorded
        return
    trainer = Trainer(None, run, resume=True, overrides=overrides)
    notes = capsys.readouterr().err
    assert f"note: {key} " in notes or f", {key} " in notes             # the change is announced
    spy = {"val_tokens_before": val_tokens_before}
    if key == "label_smoothing":
        spy["first_loss_unsmoothed"] = _first_resumed_loss(base_runs[base], tmp_path / "plain")
    _spy(trainer, spy)
    summary = trainer.train()
    trainer.close()
    if key == "label_smoothing":
        spy["first_loss"] = _lines(run, "train_loss")[5]["train_loss"]
    assert json.loads((run / "config.json").read_text())["train"][key] == value      # recorded ...
    assert probe(run, trainer, spy, summary), (key, spy, summary)                     # ... and in effect


@pytest.mark.parametrize("section, key, value, change, effect", [
    ("train", "lr", 5e-3, "lr 0.01 -> 0.005", "changes the learning-rate schedule of the resumed run from this step on"),
    ("train", "grad_clip", 0.5, "grad_clip 1.0 -> 0.5", "in effect from this step on"),
    ("model", "dropout", 0.1, "[model] dropout 0.0 -> 0.1", "in effect from this step on")])
def test_a_value_edited_by_hand_is_announced_as_set_would_be(section, key, value, change, effect, base_runs, tmp_path,
                                                             capsys):
    """config.json edited by hand since the checkpoint: the resumed run names the change, as for --set (the
    checkpoint records the config it trained with); a resume of an unedited run says nothing."""
    run = tmp_path / "run"
    shutil.copytree(base_runs["adamw"], run)

    def notes():
        return [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]

    Trainer(None, run, resume=True).close()
    assert notes() == []
    config = json.loads((run / "config.json").read_text())
    config[section][key] = value
    (run / "config.json").write_text(json.dumps(config))
    Trainer(None, run, resume=True).close()
    assert notes() == [f"note: {change} {effect}"]
    trainer = Trainer(None, run, resume=True, overrides=["train.max_steps=6"])
    both = " ".join(notes())                    # the edit is still a change from the checkpoint's run
    assert "max_steps 4 -> 6" in both and change in both
    trainer.train()
    trainer.close()
    capsys.readouterr()
    Trainer(None, run, resume=True, overrides=["train.max_steps=8"]).close()   # its checkpoint records the edit
    assert notes() == ["note: max_steps 6 -> 8 in effect from this step on"]


def _lines_all(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _first_resumed_loss(base_run, run):
    shutil.copytree(base_run, run)
    Trainer(None, run, resume=True, overrides=[f"train.max_steps={RESUMED_TO}"], quiet=True).train()
    return _lines(run, "train_loss")[5]["train_loss"]


# -- the notes and the refusals on their own ------------------------------------------------------------------
def _train(**changes):
    from numformer.config import TRAIN_DEFAULTS

    return {**TRAIN_DEFAULTS, **changes}


@pytest.mark.parametrize("saved, new, moved", [
    (dict(schedule="wsd", max_steps=100), dict(schedule="wsd", max_steps=200), "max_steps 100 -> 200"),
    (dict(schedule="wsd", cooldown=0.2), dict(schedule="wsd", cooldown=0.5), "cooldown 0.2 -> 0.5"),
    (dict(schedule="wsd"), dict(schedule="wsd", cooldown_shape="sqrt"), "cooldown_shape linear -> sqrt"),
    (dict(schedule="cosine", budget_minutes=1.0), dict(schedule="cosine", budget_minutes=2.0),
     "budget_minutes 1.0 -> 2.0"),
    (dict(schedule="wsd", budget_minutes=1.0), dict(schedule="wsd", budget_minutes=3.0), "budget_minutes 1.0 -> 3.0"),
    (dict(schedule="linear"), dict(schedule="linear", decay_steps=50), "decay_steps 0 -> 50"),
    (dict(schedule="constant"), dict(schedule="cosine"), "schedule constant -> cosine"),
    (dict(schedule="noam", warmup_steps=4), dict(schedule="noam", warmup_steps=8), "warmup_steps 4 -> 8"),
])
def test_every_change_of_the_learning_rate_schedule_gets_the_note(saved, new, moved):
    notes = resume_changes(_train(**saved), _train(**new))
    assert notes == [f"note: {moved} changes the learning-rate schedule of the resumed run from this step on"]


def test_other_changes_are_announced_as_in_effect_and_no_change_says_nothing():
    assert resume_changes(_train(), _train()) == []
    assert resume_changes(_train(schedule="wsd"), _train(schedule="wsd", max_steps=10, budget_minutes=0.0,
                                                         grad_clip=0.5)) == [
        "note: max_steps 1000 -> 10 changes the learning-rate schedule of the resumed run from this step on",
        "note: grad_clip 1.0 -> 0.5 in effect from this step on"]
    # under a budget the steps no longer plan the decay: a new max_steps only caps the run
    assert resume_changes(_train(schedule="wsd", budget_minutes=1.0),
                          _train(schedule="wsd", budget_minutes=1.0, max_steps=10)) == [
        "note: max_steps 1000 -> 10 in effect from this step on"]


@pytest.mark.parametrize("saved, new", [(0.0, 1.0), (1.0, 0.0)])
def test_a_budget_cannot_be_turned_on_or_off_on_resume(saved, new):
    with pytest.raises(ValueError, match=r"--resume cannot change \[train\] budget_minutes .* time budget"):
        resume_changes(_train(budget_minutes=saved), _train(budget_minutes=new))


def test_a_muon_run_resumed_with_a_new_lr_keeps_muon_lr_as_training_md_says(base_runs, tmp_path):
    """training.md: AdamW uses lr(t) and Muon lr(t) · muon_lr / lr; so a new lr on --resume changes AdamW's rate
    and leaves Muon's at muon_lr (a constant schedule)."""
    run = tmp_path / "run"
    shutil.copytree(base_runs["muon"], run)
    trainer = Trainer(None, run, resume=True, overrides=["train.lr=5e-3", "train.max_steps=6"], quiet=True)
    trainer.train()
    trainer.close()
    assert _group(trainer, "lr") == pytest.approx(0.02, rel=1e-12)
    assert _group(trainer, "lr", adamw=True) == 5e-3


# -- the other sections: [model], [data], [lora] ----------------------------------------------------------------
# `--resume --set data.tokenizer="bpe"` on a character-level run recorded "bpe" in config.json while the run went on
# with its saved characters; `model.activation` changed a trained model's architecture unannounced; `lora.r` was
# "checkpoint is incomplete or damaged". Each key of these sections now takes effect (config.RESUMABLE) or is refused.
def _every_data_key():
    from numformer.data.base import DATA_KEYS, TASKS, import_builtin_tasks

    import_builtin_tasks()
    return set(DATA_KEYS) | {k for cls in TASKS.values() for k in cls.data_keys}


def _section_keys():
    from numformer.config import _lora_keys
    from numformer.models import model_keys

    return {"model": set(model_keys()) | {"init_from"}, "data": _every_data_key(), "lora": set(_lora_keys())}


def test_the_keys_resume_may_change_are_keys_of_their_sections():
    from numformer.config import RESUMABLE

    keys = _section_keys()
    assert set(RESUMABLE) == set(keys) and all(set(RESUMABLE[s]) <= keys[s] for s in RESUMABLE)


@pytest.mark.parametrize("section", ["model", "data", "lora"])
def test_every_key_of_the_other_sections_takes_effect_or_is_refused_by_name(section):
    """The rule decides every key of every task and model: a change is a note naming it (RESUMABLE) or one
    line naming it and the reason; a [lora] section added to a run without one is refused."""
    from numformer.config import RESUMABLE, resume_section_changes

    for key in sorted(_section_keys()[section]):
        saved = {"train": {}, section: {key: "before"}}
        wanted = {"train": {}, section: {key: "after"}}
        if key in RESUMABLE[section]:
            assert resume_section_changes(saved, wanted) == [
                f"note: [{section}] {key} 'before' -> 'after' in effect from this step on"]
        else:
            with pytest.raises(ValueError, match=rf"^--resume cannot change \[{section}\] {key} 'before' -> 'after' "
                                                 rf"\(the .*\); remove the --set"):
                resume_section_changes(saved, wanted)
    assert resume_section_changes({"train": {}}, {"train": {}}) == []
    with pytest.raises(ValueError, match=r"\[lora\] r None -> 4 \(the run was trained without \[lora\]\)"):
        resume_section_changes({"train": {}}, {"train": {}, "lora": {"r": 4}})


TEXT = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
        "data": {"task": "text", "block_size": 16},
        "train": {"max_steps": 2, "batch_size": 4, "eval_every": 2, "processes": 1, "dtype": "float64"}}


@pytest.fixture(scope="module")
def text_runs(tmp_path_factory):
    """A character-level text run and a LoRA run fine-tuned from it."""
    from numformer.data.text import read_corpus

    root = tmp_path_factory.mktemp("sections")
    (root / "small.txt").write_text(read_corpus("")[:3000], encoding="utf-8")
    text = {**TEXT, "data": {**TEXT["data"], "path": str(root / "small.txt")}}
    Trainer(text, root / "base", quiet=True).train()
    lora = {"model": {"init_from": str(root / "base")}, "data": text["data"], "train": text["train"],
            "lora": {"r": 2, "alpha": 4.0, "target_modules": ["c_attn"]}}
    Trainer(lora, root / "lora", quiet=True).train()
    return root


def _modules(model, kind):
    from numformer.lora import LoRAAdapter
    from numformer.nn import MultiHeadAttention

    cls = {"attention": MultiHeadAttention, "lora": LoRAAdapter}[kind]
    return [m for _, m in model.named_modules() if isinstance(m, cls)]


# (run, --set value, probe(trainer) -> truthy when the value is in effect)
IN_EFFECT = {
    "model.dropout": ("base", 0.25, lambda t: {m.dropout_p for m in _modules(t.model, "attention")} == {0.25}),
    "model.attention": ("base", "flash", lambda t: {m.attention for m in _modules(t.model, "attention")} == {"flash"}),
    "model.gradient_checkpointing": ("base", True, lambda t: t.model.gradient_checkpointing is True),
    "lora.alpha": ("lora", 8.0, lambda t: {m.scaling for m in _modules(t.model, "lora")} == {4.0}),
    "lora.dropout": ("lora", 0.5, lambda t: {m.dropout for m in _modules(t.model, "lora")} == {0.5}),
    "lora.use_rslora": ("lora", True, lambda t: {m.scaling for m in _modules(t.model, "lora")} == {4.0 / math.sqrt(2)}),
    "data.path": ("base", "moved.txt", lambda t: t.task.config["path"].endswith("moved.txt")),
}


@pytest.mark.parametrize("dotted", sorted(IN_EFFECT))
def test_a_key_resume_may_change_is_in_effect_and_recorded(dotted, text_runs, tmp_path, capsys):
    from numformer.config import RESUMABLE

    section, key = dotted.split(".")
    assert key in RESUMABLE[section]
    name, value, probe = IN_EFFECT[dotted]
    run = tmp_path / name
    shutil.copytree(text_runs / name, run)
    if key == "path":                                   # the same data, moved
        value = str(tmp_path / value)
        shutil.copy(text_runs / "small.txt", value)
    trainer = Trainer(None, run, resume=True, overrides=[f"{dotted}={json.dumps(value)}", "train.max_steps=3"])
    assert f"[{section}] {key} " in capsys.readouterr().err
    trainer.train()
    trainer.close()
    assert probe(trainer), dotted
    assert json.loads((run / "config.json").read_text())[section][key] == value


@pytest.mark.parametrize("run_name, dotted, value", [
    ("base", "model.activation", "relu"),          # the weights fit: it was taken unannounced
    ("base", "model.n_layers", 2),                  # was "checkpoint ... is incomplete or damaged"
    ("base", "data.tokenizer", "bpe"),              # was recorded while the saved characters went on
    ("base", "data.block_size", 8),
    ("base", "data.val_fraction", 0.5),
    ("base", "lora.r", 2),                          # a [lora] section added
    ("lora", "lora.r", 4),
    ("lora", "lora.target_modules", ["c_attn", "c_fc"]),
    ("lora", "model.n_layers", 2),
    ("lora", "model.init_from", "elsewhere"),
])
def test_a_key_resume_cannot_change_is_refused_by_name_and_nothing_changes(text_runs, tmp_path, run_name, dotted,
                                                                          value):
    section, key = dotted.split(".")
    run = tmp_path / run_name
    shutil.copytree(text_runs / run_name, run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(ValueError) as e:
        Trainer(None, run, resume=True, overrides=[f"{dotted}={json.dumps(value)}", "train.max_steps=3"], quiet=True)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"--resume cannot change [{section}] {key} ") and "new run" in line
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_a_fine_tuned_run_resumes_from_another_folder(text_runs, tmp_path, monkeypatch):
    """config.json records init_from resolved (as [data] path), so a run fine-tuned from a relative folder
    resumes from anywhere (its relative name was looked up on the Hugging Face hub)."""
    monkeypatch.chdir(text_runs)
    rel = {"model": {"init_from": "base"}, "data": {**TEXT["data"], "path": "small.txt"}, "train": TEXT["train"],
           "lora": {"r": 2, "alpha": 4.0, "target_modules": ["c_attn"]}}
    Trainer(rel, tmp_path / "ft", quiet=True).train()
    assert json.loads((tmp_path / "ft" / "config.json").read_text())["model"]["init_from"] == str(text_runs / "base")
    monkeypatch.chdir(tmp_path)
    Trainer(None, tmp_path / "ft", resume=True, overrides=["train.max_steps=3"], quiet=True).train()
