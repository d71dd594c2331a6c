"""How a run folder's training ends and is resumed: the weights file replaced without a gap, the readers'
note on the weights they use, the signals of the final phase, a closed output, the wall time, and the ends a
resume leaves as they are (max_steps, the time limit, the time budget) or finishes (an interrupted run at its
max_steps)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys

import pytest

from numformer.cli import main
from numformer.run_files import CHECKPOINT, MODEL, weights_step
from numformer.train import Trainer
from numformer.train import evaluation as evaluation_module
from numformer.train import run_writer
from numformer.train.run_folder import KEPT_SELECTION

from numformer.train import stop_signals

from conftest import ctrl_c_during_step, src_env


def cfg(**train):
    """A 1-layer GPT on the copy task of length 4: a run of a few dozen steps takes about a second."""
    return {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
            "data": {"task": "copy", "length": 4, "n_val": 16, "n_test": 16},
            "train": {"max_steps": 12, "batch_size": 8, "eval_every": 2, "checkpoint_every": 100,
                      "log_every": 5, "processes": 1, **train}}


def digests(run_dir, names=("summary.json", MODEL, CHECKPOINT, "metrics.jsonl")):
    return {n: hashlib.md5((run_dir / n).read_bytes()).hexdigest() for n in names if (run_dir / n).exists()}


def fixed_losses(monkeypatch, losses, on):
    """The validation loss of the step ``on["trainer"]`` is at: ``losses[step]``, else 3.0."""
    monkeypatch.setattr(evaluation_module, "mean_loss",
                        lambda *a, **k: (losses.get(on["trainer"].step, 3.0), 100))


# -- model.safetensors is replaced without a gap -------------------------------------------------
def test_a_kill_while_a_new_best_is_saved_leaves_model_safetensors(tmp_path, monkeypatch):
    """The checkpoint of step 4 selected step 2; step 6 is a new best. Killed while step 6's file is written,
    the folder still has a model.safetensors (step 2's; before: it had been renamed aside first, and the
    kill left none, so readers fell back to the checkpoint's weights), and --resume goes on from it."""
    run, on = tmp_path / "run", {"trainer": None}
    fixed_losses(monkeypatch, {2: 2.0, 4: 2.5, 6: 1.5}, on)
    trainer = on["trainer"] = Trainer(cfg(), run, quiet=True)
    trainer.train(stop_after=4)
    assert weights_step(run / MODEL) == 2
    real = run_writer.save_model

    def killed_while_writing(path, model, metadata=None):
        if metadata.get("step") == 6:
            raise KeyboardInterrupt("killed")       # the new file never replaces the old one
        return real(path, model, metadata)
    monkeypatch.setattr(run_writer, "save_model", killed_while_writing)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(stop_after=2)
    trainer.close()
    assert weights_step(run / MODEL) == 2 and weights_step(run / KEPT_SELECTION) == 2
    monkeypatch.setattr(run_writer, "save_model", real)
    resumed = on["trainer"] = Trainer(None, run, resume=True, quiet=True)
    assert resumed.step == 4 and resumed.train()["steps"] == 12


def test_readers_without_model_safetensors_say_they_use_the_checkpoint(tmp_path, capsys):
    """A run stopped before any evaluation saved weights: eval reads the checkpoint's weights, and one note
    line on stderr names that file and its step (before: silently)."""
    run = tmp_path / "run"
    trainer = Trainer(cfg(eval_every=100, checkpoint_every=3), run, quiet=True)
    trainer.train(stop_after=3)
    trainer.close()
    (run / MODEL).unlink()          # the last weights a stop saves: as if killed before it wrote them
    (run / "summary.json").unlink()
    capsys.readouterr()
    assert main(["eval", str(run), "--json"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {run} has no {MODEL}; using the last weights, those of {run / CHECKPOINT} (step 3)"]


# -- the stop signals through the final phase ------------------------------------------------------
@pytest.fixture
def signal_in_final_scoring(monkeypatch):
    """``send(signum)``: the whole-split scoring of the final phase (``Evaluation.whole_val_loss``) sends that
    signal to this process, once. SIGTERM's handler meanwhile raises (the default would end pytest):
    a run that left it in place during its final phase fails the test rather than the session."""
    import os
    import signal

    sent, signals, real = [], [], evaluation_module.Evaluation.whole_val_loss

    def whole_val_loss(self, step):
        if not sent:
            sent.append(step)
            for s in signals:
                os.kill(os.getpid(), s)
        return real(self, step)
    monkeypatch.setattr(evaluation_module.Evaluation, "whole_val_loss", whole_val_loss)

    def default_term(signum, frame):
        raise RuntimeError("SIGTERM reached the handler the run had before it")
    previous = signal.signal(signal.SIGTERM, default_term)
    yield signals.append
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_during_the_final_scoring_writes_an_interrupted_summary(tmp_path, signal_in_final_scoring,
                                                                          capsys):
    """SIGTERM after the last step, while the kept weights are scored on the whole split: the scoring is
    abandoned, summary.json says interrupted, the exit code is 143 (before: the run's handler was already
    gone, so SIGTERM killed it with no summary); --resume then finishes the run's end."""
    import signal

    run, toml = tmp_path / "run", tmp_path / "c.toml"
    toml.write_text("\n".join(["[model]", 'type = "gpt"', "n_layers = 1", "n_heads = 2", "d_model = 16",
                               "[data]", 'task = "copy"', "length = 4", "n_val = 16", "n_test = 16", "[train]",
                               "max_steps = 6", "batch_size = 8", "eval_every = 2", "processes = 1", ""]),
                    encoding="utf-8")
    signal_in_final_scoring(signal.SIGTERM)
    rc = main(["train", str(toml), "--out", str(run)])
    err = capsys.readouterr().err
    assert rc == 128 + signal.SIGTERM, err
    assert "SIGTERM: stopping the final scoring and writing summary.json (send it again to abort)" in err
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["interrupted"] and summary["stopped_by"] == "interrupted" and summary["steps"] == 6
    assert summary["best_val_loss"] is None and summary["best_step"] == weights_step(run / MODEL)
    assert main(["train", "--out", str(run), "--resume", "--quiet"]) == 0
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["stopped_by"] == "max_steps" and summary["best_val_loss"] is not None
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sum(1 for r in metrics if r["step"] == 6 and "val_loss" in r) == 1     # not evaluated twice


def test_a_second_ctrl_c_during_the_final_scoring_aborts_naming_the_checkpoint(tmp_path, monkeypatch,
                                                                                signal_in_final_scoring, capsys):
    """Ctrl-C during step 8 stops the run; a second Ctrl-C while its kept weights are scored aborts it with the
    one line naming the checkpoint kept (before: the handler was gone, KeyboardInterrupt without a word)."""
    import signal

    run = tmp_path / "run"
    trainer = Trainer(cfg(), run)
    ctrl_c_during_step(trainer, monkeypatch, 8)
    signal_in_final_scoring(signal.SIGINT)
    capsys.readouterr()
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"Ctrl-C again: aborted after step 8; the checkpoint of step 8 is kept: numformer train "
                    f"--out {run} --resume goes on from it")


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_second_signal_aborts_with_128_plus_its_number(tmp_path, monkeypatch, capsys, signum):
    """Two stop signals during a step: the run aborts after it, keeping its checkpoint, and the command exits
    with 128 + that signal's number as the first signal's stop does (before: 130, Ctrl-C's, for every signal)."""
    run, toml = tmp_path / "run", tmp_path / "c.toml"
    toml.write_text("\n".join(["[model]", 'type = "gpt"', "n_layers = 1", "n_heads = 2", "d_model = 16",
                               "[data]", 'task = "copy"', "length = 4", "n_val = 16", "n_test = 16", "[train]",
                               "max_steps = 8", "batch_size = 8", "eval_every = 4", "checkpoint_every = 2",
                               "processes = 1", ""]), encoding="utf-8")
    real = Trainer._train_step

    def step_then_signal_twice(self):
        out = real(self)
        if self.step == 4:
            os.kill(os.getpid(), signum)
            os.kill(os.getpid(), signum)
        return out
    monkeypatch.setattr(Trainer, "_train_step", step_then_signal_twice)
    previous = signal.getsignal(signum)
    try:
        rc = main(["train", str(toml), "--out", str(run)])
    finally:
        signal.signal(signum, previous)
    err = capsys.readouterr().err
    assert rc == 128 + signum, err
    assert f"{stop_signals.name(signum)} again: aborted after step" in err and "is kept" in err


def test_ctrl_c_while_the_command_line_is_read_is_no_traceback(monkeypatch, capsys):
    """Ctrl-C in the first moments, while the parser is built (it imports the experiments): exit code 130, no
    traceback (before: 35 lines of one)."""
    import numformer.cli as cli

    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["train", "--help"]) == 130
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(signal, "SIGPIPE"), reason="a closed pipe is a POSIX signal")
def test_a_closed_output_stops_the_run_after_its_step_with_a_checkpoint(tmp_path):
    """`numformer train ... 2>&1 | head -2`: the reader goes away, and the first write that fails asks the run to
    stop after its step as a signal does: a checkpoint, an interrupted summary.json, exit code 141 (128 +
    SIGPIPE), and --resume goes on (before: the run died at that write, losing the steps since its last
    checkpoint)."""
    run, toml = tmp_path / "run", tmp_path / "c.toml"
    toml.write_text("\n".join(["[model]", 'type = "gpt"', "n_layers = 1", "n_heads = 2", "d_model = 16",
                               "[data]", 'task = "copy"', "length = 4", "n_val = 16", "n_test = 16", "[train]",
                               "max_steps = 1500", "batch_size = 8", "eval_every = 1500", "log_every = 1",
                               "processes = 1", ""]), encoding="utf-8")
    train = subprocess.Popen([sys.executable, "-m", "numformer.cli", "train", str(toml), "--out", str(run)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=src_env())
    first = [train.stdout.readline() for _ in range(2)]
    train.stdout.close()                                        # `head -2` exits
    assert train.wait(timeout=300) == 128 + signal.SIGPIPE, first
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["interrupted"] and 0 < summary["steps"] < 1500
    assert (run / CHECKPOINT).is_file()
    stopped_at = summary["steps"]
    assert main(["train", "--out", str(run), "--resume", "--quiet"]) == 0
    assert json.loads((run / "summary.json").read_text(encoding="utf-8"))["steps"] == 1500
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert steps.count(1) == steps.count(stopped_at + 1) == 1  # resumed from the checkpoint, not from step 0


class ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")
def test_a_closed_output_asks_once_and_not_after_a_signal(monkeypatch):
    """Both streams closed: one request (SIGPIPE), the writes then silent; after a signal (Ctrl-C also ends
    `| head`) a closed output asks nothing more, so it never counts as a second, aborting signal."""
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    monkeypatch.setattr(sys, "stderr", ClosedPipe())
    broken = sys.stdout, sys.stderr
    asked = []
    restore = stop_signals.install(asked.append, ())
    print("a progress line", file=sys.stderr, flush=True)
    print("and another", flush=True)
    assert asked == [signal.SIGPIPE] and sys.stderr.write("quiet now") == len("quiet now")
    restore()
    assert (sys.stdout, sys.stderr) == broken
    asked.clear()
    restore = stop_signals.install(asked.append, (signal.SIGUSR1,))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        print("Ctrl-C: finishing this step", file=sys.stderr)
    finally:
        restore()
    assert asked == [signal.SIGUSR1]


def test_wall_seconds_include_the_final_phase(tmp_path, monkeypatch, fake_clock):
    """summary.json's wall_seconds is the whole call's, the final scoring included (before: measured before
    it); here that scoring costs 1000 s of a fake clock."""
    real = evaluation_module.Evaluation.whole_val_loss

    def slow_whole_val_loss(self, step):
        fake_clock.now += 1000
        return real(self, step)
    monkeypatch.setattr(evaluation_module.Evaluation, "whole_val_loss", slow_whole_val_loss)
    summary = Trainer(cfg(max_steps=4), tmp_path / "run", quiet=True).train()
    assert summary["wall_seconds"] >= 1000


# -- a resumed run that had ended ------------------------------------------------------------------
def test_resuming_a_run_stopped_by_max_minutes_trains_nothing(tmp_path, monkeypatch, fake_clock, capsys):
    """A run stopped by its time limit (each step costs 10 s of a fake clock; max_minutes = 1), resumed without
    a larger max_minutes: nothing trains and its files stay byte for byte (before: one more step each time)."""
    run = tmp_path / "run"
    trainer = Trainer(cfg(max_steps=1000, max_minutes=1.0), run, quiet=True)
    real = trainer._train_step

    def costly_step():
        fake_clock.now += 10
        return real()
    monkeypatch.setattr(trainer, "_train_step", costly_step)
    summary = trainer.train()
    trainer.close()
    assert summary["stopped_by"] == "time limit"
    before = digests(run)
    capsys.readouterr()
    resumed = Trainer(None, run, resume=True)
    assert resumed.train()["steps"] == summary["steps"]
    assert digests(run) == before
    assert "the time limit of max_minutes = 1 is reached" in capsys.readouterr().err
    resumed.close()
    more = Trainer(None, run, resume=True, quiet=True, overrides=["train.max_minutes=2"])
    assert more.train(stop_after=1)["steps"] == summary["steps"] + 1          # raised, it trains on


def test_resuming_a_run_ended_by_its_time_budget_leaves_its_files(tmp_path, monkeypatch, fake_clock):
    """A run that ended on its time budget, resumed with the same budget: summary.json (its wall time), the
    weights, the checkpoint and the metrics stay byte for byte (before: the final phase ran again)."""
    from numformer.train.trainer import Trainer as TrainerClass

    real = TrainerClass._train_step

    def costly_step(self):
        fake_clock.now += 1
        return real(self)
    monkeypatch.setattr(TrainerClass, "_train_step", costly_step)
    run = tmp_path / "run"
    summary = Trainer(cfg(max_steps=100000, budget_minutes=0.5, eval_every=10), run, quiet=True).train()
    assert summary["stopped_by"] == "time budget" and summary["steps"] > 0
    before = digests(run)
    assert Trainer(None, run, resume=True, quiet=True).train() == summary
    assert digests(run) == before


def test_an_interrupted_run_resumed_at_its_max_steps_ends_as_at_max_steps(tmp_path, monkeypatch):
    """Ctrl-C during step 8, then --resume --set train.max_steps=8: the run ends as one that reached max_steps
    there: a regular training line and an evaluation at step 8 (evaluated every 3), no partial line,
    summary.json stopped_by max_steps (before: 'nothing to train', then the partial line stayed and no
    evaluation of step 8 ran); and it is then over: a further --resume leaves its files."""
    run = tmp_path / "run"
    trainer = Trainer(cfg(eval_every=3), run, quiet=True)
    ctrl_c_during_step(trainer, monkeypatch, 8)
    assert trainer.train()["steps"] == 8
    trainer.close()
    resumed = Trainer(None, run, resume=True, quiet=True, overrides=["train.max_steps=8"])
    summary = resumed.train()
    resumed.close()
    assert summary["stopped_by"] == "max_steps" and summary["steps"] == 8 and not summary["interrupted"]
    at_8 = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
            if json.loads(line)["step"] == 8]
    assert [sorted(k for k in r if k in ("train_loss", "val_loss", "partial")) for r in at_8] == [
        ["train_loss"], ["val_loss"]]
    before = digests(run)
    again = Trainer(None, run, resume=True, quiet=True)
    assert again.train() == summary and digests(run) == before


