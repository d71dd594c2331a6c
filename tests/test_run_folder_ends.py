"""How a run folder's training ends and is resumed: the weights file replaced without a gap, the readers'
note on the weights they use, the signals of the final phase, the wall time, and the ends a resume leaves as
they are (max_steps, the time limit, the time budget) or finishes (an interrupted run at its max_steps)."""
from __future__ import annotations

import hashlib
import json

import pytest

from numformer.cli import main
from numformer.run_files import CHECKPOINT, MODEL, weights_step
from numformer.train import Trainer
from numformer.train import evaluation as evaluation_module
from numformer.train import run_writer
from numformer.train.run_folder import KEPT_SELECTION


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
