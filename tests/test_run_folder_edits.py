"""A run folder edited or damaged by hand between two commands (issue D4, D5).

config.json edited by hand: what `--resume --set` refuses to change, an edited config.json does not change either.
The checkpoint records the config its run trained with (``run_files.checkpoint_config``; an older checkpoint its
[model] section, dtype, optimizer and, through its generators, whether its seed is config.json's), and resuming
compares config.json with it before anything is read: one line naming the file, the key, both values and the fix,
not "checkpoint ... is incomplete or damaged" (the checkpoint is fine) nor a silent run with the edited value.

tokenizer.json lost or damaged: a run whose task keeps a tokenizer refuses to resume, eval, generate, export,
analyze, classify or translate without it, in one line naming the file (restore it from a copy: a vocabulary
built again from the data as they are now may give the weights other ids); never rebuilt, by any reader.
"""
from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

import numformer
from numformer.config import RESUME_REFUSED
from numformer.data import Batch, Task, register_task
from numformer.run_files import CHECKPOINT
from numformer.train import Trainer, load_task

from conftest import one_error_line, set_metadata

BASE = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
        "data": {"task": "copy", "length": 4, "n_val": 16, "n_test": 16},
        "train": {"max_steps": 4, "batch_size": 4, "eval_every": 2, "checkpoint_every": 2, "processes": 1,
                  "seed": 3, "eval_batches": 1}}