# -- a checkpoint that is not of the run's history ---------------------------------------------------
def resume_refusal(run):
    """The one line of the ValueError that --resume of ``run`` stops with."""
    with pytest.raises(ValueError) as e:
        Trainer(None, run, resume=True, quiet=True)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_checkpoint_copied_from_another_run_is_refused_naming_both_steps(tmp_path):
    """A checkpoint of step 12 copied from another run (same config) into a folder whose metrics.jsonl ends
    at step 4: --resume refuses in one line naming both steps and the fix (before: resumed without a word,
    metrics.jsonl jumping from 4 to 13)."""
    import shutil

    other, run = tmp_path / "other", tmp_path / "run"
    Trainer(cfg(), other, quiet=True).train()
    trainer = Trainer(cfg(), run, quiet=True)
    trainer.train(stop_after=4)
    trainer.close()
    Trainer(None, run, resume=True, quiet=True).close()         # its own checkpoint resumes
    shutil.copyfile(other / CHECKPOINT, run / CHECKPOINT)
    assert resume_refusal(run) == (
        f"checkpoint {run / CHECKPOINT} is at step 12, but {run / 'metrics.jsonl'} ends at step 4: they are not "
        f"of one run (its metrics went to step 12); put back this run's checkpoint or metrics.jsonl, or start "
        f"afresh with --overwrite")
    (run / "metrics.jsonl").unlink()        # a lost metrics.jsonl is named as lost, not as another run's
    with pytest.raises(ValueError, match=r"is at step 12, but .*metrics\.jsonl is missing \(its run logged to "
                                         r"step 12\): put back this run's metrics\.jsonl"):
        Trainer(None, run, resume=True, quiet=True)


