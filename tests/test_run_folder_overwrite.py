"""Overwrite consistency: a run folder holds one run. A new run that dies before its first checkpoint leaves
no trace of the run it replaced; a folder holding any run file is never replaced without --overwrite."""
from __future__ import annotations

import json

import pytest

from numformer.train import run_writer, workers
from numformer.run_files import CHECKPOINT, MODEL
from numformer.train.run_folder import RUN_FILES

from conftest import tiny_copy_toml

TINY = tiny_copy_toml(max_steps=6, batch_size=4, eval_every=3, checkpoint_every=3, processes=1)


@pytest.fixture
def old_run(tmp_path, run_cli):
    """A finished run (seed 1) in tmp_path/run; returns (config path, run folder)."""
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    out = tmp_path / "run"
    assert run_cli("train", cfg, "--out", out, "--quiet", "--set", "train.seed=1")[0] == 0
    return cfg, out


def assert_no_trace_of_old_run(out, cli_error):
    assert not (out / CHECKPOINT).exists() and not (out / MODEL).exists()
    assert json.loads((out / "config.json").read_text())["train"]["seed"] == 2       # the new run's config
    assert "has no saved weights" in cli_error("eval", out)
    assert "nothing to resume" in cli_error("train", "--out", out, "--resume")


def test_new_run_that_diverges_before_its_first_checkpoint(old_run, cli_error, monkeypatch):
    cfg, out = old_run
    monkeypatch.setattr(workers, "loss_and_backward", lambda *a, **k: float("nan"))
    line = cli_error("train", cfg, "--out", out, "--overwrite", "--quiet", "--set", "train.seed=2")
    assert "the training loss became nan at step 1" in line and "no checkpoint had been written yet" in line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "diverged" and summary["steps"] == 0 and summary["weights"] is None
    monkeypatch.undo()
    assert_no_trace_of_old_run(out, cli_error)


def test_new_run_aborted_before_its_first_checkpoint(old_run, run_cli, cli_error, monkeypatch):
    cfg, out = old_run

    def abort(*a, **k):
        raise KeyboardInterrupt          # a second Ctrl-C: stop at once, no checkpoint

    monkeypatch.setattr(workers, "loss_and_backward", abort)
    rc, _, err = run_cli("train", cfg, "--out", out, "--overwrite", "--quiet", "--set", "train.seed=2")
    assert rc == 130 and "Traceback" not in err
    monkeypatch.undo()
    assert_no_trace_of_old_run(out, cli_error)
    assert not (out / "summary.json").exists() and not (out / "metrics.jsonl").exists()


def test_new_run_that_fails_at_its_first_checkpoint(old_run, cli_error, monkeypatch):
    cfg, out = old_run

    def full(*a, **k):
        raise OSError(28, "No space left on device", str(out / CHECKPOINT))

    monkeypatch.setattr(run_writer, "save_checkpoint", full)
    line = cli_error("train", cfg, "--out", out, "--overwrite", "--quiet", "--set", "train.seed=2")
    assert "the disk is full" in line
    monkeypatch.undo()
    assert not (out / CHECKPOINT).exists()
    assert json.loads((out / "config.json").read_text())["train"]["seed"] == 2


@pytest.mark.parametrize("removed", [CHECKPOINT, MODEL, "config.json"])
def test_any_run_file_needs_resume_or_overwrite(old_run, cli_error, removed):
    cfg, out = old_run
    (out / removed).unlink()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    line = cli_error("train", cfg, "--out", out)
    if removed == CHECKPOINT:       # --resume would refuse: only what works is offered
        assert (f"{out} already holds a run; it wrote no checkpoint, so --resume cannot continue it: start afresh "
                f"with --overwrite, or choose another --out") in line
    else:
        assert f"{out} already holds a run; continue it with --resume, or start afresh with --overwrite" in line
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before        # nothing touched


def test_a_folder_with_only_metrics_is_a_run(tmp_path, cli_error):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    assert "already holds a run" in cli_error("train", cfg, "--out", tmp_path / "run")


def test_overwrite_removes_every_file_of_the_old_run_first(old_run, run_cli):
    cfg, out = old_run
    (out / f".{CHECKPOINT}.123.0abc1234.tmp").write_bytes(b"half a checkpoint")  # a write cut short (write_atomic)
    (out / "notes.txt").write_text("mine")                                      # not a run file: kept
    old_metrics = (out / "metrics.jsonl").read_text()
    assert run_cli("train", cfg, "--out", out, "--overwrite", "--quiet", "--set", "train.seed=2",
                   "--set", "train.max_steps=3")[0] == 0
    assert not list(out.glob(".*.tmp")) and (out / "notes.txt").read_text() == "mine"
    assert (out / "metrics.jsonl").read_text() != old_metrics
    assert json.loads((out / "summary.json").read_text())["steps"] == 3


def test_weights_go_before_the_config():
    """An overwrite cut short (a crash while deleting) leaves a config without weights, never a config with
    the old weights under the new config."""
    assert RUN_FILES.index(CHECKPOINT) < RUN_FILES.index("config.json")
    assert RUN_FILES.index(MODEL) < RUN_FILES.index("config.json")
    assert RUN_FILES[-1] == "config.json"


@pytest.mark.parametrize("out", ["tiny.toml", "tiny.toml/sub"])
def test_out_is_a_file(tmp_path, cli_error, out, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(TINY)
    assert "tiny.toml is a file, not a folder" in cli_error("train", "tiny.toml", "--out", out)


def test_overwrite_removes_the_old_runs_analysis_report_and_keeps_other_files(old_run, run_cli):
    """RUN/report, analyze's default output, describes the run --overwrite deletes, so it goes with it (its
    report.md and figures); a file of the user's beside them stays, and so does a report folder of another
    kind (no report.md of numformer's)."""
    cfg, out = old_run
    assert run_cli("analyze", out, "--text", "0 1 2")[0] == 0
    report = out / "report"
    figures = sorted(p.name for p in report.glob("*.png"))
    assert (report / "report.md").read_text().startswith("# Analysis report") and figures
    (report / "notes.txt").write_text("mine")
    assert run_cli("train", cfg, "--out", out, "--overwrite", "--quiet", "--set", "train.seed=2")[0] == 0
    assert sorted(p.name for p in report.iterdir()) == ["notes.txt"]
    (report / "notes.txt").unlink()
    (report / "report.md").write_text("# My own report\n")
    assert run_cli("train", cfg, "--out", out, "--overwrite", "--quiet", "--set", "train.seed=3")[0] == 0
    assert (report / "report.md").read_text() == "# My own report\n"