def snapshot(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def edit_config(run, section, key, value):
    path = run / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.setdefault(section, {})[key] = value
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 4-step copy run with a checkpoint that records its config ("recorded", as checkpoints are written
    now) and one that does not ("older": written before checkpoints recorded their config)."""
    root = tmp_path_factory.mktemp("edits")
    Trainer(BASE, root / "run", quiet=True).train()
    shutil.copytree(root / "run", root / "recorded")
    shutil.copytree(root / "run", root / "older")
    config = (root / "run" / "config.json").read_text(encoding="utf-8")
    set_metadata(root / "recorded" / CHECKPOINT, config=json.dumps(json.loads(config)))
    set_metadata(root / "older" / CHECKPOINT, config=None)
    return root


def test_a_new_checkpoint_records_the_config_its_run_trains_with(runs):
    """run_writer.RunWriter.save_checkpoint passes the config to run_files.save_checkpoint (``config=``)."""
    from numformer.run_files import checkpoint_config

    saved = json.loads((runs / "run" / "config.json").read_text(encoding="utf-8"))
    assert checkpoint_config(runs / "run" / CHECKPOINT)["config"] == saved


# (section, key, value written into config.json, the value the run trained with)
REFUSED_EDITS = [
    ("train", "seed", 7, 3),
    ("train", "optimizer", "sgd", "adamw"),
    ("train", "no_decay", ["bias"], ["bias", "norm"]),
    ("train", "dtype", "float64", "float32"),
    ("train", "objective", "dpo", "cross_entropy"),
    ("train", "budget_minutes", 5.0, 0.0),
    ("model", "d_model", 32, 16),                  # was "checkpoint ... is incomplete or damaged"
    ("model", "n_layers", 2, 1),
    ("model", "tie_weights", False, True),
    ("model", "block_size", 64, 9),
    ("model", "activation", "relu", "gelu"),      # the weights fit: it was taken unannounced
    ("model", "n_heads", 4, 2),
    ("data", "length", 5, 4),
    ("data", "n_val", 8, 16),
]


def test_the_edits_cover_every_train_key_resume_refuses():
    assert {k for s, k, *_ in REFUSED_EDITS if s == "train"} == set(RESUME_REFUSED) | {"budget_minutes"}


@pytest.mark.parametrize("section, key, value, trained", REFUSED_EDITS)
def test_an_edit_of_config_json_is_refused_as_its_set_is(runs, tmp_path, section, key, value, trained):
    """The same change is refused through --set and through config.json, each in one line; the edit's line
    names config.json, the key, both values and the fix, and nothing in the folder changes."""
    run = tmp_path / "run"
    shutil.copytree(runs / "recorded", run)
    with pytest.raises(ValueError, match="^--resume cannot change"):
        Trainer(None, run, resume=True, overrides=[f"{section}.{key}={json.dumps(value)}"], quiet=True)
    edit_config(run, section, key, value)
    before = snapshot(run)
    with pytest.raises(ValueError) as e:
        Trainer(None, run, resume=True, overrides=["train.max_steps=6"], quiet=True)
    line = str(e.value)
    assert "\n" not in line and "damaged" not in line, line
    assert line.startswith(f"{run / 'config.json'} was edited: it says [{section}] {key} {json.dumps(value)}, but "
                           f"the run's checkpoint {run / CHECKPOINT} was trained with {json.dumps(trained)} ("), line
    assert "put the checkpoint's value back in config.json" in line and "start a new run" in line
    assert snapshot(run) == before


@pytest.mark.parametrize("section, key, value, trained", [("train", "seed", 7, 3), ("data", "length", 5, 4),
                                                        ("data", "n_val", 8, 16)])
def test_eval_refuses_a_config_json_whose_data_or_seed_was_edited(runs, tmp_path, run_cli, section, key, value,
                                                                  trained):
    """Was: eval rebuilt the data from the edited [data] (or drew the splits with the edited seed) and printed its
    loss as the run's."""
    run = tmp_path / "run"
    shutil.copytree(runs / "recorded", run)
    edit_config(run, section, key, value)
    before = snapshot(run)
    line = one_error_line(*run_cli("eval", run)[::2], "eval")
    assert (f"{run / 'config.json'} was edited: it says [{section}] {key} {json.dumps(value)}, but the run's "
            f"checkpoint {run / CHECKPOINT} was trained with {json.dumps(trained)} (") in line, line
    assert "its figures would not be the trained run's: put the checkpoint's value back" in line, line
    assert snapshot(run) == before
    rc, out, _ = run_cli("eval", runs / "recorded")
    assert rc == 0 and "loss" in out                     # the unedited run evaluates


@pytest.mark.parametrize("section, key, value, trained", [
    ("train", "seed", 7, "another seed (its random generators were not seeded with 7)"),
    ("train", "dtype", "float64", '"float32"'),
    ("train", "optimizer", "adam", '"adamw"'),
    ("model", "d_model", 32, "16"),
    ("model", "tie_weights", False, "true"),
    ("model", "activation", "relu", '"gelu"'),
])
def test_an_older_checkpoint_is_compared_on_what_it_records(runs, tmp_path, section, key, value, trained):
    """A checkpoint written before checkpoints recorded their config records its [model] section, dtype and
    optimizer; its seed shows in its random generators' states."""
    run = tmp_path / "run"
    shutil.copytree(runs / "older", run)
    edit_config(run, section, key, value)
    with pytest.raises(ValueError) as e:
        Trainer(None, run, resume=True, overrides=["train.max_steps=6"], quiet=True)
    assert str(e.value).startswith(f"{run / 'config.json'} was edited: it says [{section}] {key} "
                                   f"{json.dumps(value)}, but the run's checkpoint {run / CHECKPOINT} was trained "
                                   f"with {trained} ("), str(e.value)


def test_a_checkpoint_without_any_record_names_config_json_for_an_architecture_edit(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs / "older", run)
    set_metadata(run / CHECKPOINT, model_config=None, dtype=None)
    edit_config(run, "model", "d_model", 32)
    with pytest.raises(ValueError) as e:
        Trainer(None, run, resume=True, overrides=["train.max_steps=6"], quiet=True)
    assert f"checkpoint {run / CHECKPOINT} holds weights of another model than config.json's [model] describes" \
        in str(e.value) and "if config.json was edited, restore it" in str(e.value)


@pytest.mark.parametrize("recorded", ["[]", '{"train": 5}', '{"train": {"seed": "x"}}', "{not json"])
def test_a_damaged_config_record_is_a_damaged_checkpoint(runs, tmp_path, recorded):
    run = tmp_path / "run"
    shutil.copytree(runs / "recorded", run)
    set_metadata(run / CHECKPOINT, config=recorded)
    with pytest.raises(ValueError) as e:
        Trainer(None, run, resume=True, overrides=["train.max_steps=6"], quiet=True)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"checkpoint {run / CHECKPOINT} is damaged (its config metadata")
    assert line.endswith("it cannot be resumed: restore it or train again"), line


@pytest.mark.parametrize("kind", ["recorded", "older"])
@pytest.mark.parametrize("section, key, value", [("train", "lr", 5e-3), ("train", "max_steps", 6),
                                                 ("model", "dropout", 0.1)])
def test_what_resume_may_change_may_be_edited_in_config_json(runs, tmp_path, kind, section, key, value):
    run = tmp_path / "run"
    shutil.copytree(runs / kind, run)
    edit_config(run, section, key, value)
    trainer = Trainer(None, run, resume=True, overrides=["train.max_steps=6"], quiet=True)
    trainer.train()
    trainer.close()
    assert trainer.step == 6 and trainer.config[section][key] == value