def test_a_checkpoint_of_another_run_at_a_step_the_metrics_reach_is_refused(tmp_path):
    """A checkpoint of step 8 copied from another run of the same config and seed into a folder whose
    metrics.jsonl goes to step 12: the lines before step 8 are not the ones its run logged (their timings
    differ), so --resume refuses in one line (before: it resumed, and the folder mixed two runs); the run's own
    checkpoint still resumes."""
    import shutil

    from numformer.run_files import load_metadata

    other, run = tmp_path / "other", tmp_path / "run"
    for folder, steps in ((other, 8), (run, 12)):
        trainer = Trainer(cfg(log_every=2), folder, quiet=True)
        trainer.train(stop_after=steps)
        trainer.close()
    own = (run / CHECKPOINT).read_bytes()
    shutil.copyfile(other / CHECKPOINT, run / CHECKPOINT)
    state = json.loads(load_metadata(run / CHECKPOINT, "checkpoint")["state"])
    assert state["metrics_step"] == 8 and state["step"] == 8        # the step check alone passes it
    assert resume_refusal(run) == (
        f"checkpoint {run / CHECKPOINT} is at step 8, but the lines of {run / 'metrics.jsonl'} before that step are "
        f"not the ones its run logged: they are not of one run (a checkpoint or metrics.jsonl of another run, or "
        f"lines edited by hand); put back this run's checkpoint or metrics.jsonl, or start afresh with --overwrite")
    (run / CHECKPOINT).write_bytes(own)             # the run's own checkpoint, of step 12, resumes
    Trainer(None, run, resume=True, quiet=True).close()


