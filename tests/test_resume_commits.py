"""A run resumed by other code than trained it before says so: the checkpoint keeps the commits that trained the
run, the resume prints a note, summary.json lists them, and ``numformer reproduce`` reuses no such run (its summary
named the last commit alone, so a run trained partly by other code passed as this code's)."""
from __future__ import annotations

import json

import numpy as np

from numformer.config import load_config
from numformer.experiments._runs import reusable_run
from numformer.train import Trainer
from numformer.train import final, trainer as trainer_module
from numformer.train.state import commits_after_resume

from conftest import tiny_text_toml


def _config(tmp_path):
    (tmp_path / "small.txt").write_text("It is a truth universally acknowledged. " * 80, encoding="utf-8")
    (tmp_path / "text.toml").write_text(tiny_text_toml(tmp_path / "small.txt", max_steps=6), encoding="utf-8")
    return load_config(tmp_path / "text.toml")


def _at(monkeypatch, commit):
    for module in (trainer_module, final):
        monkeypatch.setattr(module, "git_commit", lambda: commit)


def test_the_commits_of_a_resumed_run_are_kept_and_named(tmp_path, monkeypatch, capsys):
    config, run = _config(tmp_path), tmp_path / "run"
    _at(monkeypatch, "aaaaaaa")
    Trainer(config, run, quiet=True).train(stop_after=2)
    Trainer(None, run, resume=True, quiet=True).train(stop_after=2)          # the same code: nothing to say
    assert "the code changed" not in "".join(capsys.readouterr())
    _at(monkeypatch, "bbbbbbb")
    resumed = Trainer(None, run, resume=True)
    summary = resumed.train()
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "note: this run was trained to step 4 by commit aaaaaaa and goes on with commit bbbbbbb" in out
    assert summary["commit"] == "bbbbbbb" and summary["commits"] == ["aaaaaaa", "bbbbbbb"]
    assert json.loads((run / "summary.json").read_text())["commits"] == ["aaaaaaa", "bbbbbbb"]
    resolved = json.loads((run / "config.json").read_text())
    summary_none, why = reusable_run(run, resolved, "bbbbbbb")
    assert summary_none is None and "more than one version of numformer (commits aaaaaaa, bbbbbbb)" in why


def test_a_run_of_one_commit_lists_none_and_old_checkpoints_count_as_this_code():
    said = []
    assert commits_after_resume(["c1"], "c1", 5, said.append) == ["c1"] and said == []
    assert commits_after_resume(None, "c2", 5, said.append) == ["c2"] and said == []
    assert commits_after_resume(["c1", "c2"], "c3", 9, said.append) == ["c1", "c2", "c3"]
    assert said == ["note: this run was trained to step 9 by commit c2 and goes on with commit c3 (the code "
                    "changed): summary.json lists both"]
    assert np.all([isinstance(c, str) for c in commits_after_resume([None], "c1", 1, said.append)[1:]])


def test_a_later_trainer_of_this_process_takes_the_folder_and_the_earlier_one_stops(tmp_path):
    """Locks are re-entrant within a process: a second Trainer with overwrite=True deleted a live Trainer's run,
    and the first then wrote its steps into the second's metrics.jsonl under its own config.json."""
    import pytest

    from numformer.train.run_folder import RunFolderBusy

    config, run = _config(tmp_path), tmp_path / "run"
    first = Trainer(config, run, quiet=True)
    first.train(stop_after=2)
    other = json.loads(json.dumps(config))
    other["model"]["d_model"] = 8
    second = Trainer(other, run, overwrite=True, quiet=True)
    second.train(stop_after=2)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(RunFolderBusy, match="was taken by another run of this process"):
        first.train()
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert json.loads((run / "config.json").read_text())["model"]["d_model"] == 8
    second.train()                                                   # the later one goes on
    resumed = Trainer(None, run, resume=True, quiet=True)          # and a resume after it takes the folder in turn
    assert resumed.step == 6