# -- tokenizer.json ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A character-level run on a.txt (vocabulary "\\n abcdefghij"); b.txt holds the same text in capitals."""
    root = tmp_path_factory.mktemp("vocab")
    rng = np.random.default_rng(0)
    text = "\n".join("".join(rng.choice(list(" abcdefghij"), 30)) for _ in range(60)) + "\n"
    (root / "a.txt").write_text(text, encoding="utf-8")
    (root / "b.txt").write_text(text.upper(), encoding="utf-8")
    config = {**BASE, "data": {"task": "text", "path": str(root / "a.txt"), "block_size": 8}}
    Trainer(config, root / "run", quiet=True).train()
    return root


def test_a_resume_on_other_data_never_builds_a_lost_vocabulary_again(text_run, tmp_path):
    """Was: tokenizer.json removed, `--resume --set data.path=b.txt` trained on with the vocabulary of b.txt."""
    run = tmp_path / "run"
    shutil.copytree(text_run / "run", run)
    (run / "tokenizer.json").unlink()
    before = snapshot(run)
    with pytest.raises(ValueError) as e:
        Trainer(None, run, resume=True, overrides=[f"data.path={json.dumps(str(text_run / 'b.txt'))}",
                                                   "train.max_steps=6"], quiet=True)
    assert str(e.value).startswith(f"{run / 'tokenizer.json'} is missing: the run's task 'text' keeps its "
                                   f"vocabulary there"), str(e.value)
    assert "restore tokenizer.json from a copy" in str(e.value) and "cannot be rebuilt safely" in str(e.value)
    assert snapshot(run) == before


DAMAGES = {
    "missing": None,
    "empty": "{}",
    "list": "[]",
    "null": "null",
    "unknown type": '{"type": "foo"}',
}
EXPECTED = {
    "missing": "{tok} is missing: the run's task 'text' keeps its vocabulary there",
    "empty": "tokenizer file {tok} is damaged (it holds an empty JSON object, not a tokenizer's state)",
    "list": "tokenizer file {tok} is damaged (it holds a JSON list, not a tokenizer's state)",
    "null": "tokenizer file {tok} is damaged (it holds JSON null, not a tokenizer's state)",
    "unknown type": "tokenizer file {tok} is damaged (unknown tokenizer type 'foo'",
}
READERS = {
    "train": ["train", "--resume", "--out", "{run}", "--set", "train.max_steps=6", "--quiet"],
    "eval": ["eval", "{run}"],
    "generate": ["generate", "{run}", "--prompt", "ab", "--max-new-tokens", "2"],
    "export": ["export", "{run}", "--out", "{tmp}/exported"],
    "analyze": ["analyze", "{run}", "--out", "{tmp}/report", "--no-ablation", "--no-occlusion"],
}


def damage_tokenizer_json(run, damage, damages=DAMAGES):
    """Remove the run's tokenizer.json ("missing") or write the damage named (``damages``); returns its path."""
    tok = run / "tokenizer.json"
    if damages[damage] is None:
        tok.unlink()
    else:
        tok.write_text(damages[damage], encoding="utf-8")
    return tok


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("command", sorted(READERS))
def test_every_reader_refuses_a_lost_or_damaged_tokenizer_json_alike(text_run, tmp_path, run_cli, damage, command):
    """Was: eval and resume took a `{}` as no tokenizer (resume rewrote tokenizer.json from the data), export
    wrote a model without its tokenizer, analyze failed with a bug's traceback."""
    run = tmp_path / "run"
    shutil.copytree(text_run / "run", run)
    tok = damage_tokenizer_json(run, damage)
    before = snapshot(run)
    rc, _, err = run_cli(*[a.format(run=run, tmp=tmp_path) for a in READERS[command]])
    line = one_error_line(rc, err, command)
    assert EXPECTED[damage].format(tok=tok) in line, line
    assert "from a copy of the run folder" in line and "cannot be rebuilt safely" in line, line
    assert snapshot(run) == before                      # tokenizer.json neither rewritten nor made
    assert not (tmp_path / "exported").exists() and not (tmp_path / "report").exists()


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_numformer_load_refuses_a_lost_or_damaged_tokenizer_json_as_the_commands_do(text_run, tmp_path, damage):
    """Was: numformer.load(run) (the Python API) returned the model with tokenizer None for a lost
    tokenizer.json, and the empty-object and unknown-type damages were found only when the tokenizer was used."""
    run = tmp_path / "run"
    shutil.copytree(text_run / "run", run)
    tok = damage_tokenizer_json(run, damage)
    with pytest.raises(ValueError) as e:
        numformer.load(run)
    assert EXPECTED[damage].format(tok=tok) in str(e.value)
    assert "cannot be rebuilt safely" in str(e.value)


