"""The trainer: config errors, learning, metrics, checkpoints, exact resume, faults."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ctrl_c_during_step, freeze, tiny_copy_toml
from numformer.cli import main
from numformer.data import Batch, Task, register_task
from numformer.train import EarlyStopping, Trainer, TrainingDiverged, resolve_config, write_atomic
from numformer.train import evaluation as evaluation_module
from numformer.run_files import CHECKPOINT, MODEL
from numformer.train.run_folder import RunFolderBusy


@register_task("test_counting")
class CountingTask(Task):
    """Sequences start, start+k, start+2k, ... (mod V) with k in {1, 2}: learnable in a few dozen steps."""

    model_type = "gpt"
    data_keys = {"vocab": 7, "length": 6}

    def model_config(self):
        return {"vocab_size": self.config["vocab"], "block_size": self.config["length"]}

    def _batch(self, n, rng):
        V, L = self.config["vocab"], self.config["length"]
        start, k = rng.integers(0, V, n), rng.integers(1, 3, n)
        seq = (start[:, None] + k[:, None] * np.arange(L + 1)) % V
        return Batch({"idx": seq[:, :-1]}, seq[:, 1:])

    def train_batch(self, batch_size, rng):
        return self._batch(batch_size, rng)

    def eval_batches(self, split, batch_size):
        rng = np.random.default_rng(0 if split == "val" else 1)
        for _ in range(2):
            yield self._batch(batch_size, rng)

    def evaluate(self, model, split):
        b = next(self.eval_batches(split, 16))
        return {"accuracy": float((model(**b.inputs).argmax(-1) == b.targets).mean())}

    def tokenizer_state(self):
        return {"vocab": self.config["vocab"]}


def config(**train):
    return {
        "model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16, "dropout": 0.1},
        "data": {"task": "test_counting"},
        "train": {"max_steps": 40, "batch_size": 8, "lr": 1e-2, "eval_every": 10, "checkpoint_every": 10,
                  "log_every": 5, "seed": 3, "schedule": "cosine", "warmup_steps": 4, "min_lr": 1e-3,
                  "weight_decay": 0.1, **train},
    }


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def checkpoint_arrays(run_dir):
    from safetensors.numpy import load_file
    return load_file(str(run_dir / CHECKPOINT))


# -- config ----------------------------------------------------------------------------------
def test_resolved_config_fills_defaults_and_data_keys():
    resolved, task = resolve_config(config())
    assert resolved["model"]["vocab_size"] == 7 and resolved["model"]["block_size"] == 6
    assert resolved["model"]["d_ff"] is None and resolved["model"]["tie_weights"] is True
    assert resolved["train"]["optimizer"] == "adamw" and resolved["train"]["grad_clip"] == 1.0
    # the task is registered by this module, which the run records so that reading it imports the module again
    assert resolved["data"] == {"task": "test_counting", "task_module": "test_train", "vocab": 7, "length": 6}


@pytest.mark.parametrize("change,message", [
    (lambda c: c["train"].update(lr_max=1), r"unknown key\(s\) \['lr_max'\] in \[train\]; valid keys: .*'lr'"),
    (lambda c: c["train"].update(max_steps="10"), r"\[train\] max_steps = '10' should be an integer"),
    (lambda c: c["train"].update(lr=True), r"\[train\] lr = True should be a number"),
    (lambda c: c["model"].update(n_layer=2),
     r"unknown key\(s\) \['n_layer'\] in \[model\] \(did you mean 'n_layers'\?\); valid keys: .*n_layers"),
    (lambda c: c["model"].update(d_model=16.5), r"\[model\] d_model = 16.5 should be an integer"),
    (lambda c: c["data"].update(lenght=3),
     r"unknown key\(s\) \['lenght'\] in \[data\] \(did you mean 'length'\?\); valid keys: \['length', 'vocab'\]"),
    (lambda c: c.update(optim={}), r"unknown section\(s\) \['optim'\]"),
    (lambda c: c["data"].update(task="nope"), r"task = 'nope' is not a known task"),
    (lambda c: c["model"].update(vocab_size=9), r"\[model\] \['vocab_size'\] are set by the data"),
    (lambda c: c["model"].update(type="transformer"), r"trains a gpt model, but \[model\] type = 'transformer'"),
    (lambda c: c["train"].update(optimizer="lion"), r"optimizer must be one of"),
])
def test_config_errors_before_any_work(tmp_path, change, message):
    c = config()
    change(c)
    with pytest.raises(ValueError, match=message):
        Trainer(c, tmp_path / "run")
    assert not (tmp_path / "run").exists()


# -- training --------------------------------------------------------------------------------
def test_training_learns_and_logs(tmp_path):
    run = tmp_path / "run"
    summary = Trainer(config(max_steps=60), run, quiet=True).train()
    lines = read_metrics(run)
    train_lines = [r for r in lines if "train_loss" in r]
    eval_lines = [r for r in lines if "val_loss" in r]
    assert {"step", "train_loss", "lr", "grad_norm", "tokens_per_s"} <= set(train_lines[0])
    assert [r["step"] for r in eval_lines] == [10, 20, 30, 40, 50, 60]
    assert "accuracy" in eval_lines[0]
    assert eval_lines[-1]["val_loss"] < 0.6 * eval_lines[0]["val_loss"]
    assert summary["best_val_loss"] == min(r["val_loss"] for r in eval_lines)
    for name in ("config.json", "tokenizer.json", CHECKPOINT, MODEL, "summary.json"):
        assert (run / name).is_file(), name
    saved = json.loads((run / "config.json").read_text())
    assert saved["train"]["max_steps"] == 60 and saved["model"]["vocab_size"] == 7


def test_resume_is_bit_exact_with_dropout(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    Trainer(config(max_steps=40), straight, quiet=True).train()
    first = Trainer(config(max_steps=40), resumed, quiet=True)
    first.train(stop_after=20)
    assert json.loads((resumed / "summary.json").read_text())["steps"] == 20
    Trainer(None, resumed, resume=True, quiet=True).train()
    a, b = checkpoint_arrays(straight), checkpoint_arrays(resumed)
    assert set(a) == set(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k            # weights and optimizer moments, bit for bit
    la = [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in read_metrics(straight)]
    lb = [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in read_metrics(resumed)]
    assert la == lb


def test_existing_run_needs_resume_or_overwrite(tmp_path):
    Trainer(config(max_steps=10), tmp_path, quiet=True).train()
    with pytest.raises(ValueError, match="already holds a run; continue it with --resume"):
        Trainer(config(max_steps=10), tmp_path, quiet=True)
    Trainer(config(max_steps=10), tmp_path, overwrite=True, quiet=True).train()


def test_resume_missing_or_corrupt_checkpoint(tmp_path, capsys):
    with pytest.raises(ValueError, match="cannot resume: .*config.json does not exist"):
        Trainer(None, tmp_path / "none", resume=True)
    Trainer(config(max_steps=10), tmp_path, quiet=True).train()
    (tmp_path / CHECKPOINT).unlink()
    with pytest.raises(ValueError, match="no checkpoint at .*nothing to resume.* --overwrite instead of --resume"):
        Trainer(None, tmp_path, resume=True)
    capsys.readouterr()
    assert main(["train", "--out", str(tmp_path), "--resume", "--set", "train.max_steps=5"]) == 2
    err = capsys.readouterr().err                  # the one error line, no note on the schedule before it
    assert err.startswith("numformer train: error: no checkpoint at") and "note:" not in err, err
    Trainer(config(max_steps=10), tmp_path, overwrite=True, quiet=True).train()
    data = (tmp_path / CHECKPOINT).read_bytes()
    (tmp_path / CHECKPOINT).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="is corrupt or truncated"):
        Trainer(None, tmp_path, resume=True)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    trainer = Trainer(config(max_steps=40), tmp_path, quiet=True)
    real = trainer.model.forward

    def poisoned(idx, **kw):
        out = real(idx, **kw)
        return out * np.nan if trainer.step >= 25 and trainer.model.training else out

    monkeypatch.setattr(trainer.model, "forward", poisoned)
    with pytest.raises(TrainingDiverged, match=r"became nan at step 26.*the checkpoint of step 20, written before the loss began to diverge, is kept"):
        trainer.train()
    state = json.loads(__import__("safetensors").safe_open(str(tmp_path / CHECKPOINT), "np").metadata()["state"])
    assert state["step"] == 20
    Trainer(None, tmp_path, resume=True, quiet=True)   # the kept checkpoint still loads


def test_nan_before_any_checkpoint_says_there_is_none(tmp_path, monkeypatch):
    trainer = Trainer(config(max_steps=40, checkpoint_every=100), tmp_path, quiet=True)
    real = trainer.model.forward
    monkeypatch.setattr(trainer.model, "forward",
                        lambda idx, **kw: real(idx, **kw) * (np.nan if trainer.model.training else 1.0))
    with pytest.raises(TrainingDiverged, match="no checkpoint had been written yet"):
        trainer.train()
    assert not (tmp_path / CHECKPOINT).exists()


def test_flash_attention_with_dropout_is_refused_before_the_run_starts(tmp_path):
    cfg = config()
    cfg["model"]["attention"] = "flash"
    with pytest.raises(ValueError, match=r"flash.*dropout = 0"):
        Trainer(cfg, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()
    cfg["model"]["dropout"] = 0.0
    Trainer(cfg, tmp_path / "run", quiet=True).train(stop_after=2)


@pytest.mark.parametrize("decay_steps", [0, 20, 60])
def test_trainer_schedule_decays_until_decay_steps(tmp_path, decay_steps):
    """[train] decay_steps sets where the cosine reaches min_lr; 0 means max_steps."""
    import math

    trainer = Trainer(config(max_steps=40, decay_steps=decay_steps), tmp_path / "run", quiet=True)
    end = decay_steps or 40
    lr, w, min_lr = 1e-2, 4, 1e-3

    def expected(s):
        if s < w:
            return lr * (s + 1) / (w + 1)
        if s >= end:
            return min_lr
        return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * (s - w) / (end - w))) / 2

    np.testing.assert_allclose([trainer.schedule(s) for s in range(70)], [expected(s) for s in range(70)],
                               rtol=1e-12)


def test_gradient_accumulation_equals_one_large_batch(tmp_path):
    """grad_accum = 2 over two halves of a batch gives the update of the whole batch (equal token counts)."""
    from numformer.data.base import Batch

    full = Trainer(config(dtype="float64", batch_size=8, grad_accum=1), tmp_path / "full", quiet=True)
    halves = Trainer(config(dtype="float64", batch_size=4, grad_accum=2), tmp_path / "halves", quiet=True)
    full.model.eval()  # no dropout: both runs must compute the same function (the step keeps the mode)
    halves.model.eval()
    batch = full.task.train_batch(8, np.random.default_rng(0))
    assert batch.targets.ndim == 2 and (batch.targets != -100).all()
    parts = iter([Batch({k: v[:4] for k, v in batch.inputs.items()}, batch.targets[:4]),
                  Batch({k: v[4:] for k, v in batch.inputs.items()}, batch.targets[4:])])
    full.task.train_batch = lambda n, rng: batch
    halves.task.train_batch = lambda n, rng: next(parts)
    loss_full, norm_full, _ = full._train_step()
    loss_halves, norm_halves, _ = halves._train_step()
    assert loss_halves == pytest.approx(loss_full, rel=1e-12)
    assert norm_halves == pytest.approx(norm_full, rel=1e-10)
    for (name, a), (_, b) in zip(full.model.named_parameters(), halves.model.named_parameters()):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-10, atol=1e-12, err_msg=name)


def test_ctrl_c_writes_a_checkpoint(tmp_path, monkeypatch):
    trainer = Trainer(config(max_steps=40, checkpoint_every=100), tmp_path, quiet=True)
    ctrl_c_during_step(trainer, monkeypatch, 13)
    summary = trainer.train()
    assert summary["interrupted"] and summary["steps"] == 13
    resumed = Trainer(None, tmp_path, resume=True, quiet=True)
    assert resumed.step == 13


@pytest.mark.parametrize("checkpoint_every", [5, 100])
def test_a_second_ctrl_c_aborts_saying_what_is_kept(tmp_path, monkeypatch, capsys, checkpoint_every):
    """Ctrl-C twice in one step: the run stops at once (KeyboardInterrupt), with one line naming the checkpoint it
    can resume from, or saying there is none yet."""
    trainer = Trainer(config(max_steps=40, checkpoint_every=checkpoint_every), tmp_path)
    real = trainer._train_step

    def step_then_interrupt_twice():
        out = real()
        if trainer.step == 7:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(trainer, "_train_step", step_then_interrupt_twice)
    capsys.readouterr()
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    last = capsys.readouterr().err.strip().splitlines()[-1]
    if checkpoint_every == 5:
        assert last == (f"Ctrl-C again: aborted after step 7; the checkpoint of step 5 is kept: numformer train "
                        f"--out {tmp_path} --resume goes on from it")
        assert Trainer(None, tmp_path, resume=True, quiet=True).step == 5
    else:
        assert last == "Ctrl-C again: aborted after step 7; no checkpoint had been written yet, so there is nothing " \
                       "to resume"
        assert saved_step(tmp_path) is None


def saved_step(run_dir):
    """The step of the checkpoint in run_dir, or None while there is none."""
    from safetensors import safe_open

    path = run_dir / CHECKPOINT
    if not path.exists():
        return None
    with safe_open(str(path), "np") as f:
        return json.loads(f.metadata()["state"])["step"]


def complete_metric_lines(run_dir):
    """The lines of metrics.jsonl that are whole JSON objects (a kill can cut the last one short)."""
    path = run_dir / "metrics.jsonl"
    out = []
    for line in (path.read_text().splitlines(keepends=True) if path.exists() else []):
        try:
            out.append((json.loads(line)["step"], line))
        except (json.JSONDecodeError, KeyError):
            pass
    return out


@pytest.mark.skipif(not hasattr(signal, "SIGKILL") or not hasattr(signal, "SIGSTOP"), reason="POSIX signals")
def test_sigkill_loses_only_the_steps_since_the_last_checkpoint(tmp_path):
    """A run killed with SIGKILL (no handler runs) resumes from its last checkpoint: the checkpoint loads,
    the metrics lines logged after it are dropped, and the resumed run logs those steps again, once."""
    cfg = tmp_path / "c.toml"
    # max_steps is out of reach: the run is killed, whatever the speed of the machine; --resume then sets the end.
    cfg.write_text('[model]\ntype = "gpt"\nn_layers = 1\nn_heads = 2\nd_model = 16\n'
                   '[data]\ntask = "copy"\nlength = 4\nn_val = 16\nn_test = 16\n'
                   '[train]\nmax_steps = 1000000\nbatch_size = 4\nschedule = "constant"\nlog_every = 1\n'
                   'eval_every = 1000000\ncheckpoint_every = 5\n')
    run = tmp_path / "run"
    cli = [sys.executable, "-m", "numformer.cli", "train"]
    with open(tmp_path / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(cli + [str(cfg), "--out", str(run), "--quiet"], stdout=subprocess.DEVNULL,
                                stderr=err)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"training exited ({proc.returncode}) before it was killed: "
                            f"{(tmp_path / 'stderr.txt').read_text()}")
            assert time.monotonic() < deadline, "no checkpoint followed by more metrics lines within 120 s"
            step = saved_step(run)
            if step is not None and max((s for s, _ in complete_metric_lines(run)), default=-1) > step:
                # Freeze the run and look again (it may have written a newer checkpoint meanwhile): kill it
                # only in a state with metrics lines past its checkpoint.
                if not freeze(proc):
                    continue
                step = saved_step(run)
                if max((s for s, _ in complete_metric_lines(run)), default=-1) > step:
                    proc.send_signal(signal.SIGKILL)
                    break
                proc.send_signal(signal.SIGCONT)
            time.sleep(0.01)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    ckpt_step = saved_step(run)
    assert ckpt_step == step and ckpt_step % 5 == 0
    killed = complete_metric_lines(run)
    assert max(s for s, _ in killed) > ckpt_step             # steps that the kill lost
    kept = [line for s, line in killed if s <= ckpt_step]

    # The checkpoint loads; opening the run to resume drops the lines after it, before anything is re-logged.
    resumed = Trainer(None, run, resume=True, quiet=True)
    assert resumed.step == ckpt_step
    assert (run / "metrics.jsonl").read_text() == "".join(kept)
    resumed.close()                                            # a Trainer holds its run folder until closed

    end = ckpt_step + 3
    done = subprocess.run(cli + ["--out", str(run), "--resume", "--set", f"train.max_steps={end}", "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads((run / "summary.json").read_text())["steps"] == end
    assert saved_step(run) == end
    final = complete_metric_lines(run)
    assert "".join(line for _, line in final).startswith("".join(kept))      # the lines before are untouched
    train_steps = [r["step"] for r in read_metrics(run) if "train_loss" in r]
    assert train_steps == list(range(1, end + 1))              # steps after the checkpoint logged again, once
    assert [r["step"] for r in read_metrics(run) if "val_loss" in r] == [end]


def test_early_stopping_rule():
    es = EarlyStopping(patience=2, min_delta=0.01)
    curve = [1.0, 0.8, 0.795, 0.785, 0.7, 0.71, 0.705]
    flags = [(es.update(v, i), es.should_stop) for i, v in enumerate(curve)]
    assert [f[0] for f in flags] == [True, True, False, True, True, False, False]
    assert [f[1] for f in flags] == [False] * 6 + [True]
    assert es.should_stop and es.best == 0.7 and es.best_step == 4
    assert not EarlyStopping(patience=0).should_stop


def test_early_stopping_restores_best_weights(tmp_path, monkeypatch):
    curve = iter([2.0, 1.0, 1.5, 1.6, 1.7, 1.8])
    monkeypatch.setattr(evaluation_module, "mean_loss", lambda *a, **k: (next(curve), 100))
    trainer = Trainer(config(max_steps=60, early_stopping_patience=2, eval_metrics=False), tmp_path, quiet=True)
    snapshots = {}
    real = trainer.evaluation.periodic

    def evaluate_and_snapshot(step):
        snapshots[trainer.step] = {k: v.copy() for k, v in trainer.model.state_dict().items()}
        return real(step)

    monkeypatch.setattr(trainer.evaluation, "periodic", evaluate_and_snapshot)
    summary = trainer.train()
    assert summary["stopped_early"] and summary["steps"] == 40 and summary["best_step"] == 20
    for k, v in trainer.model.state_dict().items():
        assert np.array_equal(v, snapshots[20][k]), k


def test_resuming_a_finished_run_says_so_and_leaves_its_files(tmp_path, capsys):
    """A run resumed at its max_steps has nothing to train: one line says how to train on, and summary.json (its
    wall time), the weights and the checkpoint stay byte for byte as the run wrote them."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(tiny_copy_toml(max_steps=10, batch_size=8, eval_every=5, checkpoint_every=5))
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run), "--quiet"]) == 0
    files = ("summary.json", MODEL, CHECKPOINT, "metrics.jsonl")
    before = {name: (run / name).read_bytes() for name in files}
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "already trained to max_steps = 10: nothing to train" in err and "train.max_steps=20" in err, err
    assert {name: (run / name).read_bytes() for name in files} == before
    assert main(["train", "--out", str(run), "--resume", "--set", "train.max_steps=12", "--quiet"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 12         # raised, it trains on


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    write_atomic(target, b"old")

    def boom(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, b"new content")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_train_and_eval_commands(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\ntype = "gpt"\nn_layers = 1\nn_heads = 2\nd_model = 16\n'
                   '[data]\ntask = "test_counting"\n'
                   '[train]\nmax_steps = 10\nbatch_size = 8\neval_every = 5\ncheckpoint_every = 5\n')
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run), "--set", "train.lr=0.01", "--quiet"]) == 0
    assert json.loads((run / "config.json").read_text())["train"]["lr"] == 0.01
    assert main(["train", "--out", str(run), "--resume", "--set", "train.max_steps=15", "--quiet"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 15
    capsys.readouterr()
    assert main(["eval", str(run), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"loss", "perplexity", "bits_per_token", "accuracy"} <= set(result)
    assert main(["train", str(cfg), "--out", str(run), "--set", "train.bogus=1"]) == 2
    assert "unknown key(s) ['bogus'] in [train]" in capsys.readouterr().err


def test_data_model_type_follows_the_model_type(tmp_path):
    base = {"data": {"task": "parity", "length": 8, "n_val": 20, "n_test": 20},
            "train": {"max_steps": 1}}
    resolved, task = resolve_config({**base, "model": {"type": "gpt", "n_layers": 1, "d_model": 16,
                                                       "n_heads": 2}})
    assert resolved["data"]["model_type"] == "gpt" and task.model_type == "gpt"
    resolved, _ = resolve_config({**base, "model": {"n_layers": 1, "d_model": 16, "n_heads": 2}})
    assert resolved["model"]["type"] == "classifier"          # the task's default family
    bad = {"data": {**base["data"], "model_type": "classifier"}, "train": base["train"], "model": {"type": "gpt"}}
    with pytest.raises(ValueError, match="contradicts"):
        resolve_config(bad)


def test_atomic_writes_get_a_normal_file_mode(tmp_path):
    """mkstemp creates 0600 files; results and run files must be readable like any other file."""
    import os
    import stat

    from numformer.run_files import write_atomic

    path = tmp_path / "results.md"
    write_atomic(path, b"table\n")
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    assert path.read_bytes() == b"table\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("name", [n for n in ("SIGTERM", "SIGHUP", "SIGUSR1") if hasattr(signal, n)])
def test_a_stop_signal_writes_a_checkpoint_as_ctrl_c_does(tmp_path, monkeypatch, name):
    """SIGTERM (timeout, docker stop, systemd, Slurm), SIGHUP (a closed terminal) and SIGUSR1 stop a run at the
    end of its step with a checkpoint and summary.json, as Ctrl-C does; the signal's own handler is put back."""
    before = signal.getsignal(getattr(signal, name))
    trainer = Trainer(config(max_steps=40, checkpoint_every=100), tmp_path, quiet=True)
    real = trainer._train_step

    def step_then_signal():
        out = real()
        if trainer.step == 12:
            os.kill(os.getpid(), getattr(signal, name))
        return out

    monkeypatch.setattr(trainer, "_train_step", step_then_signal)
    summary = trainer.train()
    assert summary["interrupted"] and summary["steps"] == 13 and trainer.stop_signal == getattr(signal, name)
    assert json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))["stopped_by"] == "interrupted"
    assert signal.getsignal(getattr(signal, name)) is before
    trainer.close()
    assert Trainer(None, tmp_path, resume=True, quiet=True).step == 13


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or not sys.platform.startswith("linux"), reason="fork, SIGTERM")
def test_sigterm_to_a_data_parallel_run_group_stops_it_with_a_checkpoint(tmp_path):
    """`kill -TERM -PGID` (what docker stop, systemd and timeout do to the whole group) reaches the main process
    and its forked workers: the workers leave it to the main process, which ends the step, writes a checkpoint
    and summary.json, and exits with 128 + 15 and one line (before: killed at once, nothing saved)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\ntype = "gpt"\nn_layers = 1\nn_heads = 2\nd_model = 16\n'
                   '[data]\ntask = "copy"\nlength = 4\nn_val = 16\nn_test = 16\n'
                   '[train]\nmax_steps = 1000000\nbatch_size = 4\nschedule = "constant"\nlog_every = 1\n'
                   'eval_every = 1000000\ncheckpoint_every = 1000000\nprocesses = 2\n', encoding="utf-8")
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "numformer.cli", "train", str(cfg), "--out", str(run)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not complete_metric_lines(run):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no training line within 120 s"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGTERM)
        err = proc.communicate(timeout=60)[1].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM: finishing this step and writing a checkpoint" in err and "Traceback" not in err
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["interrupted"] and summary["processes"] == 2 and saved_step(run) == summary["steps"] > 0


def _weights(path):
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        return int(f.metadata()["step"]), {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("checkpoint_at", [2, 4])
def test_a_selection_made_after_the_checkpoint_does_not_replace_its_own_on_resume(tmp_path, monkeypatch,
                                                                                  checkpoint_at):
    """Killed after an evaluation saved a new best (step 6) to model.safetensors and before the next checkpoint,
    a run resumed from the checkpoint (which selected step 2) with another learning rate trains a different
    path: model.safetensors must hold step 2 again (the checkpoint's own weights when it was written at step
    2; else the step-2 file moved aside when step 6 replaced it), not the abandoned path's step 6 (before: kept,
    then replaced by the last weights at the end, step 2's lost)."""
    run, on = tmp_path / "run", {"losses": {2: 2.0, 4: 2.5, 6: 1.5}, "trainer": None}
    monkeypatch.setattr(evaluation_module, "mean_loss",
                        lambda *a, **k: (on["losses"].get(on["trainer"].step, 3.0), 100))
    trainer = on["trainer"] = Trainer(config(max_steps=12, eval_every=2, checkpoint_every=100), run, quiet=True)
    trainer.train(stop_after=checkpoint_at)                  # the checkpoint at its last step (selected: 2)
    step2 = _weights(run / MODEL)
    assert step2[0] == 2

    def killed():
        raise RuntimeError("killed")
    trainer.save_checkpoint = killed
    with pytest.raises(RuntimeError, match="killed"):
        trainer.train(stop_after=6 - checkpoint_at)           # selects step 6, killed at its checkpoint
    trainer.close()
    assert _weights(run / MODEL)[0] == 6
    on["losses"] = {}                                          # the new path never beats step 2
    resumed = on["trainer"] = Trainer(None, run, resume=True, quiet=True, overrides=["train.lr=0.05"])
    assert resumed.step == checkpoint_at
    real, at_first_step = resumed._train_step, []

    def first_step_sees_the_folder():
        if not at_first_step:
            at_first_step.append((_weights(run / MODEL), sorted(p.name for p in run.iterdir())))
        return real()
    resumed._train_step = first_step_sees_the_folder
    summary = resumed.train()
    (step, tensors), files = at_first_step[0]
    assert step == 2 and all(np.array_equal(tensors[k], step2[1][k]) for k in tensors)
    assert not any(name.startswith(".checkpoint-selection") for name in files)
    assert summary["steps"] == 12 and summary["selected_step"] == 2