def test_the_digest_a_checkpoint_records_is_that_of_the_file_read_whole(tmp_path, monkeypatch):
    """The writer hashes each metrics line as it logs it (run_folder.History); the digest it records at each
    checkpoint, over training and evaluation lines, a stop's partial line and a resume, is the one the file read
    whole gives (what --resume compares)."""
    from numformer.run_files import load_metadata
    from numformer.train.run_folder import History

    run = tmp_path / "run"
    config = cfg(log_every=3, eval_every=4, checkpoint_every=5)
    seen = []
    real = run_writer.RunWriter.save_checkpoint

    def recording(self, model, optimizer, state, config):
        real(self, model, optimizer, state, config)
        recorded = json.loads(load_metadata(run / CHECKPOINT, "checkpoint")["state"])
        seen.append(recorded["metrics_digest"] == History.of_file(run / "metrics.jsonl").digest(state["step"]))

    monkeypatch.setattr(run_writer.RunWriter, "save_checkpoint", recording)
    trainer = Trainer(config, run, quiet=True)
    trainer.train(stop_after=7)                     # a stop at step 7: its partial line and checkpoint
    trainer.close()
    Trainer(None, run, resume=True, quiet=True).train()
    assert len(seen) >= 4 and all(seen)


def test_a_signal_between_the_weights_scoring_and_the_test_scoring_abandons_the_test_scoring(tmp_path,
                                                                                             monkeypatch):
    """SIGTERM after the kept weights were scored and before the test split is: the line says the final
    scoring stops, so the test scoring is not run either (before: it ran in full and the run was not marked
    interrupted), and the run ends as an interrupted one, which --resume finishes."""
    import os
    import signal

    from numformer.train import final

    real, calls = final.abandonable, []

    def then_a_signal(trainer, work):
        out = real(trainer, work)
        if not calls:
            calls.append(1)
            os.kill(os.getpid(), signal.SIGTERM)
        return out
    monkeypatch.setattr(final, "abandonable", then_a_signal)
    run = tmp_path / "run"
    trainer = Trainer(cfg(), run, quiet=True)
    trainer.evaluation.reports_test = True      # as a classifier's or a translator's task: a test scoring
    summary = trainer.train()
    trainer.close()
    assert calls and summary["interrupted"] and "test" not in summary and summary["steps"] == 12, summary
    monkeypatch.setattr(final, "abandonable", real)
    resumed = Trainer(None, run, resume=True, quiet=True)
    resumed.evaluation.reports_test = True
    finished = resumed.train()
    resumed.close()
    assert not finished["interrupted"] and "test" in finished


def test_a_refused_resume_prints_no_note_of_the_changes_it_would_have_made(tmp_path, monkeypatch, capsys):
    """The notes on what --set changes in a resumed run come once the run is accepted: a resume refused by
    a later check (as DPO under MPI is) says only why (before: "note: max_steps 12 -> 16 in effect" first)."""
    import numformer.train.trainer as trainer_module

    run = tmp_path / "run"
    trainer = Trainer(cfg(), run, quiet=True)
    trainer.train(stop_after=4)
    trainer.close()

    def refuse(*args):
        raise ValueError("refused by a later check")
    monkeypatch.setattr(trainer_module, "check_objective", refuse)
    capsys.readouterr()
    with pytest.raises(ValueError, match="refused by a later check"):
        Trainer(None, run, resume=True, overrides=["train.max_steps=16"])
    assert "note:" not in capsys.readouterr().err
    monkeypatch.undo()
    capsys.readouterr()
    Trainer(None, run, resume=True, overrides=["train.max_steps=16"]).close()
    assert "max_steps 12 -> 16" in capsys.readouterr().err