@pytest.mark.parametrize("damage", sorted(DAMAGES) + ["fields missing"])
def test_the_python_analysis_refuses_a_lost_or_damaged_tokenizer_json_in_one_error(text_run, tmp_path, damage):
    """Was: numformer.analysis.analyze_run (the Python API behind `numformer analyze`) read tokenizer.json without
    the commands' checks: a lost one gave a report without words, a damaged one a KeyError from deep inside."""
    from numformer.analysis import analyze_run

    run = tmp_path / "run"
    shutil.copytree(text_run / "run", run)
    tok = damage_tokenizer_json(run, damage, {**DAMAGES, "fields missing": '{"type": "char"}'})
    with pytest.raises(ValueError) as e:
        analyze_run(run, out=tmp_path / "report", ablation=False, occlusion=False)
    expected = EXPECTED.get(damage, "tokenizer file {tok} is damaged (KeyError")
    assert expected.format(tok=tok) in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "report").exists()


def test_fine_tuning_from_a_run_that_lost_its_tokenizer_json_is_refused(text_run, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(text_run / "run", source)
    (source / "tokenizer.json").unlink()
    config = {"model": {"init_from": str(source)}, "data": {"task": "text", "path": str(text_run / "b.txt"),
                                                            "block_size": 8}, "train": BASE["train"]}
    with pytest.raises(ValueError, match=rf"^{source / 'tokenizer.json'} is missing"):
        Trainer(config, tmp_path / "ft", quiet=True)
    assert not (tmp_path / "ft").exists()


@pytest.fixture(scope="module")
def classifier_and_translator(tmp_path_factory):
    root = tmp_path_factory.mktemp("readers")
    rng = np.random.default_rng(0)
    words = {"sport": "match goal team", "money": "bank stock price"}
    rows = [(" ".join(rng.choice(words[label].split(), 4)), label) for label in list(words) * 40]
    (root / "labels.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{lab}\n" for t, lab in rows), encoding="utf-8")
    pairs = [" ".join(str(d) for d in rng.integers(0, 10, 4)) for _ in range(80)]
    (root / "pairs.tsv").write_text("".join(f"{s}\t{' '.join(reversed(s.split()))}\n" for s in pairs),
                                    encoding="utf-8")
    small = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}
    train = {"max_steps": 1, "batch_size": 4, "eval_every": 1, "processes": 1, "eval_batches": 1}
    Trainer({"model": {"type": "classifier", **small}, "train": train,
             "data": {"task": "classification", "path": str(root / "labels.tsv"), "min_freq": 1, "max_len": 8}},
            root / "classifier", quiet=True).train()
    Trainer({"model": {"type": "transformer", **small}, "train": train,
             "data": {"task": "translation", "train": [str(root / "pairs.tsv")], "min_freq": 1, "max_len": 8,
                      "val_size": 8, "test_size": 8}}, root / "translator", quiet=True).train()
    return root


@pytest.mark.parametrize("damage", ["missing", "empty", "unknown type"])
@pytest.mark.parametrize("command, name, task", [("classify", "classifier", "classification"),
                                                 ("translate", "translator", "translation")])
def test_classify_and_translate_refuse_it_alike(classifier_and_translator, tmp_path, run_cli, damage, command, name,
                                                task):
    run = tmp_path / name
    shutil.copytree(classifier_and_translator / name, run)
    tok = damage_tokenizer_json(run, damage)
    line = one_error_line(*run_cli(command, run, "1 2 3")[::2], command)
    assert EXPECTED[damage].format(tok=tok).replace("'text'", repr(task)) in line, line


@register_task("test_without_tokenizer")
class NoTokenizerTask(Task):
    """A task that keeps no tokenizer (``Task.tokenizer_state`` not defined): its runs have no tokenizer.json."""

    model_type = "gpt"
    data_keys = {"vocab": 5}

    def model_config(self):
        return {"vocab_size": self.config["vocab"], "block_size": 4}

    def train_batch(self, batch_size, rng):
        seq = rng.integers(0, self.config["vocab"], (batch_size, 5))
        return Batch({"idx": seq[:, :-1]}, seq[:, 1:])

    def eval_batches(self, split, batch_size):
        yield self.train_batch(batch_size, np.random.default_rng(0))


def test_a_task_without_a_tokenizer_needs_no_tokenizer_json(tmp_path):
    config = {**BASE, "data": {"task": "test_without_tokenizer"}}
    Trainer(config, tmp_path / "run", quiet=True).train()
    assert not (tmp_path / "run" / "tokenizer.json").exists()
    trainer = Trainer(None, tmp_path / "run", resume=True, overrides=["train.max_steps=6"], quiet=True)
    trainer.train()
    trainer.close()
    assert trainer.step == 6 and isinstance(load_task(tmp_path / "run"), NoTokenizerTask)
