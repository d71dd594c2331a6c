"""provenance.git_commit: a run names the code its process loaded, not the checkout's state when it ends."""
import json
import subprocess

import pytest

import numformer.provenance as provenance
from numformer.train import Trainer


class MovingCheckout:
    """A stand-in for the checkout: at ``commit`` until ``move(to)`` is called."""

    def __init__(self, commit):
        self.commit = commit

    def __call__(self):
        return self.commit

    def move(self, to):
        self.commit = to


@pytest.fixture
def checkout(monkeypatch):
    fake = MovingCheckout("aaa1111")
    monkeypatch.setattr(provenance, "_checkout_commit", fake)
    monkeypatch.setattr(provenance, "_first_commit", {})      # a fresh process
    return fake


def test_the_first_commit_of_a_process_is_kept_and_a_moved_checkout_marks_it_dirty(checkout):
    assert provenance.git_commit() == "aaa1111"
    assert provenance.git_commit() == "aaa1111"
    checkout.move("bbb2222")
    assert provenance.git_commit() == "aaa1111+dirty"
    checkout.move("aaa1111")          # back where it started: it may have loaded the other's files meanwhile
    assert provenance.git_commit() == "aaa1111+dirty"


def test_a_dirty_start_stays_dirty_and_no_checkout_stays_none(checkout, monkeypatch):
    checkout.move("aaa1111+dirty")
    assert provenance.git_commit() == "aaa1111+dirty"
    checkout.move("bbb2222")
    assert provenance.git_commit() == "aaa1111+dirty"
    monkeypatch.setattr(provenance, "_first_commit", {})
    checkout.move(None)
    assert provenance.git_commit() is None
    checkout.move("ccc3333")          # a checkout appearing later says nothing about the code loaded
    assert provenance.git_commit() is None


def test_a_commit_that_leaves_src_and_configs_alone_moves_nothing(tmp_path, monkeypatch):
    """A docs or results commit made while a run trains keeps its commit clean; a change to src/ (or an edit
    not yet committed) marks it "+dirty"."""
    repo = tmp_path / "repo"
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "docs").mkdir()

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                       capture_output=True)

    def commit(path, text):
        (repo / path).write_text(text)
        git("add", "-A")
        git("commit", "-q", "-m", path)
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    started = commit("src/pkg/model.py", "x = 1\n")
    monkeypatch.setattr(provenance, "_PACKAGE", repo / "src" / "pkg")
    monkeypatch.setattr(provenance, "_first_commit", {})
    assert provenance.git_commit() == started
    docs = commit("docs/page.md", "a page\n")
    assert provenance.git_commit() == started
    (repo / "src" / "pkg" / "model.py").write_text("x = 2\n")         # edited, not committed
    assert provenance.git_commit() == started + "+dirty"
    monkeypatch.setattr(provenance, "_first_commit", {})                   # a process started now
    assert provenance.git_commit() == docs + "+dirty"
    moved = commit("src/pkg/model.py", "x = 2\n")
    monkeypatch.setattr(provenance, "_first_commit", {"first": started})
    assert provenance.git_commit() == started + "+dirty" and moved != started
    assert provenance.same_source(started, docs) and not provenance.same_source(docs, moved)
    assert not provenance.same_source(started, started + "+dirty") and not provenance.same_source(started, "0000000")


def _config():
    return {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
            "data": {"task": "copy", "length": 4, "n_val": 16, "n_test": 16},
            "train": {"max_steps": 4, "batch_size": 4, "eval_every": 2, "processes": 1}}


@pytest.mark.parametrize("moves", [False, True])
def test_a_run_records_the_commit_it_started_with(tmp_path, checkout, moves):
    trainer = Trainer(_config(), tmp_path / "run", quiet=True)
    if moves:                         # e.g. a commit made while a long run trains
        checkout.move("bbb2222")
    trainer.train()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["commit"] == ("aaa1111+dirty" if moves else "aaa1111")


def test_the_commit_read_from_this_checkout_is_its_head():
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=provenance._PACKAGE)
    if head.returncode != 0:
        pytest.skip("numformer's source is not in a git checkout here")
    assert provenance._checkout_commit().removesuffix("+dirty") == head.stdout.strip()