@pytest.mark.parametrize("name", [CHECKPOINT, MODEL])
def test_bytes_changed_inside_a_saved_tensor_are_reported_as_corruption(tmp_path, name):
    """A few bytes overwritten inside the tensor data (a bad sector, a stray write) leave a file safetensors still
    parses: the CRC-32 written with the tensors tells it (before: the checkpoint loaded, NaN weights trained, and
    the divergence message advised resuming from the same damaged checkpoint)."""
    from numformer.run_files import load_model_weights

    trainer = Trainer(config(max_steps=10), tmp_path, quiet=True)
    trainer.train()
    trainer.close()
    path = tmp_path / name
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")              # the tensor data follows the JSON header
    data[(start + len(data)) // 2:(start + len(data)) // 2 + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"{name} is corrupt: its tensors' bytes changed"):
        if name == CHECKPOINT:
            Trainer(None, tmp_path, resume=True, quiet=True)
        else:
            load_model_weights(path, trainer.model)


def test_damaged_kept_weights_are_found_before_a_resumed_run_changes_anything(tmp_path):
    """model.safetensors damaged: --resume refuses before training, the folder as it was (before: the run trained
    on and replaced summary.json, and only its final phase, reading the kept weights, found the damage)."""
    trainer = Trainer(config(max_steps=10), tmp_path, quiet=True)
    trainer.train()
    trainer.close()
    path = tmp_path / MODEL
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[(start + len(data)) // 2:(start + len(data)) // 2 + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match=f"{MODEL} is corrupt: .* \\(found before resuming: nothing was changed\\)"):
        Trainer(None, tmp_path, resume=True, quiet=True, overrides=["train.max_steps=12"])
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_a_resumed_run_that_crashes_leaves_no_summary_of_its_earlier_end(tmp_path):
    """summary.json describes the weights in model.safetensors; a finished run resumed for more steps trains new
    bests into model.safetensors, so its earlier summary goes when it starts (before: a crash left summary.json
    naming step 10 beside the weights of a later step)."""
    Trainer(config(max_steps=10), tmp_path, quiet=True).train()
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 10
    resumed = Trainer(None, tmp_path, resume=True, quiet=True, overrides=["train.max_steps=20"])
    real = resumed._train_step

    def crash_at_15():
        if resumed.step == 15:
            raise MemoryError("killed")
        return real()
    resumed._train_step = crash_at_15
    with pytest.raises(MemoryError):
        resumed.train()
    resumed.close()
    assert not (tmp_path / "summary.json").exists()
    again = Trainer(None, tmp_path, resume=True, quiet=True, overrides=["train.max_steps=20"])
    assert again.train()["steps"] == 20 and json.loads((tmp_path / "summary.json").read_text())["steps"] == 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a second process holding the lock")
def test_init_from_a_run_folder_being_trained_is_refused(tmp_path):
    """init_from reads a run folder under its shared lock, as numformer eval does: while another process trains
    there (holding it exclusively) the new run is refused in one line naming the folder (before: it started from
    whatever weights the other run had written last, and recorded only the path)."""
    source = tmp_path / "source"
    Trainer(config(max_steps=10), source, quiet=True).train()
    code = ("import sys\nfrom numformer.train.run_folder import lock_for_writing\n"
            "lock = lock_for_writing(sys.argv[1])\nprint('locked', flush=True)\nsys.stdin.readline()\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(source)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderBusy, match="source"):
            Trainer({**config(max_steps=10), "model": {"init_from": str(source)}}, tmp_path / "new", quiet=True)
    finally:
        holder.communicate("\n", timeout=30)
    fine_tuned = Trainer({**config(max_steps=10), "model": {"init_from": str(source)}}, tmp_path / "new2", quiet=True)
    assert fine_tuned.step == 0
    fine_tuned.close()
