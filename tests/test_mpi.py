"""Training across MPI ranks (numformer.train.mpi): launched with mpiexec from the test, on tiny models.

Each test starts `mpiexec -n N` on a small script or on `numformer train` itself; the ranks run on this
machine's cores (oversubscribed where N exceeds them, which only makes them slower).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from numformer.train import Trainer, load_model, load_model_weights
from numformer.train.mpi import init_world, launcher_rank, launcher_size, wait_until_read

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _mpiexec():
    """The mpiexec of this environment (the mpich wheel puts it next to python), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def _mpi_missing():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install -e \".[mpi]\")"
    if _mpiexec() is None:
        return "no mpiexec next to python or on PATH"
    if not sys.platform.startswith("linux"):
        return "the MPI tests use Linux's fork and /proc"
    return None


needs_mpi = pytest.mark.skipif(_mpi_missing() is not None, reason=str(_mpi_missing()))

CONFIG = {
    "model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16, "dropout": 0.0},
    "data": {"task": "text", "block_size": 12},
    "train": {"max_steps": 6, "batch_size": 5, "lr": 3e-3, "optimizer": "adamw", "weight_decay": 0.1,
              "eval_every": 100, "eval_batches": 1, "eval_batch_size": 64, "checkpoint_every": 2, "log_every": 1,
              "seed": 5, "processes": 1, "dtype": "float64", "restore_best": False},
}


def _config(tmp_path, **train):
    """CONFIG on a small corpus (the first 3,000 characters of the built-in one), so evaluations are quick."""
    from numformer.data.text import read_corpus

    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(read_corpus()[:3000])
    cfg = json.loads(json.dumps(CONFIG))
    cfg["data"]["path"] = str(corpus)
    cfg["train"].update(train)
    return cfg


def _launch(n, args, timeout=90):
    """Run ``mpiexec -n n python ARGS`` (the ranks import this checkout); returns the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               NUMFORMER_NUM_THREADS="1")
    return subprocess.run([_mpiexec(), "-n", str(n), sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _script(tmp_path, body):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _weights(path):
    model = load_model(path.parent)
    load_model_weights(path, model)
    return {n: p.data.copy() for n, p in model.named_parameters()}


def _single(tmp_path, cfg, name="single"):
    trainer = Trainer(cfg, tmp_path / name, quiet=True)
    trainer.train()
    return {n: p.data.copy() for n, p in trainer.model.named_parameters()}


def _assert_close(got, want, rtol=1e-10):
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=1e-12, err_msg=name)


# -- the launcher's environment ---------------------------------------------------------------------------

def test_launcher_size_and_rank_from_the_environment():
    assert launcher_size({}) == (1, None)
    assert launcher_size({"PMI_SIZE": "1"}) == (1, None)
    assert launcher_size({"PMI_SIZE": "4", "PMI_RANK": "2"}) == (4, "PMI_SIZE")
    assert launcher_size({"OMPI_COMM_WORLD_SIZE": "3"}) == (3, "OMPI_COMM_WORLD_SIZE")
    assert launcher_size({"SLURM_STEP_NUM_TASKS": "8", "PMIX_RANK": "3"}) == (8, "SLURM_STEP_NUM_TASKS")   # srun, PMIx
    assert launcher_size({"SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "8"}) == (1, None)   # a batch script itself
    assert launcher_rank({"OMPI_COMM_WORLD_RANK": "2"}) == 2
    assert launcher_rank({}) == 0


def test_mpiexec_without_mpi4py_is_one_clear_error(monkeypatch, capsys, tmp_path):
    """N processes started by a launcher but unable to talk must not become N runs writing one folder."""
    from numformer.cli import main

    monkeypatch.setitem(sys.modules, "mpi4py", None)          # `import mpi4py` raises ImportError
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "0")
    with pytest.raises(ValueError, match=r"one of 2 processes \(PMI_SIZE=2.*mpi4py is not installed.*pip install -e \"\.\[mpi\]\""):
        init_world()
    assert main(["train", "unused.toml", "--out", str(tmp_path / "run")]) == 2
    assert "mpi4py is not installed" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("PMI_RANK", "1")                        # the other ranks exit without repeating it
    with pytest.raises(SystemExit) as exit_:
        init_world()
    assert exit_.value.code == 2


# -- the same update as one process -----------------------------------------------------------------------

GRADIENT_AND_TRAINING = """
    import json, sys
    import numpy as np
    from numformer import GPT
    from numformer.train import Trainer
    from numformer.train.mpi import MPIDataParallel, init_world

    out, cfg = sys.argv[1], json.loads(sys.argv[2])
    world = init_world()
    # one batch with uneven counts of targets: the ranks' shares are token-weighted
    model = GPT(vocab_size=11, block_size=8, n_layers=2, n_heads=2, d_model=16, dropout=0.0,
                rng=np.random.default_rng(0)).astype(np.float64)
    rng = np.random.default_rng(1)
    idx, targets = rng.integers(0, 11, (7, 8)), rng.integers(0, 11, (7, 8))
    targets[0, :6] = -100
    targets[5, 1] = -100
    with MPIDataParallel(model, world, processes=2, seed=0) as dp:       # forked workers inside each rank
        part, counted = dp.forward_backward({"idx": idx}, targets, label_smoothing=0.1, grad_scale=0.5)
        loss, flags = dp.combine(part, [world.rank == 1, False])
    np.savez(f"{out}/grad{world.rank}.npz", loss=loss, flags=flags, counted=counted,
             **{n: p.grad for n, p in model.named_parameters()})
    # k training steps through the trainer
    trainer = Trainer(cfg, f"{out}/run", quiet=True, world=world)
    trainer.train()
    np.savez(f"{out}/weights{world.rank}.npz", **{n: p.data for n, p in trainer.model.named_parameters()})
"""


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_gradients_and_weights_equal_one_process(tmp_path, ranks):
    from numformer import GPT
    from numformer.train.step import loss_and_backward

    cfg = _config(tmp_path, max_steps=4)
    result = _launch(ranks, [_script(tmp_path, GRADIENT_AND_TRAINING), str(tmp_path), json.dumps(cfg)])
    assert result.returncode == 0, result.stderr
    model = GPT(vocab_size=11, block_size=8, n_layers=2, n_heads=2, d_model=16, dropout=0.0,
                rng=np.random.default_rng(0)).astype(np.float64)
    rng = np.random.default_rng(1)
    idx, targets = rng.integers(0, 11, (7, 8)), rng.integers(0, 11, (7, 8))
    targets[0, :6] = -100
    targets[5, 1] = -100
    loss = loss_and_backward(model, {"idx": idx}, targets, label_smoothing=0.1, grad_scale=0.5)
    single = _single(tmp_path, cfg)
    for rank in range(ranks):
        got = np.load(tmp_path / f"grad{rank}.npz")
        assert float(got["loss"]) == pytest.approx(loss, rel=1e-12)
        assert list(got["flags"]) == [True, False]            # rank 1's flag reaches every rank
        assert int(got["counted"]) == int((targets != -100).sum())
        _assert_close(got, {n: p.grad for n, p in model.named_parameters()})
        weights = np.load(tmp_path / f"weights{rank}.npz")
        _assert_close(weights, single)                        # k AdamW steps: the one-process weights
    first = np.load(tmp_path / "weights0.npz")
    for rank in range(1, ranks):                               # and the ranks hold the same bits
        assert all(np.array_equal(first[n], np.load(tmp_path / f"weights{rank}.npz")[n]) for n in single)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == \
        ["checkpoint.safetensors", "config.json", "data_files.json", "metrics.jsonl", "model.safetensors",
         "summary.json", "tokenizer.json"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["mpi_ranks"] == ranks and summary["steps"] == 4


# -- faults and resume ------------------------------------------------------------------------------------

FAULT = """
    import os, signal, sys
    from numformer.cli import main
    from numformer.train import trainer as trainer_module

    fault, at_step = sys.argv[1], int(sys.argv[2])
    original = trainer_module.Trainer._train_step

    def step(self):
        if self.world is not None and self.world.rank == 1 and self.step == at_step:
            if fault == "raise":
                raise RuntimeError("a failure on rank 1")
            os.kill(os.getpid(), getattr(signal, fault))
        return original(self)

    trainer_module.Trainer._train_step = step
    sys.exit(main(["train", *sys.argv[3:]]))
"""


def _train_under_fault(tmp_path, ranks, fault, at_step, run, cfg):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg))
    toml = tmp_path / "config.toml"
    toml.write_text(_toml(cfg))
    return _launch(ranks, [_script(tmp_path, FAULT), fault, str(at_step), str(toml), "--out", str(run)])


def _toml(cfg):
    lines = []
    for section, values in cfg.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


@needs_mpi
def test_killed_rank_stops_the_job_and_resume_is_exact(tmp_path):
    """Dropout on: rank 1 is killed (SIGKILL, as by the out-of-memory killer) after step 4's checkpoint; the job
    ends non-zero, the checkpoint is intact, and `--resume` under mpiexec gives the uninterrupted run's bits."""
    cfg = _config(tmp_path, max_steps=6)
    cfg["model"]["dropout"] = 0.1
    whole = _train_under_fault(tmp_path, 2, "none", -1, tmp_path / "whole", cfg)
    assert whole.returncode == 0, whole.stderr
    killed = _train_under_fault(tmp_path, 2, "SIGKILL", 4, tmp_path / "run", cfg)
    assert killed.returncode != 0
    pid = next(line for line in killed.stderr.splitlines() if line.startswith("MPI: 2 ranks"))
    pid = pid.split("1: pid ")[1].split()[0].rstrip(";,")
    assert f"PID {pid}" in killed.stdout + killed.stderr       # mpiexec names the killed rank's pid
    ckpt = tmp_path / "run" / "checkpoint.safetensors"
    _weights(ckpt)                                             # intact: it loads
    resumed = _launch(2, ["-m", "numformer.cli", "train", "--resume", "--out", str(tmp_path / "run"), "--quiet"])
    assert resumed.returncode == 0, resumed.stderr
    got, want = _weights(tmp_path / "run" / "model.safetensors"), _weights(tmp_path / "whole" / "model.safetensors")
    for name in want:
        assert np.array_equal(got[name], want[name]), name


@needs_mpi
@pytest.mark.parametrize("fault, message", [
    ("raise", "rank 1 of 2 (pid {pid} on {host}) failed: RuntimeError: a failure on rank 1; stopping every rank"),
    ("SIGTERM", "rank 1 of 2 (pid {pid} on {host}) stopped by SIGTERM; stopping every rank"),
])
def test_failing_rank_stops_every_rank_with_one_line(tmp_path, fault, message):
    result = _train_under_fault(tmp_path, 2, fault, 3, tmp_path / "run", _config(tmp_path))
    assert result.returncode != 0
    start = next(line for line in result.stderr.splitlines() if line.startswith("MPI: 2 ranks"))
    pid = start.split("1: pid ")[1].split()[0].rstrip(";,")
    host = start.split(" machine (")[1].split(")")[0]
    lines = [line for line in result.stderr.splitlines() if "rank 1 of 2" in line]
    assert lines == [f"numformer train: {message.format(pid=pid, host=host)} (the last checkpoint is kept)"]
    _weights(tmp_path / "run" / "checkpoint.safetensors")     # step 2's checkpoint, intact


def test_abort_waits_until_the_launcher_has_read_the_line():
    """A failing rank's line sits in the stderr pipe until the launcher reads it; MPI_Abort kills that reader,
    so the abort waits for the pipe to be empty (the cause of a line lost about once in 30 runs under load)."""
    import threading

    read_fd, write_fd = os.pipe()
    reading, taken = threading.Event(), []

    def launcher():                            # reads the pipe a little later, as a busy launcher does
        reading.set()
        taken.append(os.read(read_fd, 1000))

    with os.fdopen(write_fd, "w") as writer:
        writer.write("numformer train: rank 1 of 2 failed\n")
        writer.flush()
        reader = threading.Timer(0.3, launcher)
        reader.start()
        wait_until_read(writer)
        assert reading.is_set()                # the pipe empties only once the reader has started its read
        reader.join()
    assert taken == [b"numformer train: rank 1 of 2 failed\n"]
    os.close(read_fd)


def test_abort_does_not_wait_on_a_file_or_a_closed_stream(tmp_path):
    with open(tmp_path / "log.txt", "w") as f:
        f.write("unread by anyone\n")
        f.flush()
        wait_until_read(f)                     # a regular file: returns at once (no reader to wait for)
    wait_until_read(f)                         # closed: nothing to wait for, no error


@needs_mpi
def test_ctrl_c_on_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """Rank 1 alone gets SIGINT: its stop request rides in the step's Allreduce, every rank stops after that step,
    rank 0 writes the checkpoint and the summary, and the job exits with 130 like a one-process Ctrl-C."""
    result = _train_under_fault(tmp_path, 2, "SIGINT", 3, tmp_path / "run", _config(tmp_path, max_steps=50))
    assert result.returncode == 130, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["interrupted"] and summary["steps"] == 4
    assert load_checkpoint_step(tmp_path / "run") == 4


def load_checkpoint_step(run_dir):
    from safetensors import safe_open

    with safe_open(str(run_dir / "checkpoint.safetensors"), framework="np") as f:
        return json.loads(f.metadata()["state"])["step"]


@needs_mpi
def test_resume_on_a_different_number_of_ranks(tmp_path):
    """Stopped after 4 steps on 2 ranks (time limit 0 would not stop: use max_steps), resumed to 6 on 3 ranks:
    the one-process weights (dropout off), since the global batch is the config's whatever the split."""
    cfg = _config(tmp_path, max_steps=4)
    first = _train_under_fault(tmp_path, 2, "none", -1, tmp_path / "run", cfg)
    assert first.returncode == 0, first.stderr
    resumed = _launch(3, ["-m", "numformer.cli", "train", "--resume", "--out", str(tmp_path / "run"), "--quiet",
                          "--set", "train.max_steps=6"])
    assert resumed.returncode == 0, resumed.stderr
    _assert_close(_weights(tmp_path / "run" / "model.safetensors"), _single(tmp_path, _config(tmp_path, max_steps=6)))


@needs_mpi
def test_resuming_an_ended_run_under_mpi_leaves_it_as_it_ended(tmp_path):
    """A run that reached max_steps on 2 ranks, resumed on 2 ranks: every rank reads rank 0's summary.json
    (the folder is rank 0's), says it has nothing to train and leaves the files, as a run alone does (it
    used to say the end was not recorded and score the weights again)."""
    cfg = _config(tmp_path, max_steps=4)
    assert _train_under_fault(tmp_path, 2, "none", -1, tmp_path / "run", cfg).returncode == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    resumed = _launch(2, ["-m", "numformer.cli", "train", "--resume", "--out", str(tmp_path / "run")])
    assert resumed.returncode == 0, resumed.stderr
    assert "already trained to max_steps = 4: nothing to train" in resumed.stdout + resumed.stderr
    assert "without recording its end" not in resumed.stdout + resumed.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()} == before


@needs_mpi
def test_bad_config_is_reported_once(tmp_path):
    cfg = _config(tmp_path)
    cfg["train"]["lr"] = "fast"
    result = _train_under_fault(tmp_path, 2, "none", -1, tmp_path / "run", cfg)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "lr" in errors[0] and "(on ranks 0, 1 of 2)" in errors[0], result.stderr


def test_ranks_must_train_rank_0s_run():
    """Ranks started with other --set items trained one model with several optimizers without a word (a
    different lr), or failed inside MPI (a different d_model); a rank's own data path, init_from path or
    processes are its own, and data of the same contents are the same data."""
    from numformer.train.mpi import run_disagreement

    config = {"model": {"d_model": 16, "init_from": "/a/gpt2"}, "data": {"path": "/a/text.txt", "block_size": 8},
              "train": {"lr": 1e-3, "processes": 2}}
    data = {"version": 1, "files": [{"path": "/a/text.txt", "sha256": "ab", "bytes": 3}], "folders": []}
    elsewhere = {"model": {"d_model": 16, "init_from": "/b/gpt2"}, "data": {"path": "/b/t.txt", "block_size": 8},
                 "train": {"lr": 1e-3, "processes": 8}}
    moved = {**data, "files": [{"path": "/b/t.txt", "sha256": "ab", "bytes": 3}]}
    assert run_disagreement([(config, data), (elsewhere, moved), (config, None)]) is None
    other_lr = {**config, "train": {"lr": 1e-2, "processes": 2}}
    assert run_disagreement([(config, data), (config, data), (other_lr, data)]) == (
        "rank 2 was started with another config than rank 0: train.lr = 0.01 there, 0.001 on rank 0; start every "
        "rank with the same config file and --set items")
    assert "model.n_layers = 2 there, None on rank 0" in run_disagreement(
        [(config, data), ({**config, "model": {**config["model"], "n_layers": 2}}, data)])
    other_data = {**data, "files": [{"path": "/a/text.txt", "sha256": "cd", "bytes": 3}]}
    assert run_disagreement([(config, data), (config, other_data)]).startswith("rank 1 read other data than rank 0")
    joined = {**data, "sequences": [{"path": "/a", "files": 2, "bytes": 6, "sha256": "ab-then-cd"}]}
    reordered = {**data, "sequences": [{"path": "/b", "files": 2, "bytes": 6, "sha256": "cd-then-ab"}]}
    assert run_disagreement([(config, joined), (config, {**joined, "sequences": [
        {**joined["sequences"][0], "path": "/b"}]})]) is None            # the same files joined in the same order
    assert run_disagreement([(config, joined), (config, reordered)]).startswith(   # the same files, another order
        "rank 1 read other data than rank 0")


@needs_mpi
def test_a_rank_started_with_another_config_stops_the_job_before_training(tmp_path):
    cfg = _config(tmp_path)
    toml = tmp_path / "config.toml"
    toml.write_text(_toml(cfg))
    rank = [sys.executable, "-m", "numformer.cli", "train", str(toml), "--out", str(tmp_path / "run")]
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), NUMFORMER_NUM_THREADS="1")
    result = subprocess.run([_mpiexec(), "-n", "1", *rank, ":", "-n", "1", *rank, "--set", "train.lr=0.01"],
                            capture_output=True, text=True, timeout=90, env=env)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "rank 1 was started with another config than rank 0: train.lr = 0.01" in errors[0]
    assert not (tmp_path / "run" / "model.safetensors").exists()


# -- the benchmarks ---------------------------------------------------------------------------------------

def test_scaling_model():
    from numformer.bench.mpi_scaling import predict

    rows = predict(t_step=1.0, t_opt=0.1, batch=8, grad_bytes=125e6, t_local=0.0, link_gbit=1, machines=(1, 2, 4),
                   latency=0.0)
    assert [r["comm_s"] for r in rows] == pytest.approx([0.0, 1.0, 1.5])      # 2(N-1)/N × 1 s on the link
    assert rows[0]["weak_efficiency"] == rows[0]["strong_efficiency"] == 1.0
    assert rows[1]["weak_step_s"] == pytest.approx(2.0)
    assert rows[2]["strong_step_s"] == pytest.approx(0.9 * 2 / 8 + 0.1 + 1.5)
    assert rows[2]["strong_efficiency"] == pytest.approx(1.0 / (4 * rows[2]["strong_step_s"]))


@needs_mpi
def test_bench_mpi_job_trains_and_reduces(tmp_path):
    from numformer.bench.mpi import MPIJob

    with MPIJob(_config(tmp_path), 2) as job:
        assert job.ready == {"ready": 2, "processes": 1}
        assert job.ask("steps 2") > 0
        assert job.ask("combine 2") > 0
        assert job.ask("allreduce 4096 2") > 0
    assert job.proc.returncode == 0


@needs_mpi
def test_a_launcher_that_mpi4py_does_not_see_is_one_clear_error(tmp_path):
    """Another MPI library's launcher (its variables set by hand) leaves mpi4py's MPI with one process.
    In a child process: MPI is initialized there, not in the test process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MV2_", "SLURM_", "OMPI_"))}
    env.update(OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="0", PYTHONPATH=SRC)
    result = subprocess.run([sys.executable, "-m", "numformer.cli", "train", "x.toml", "--out", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2
    assert ("started 2 processes (OMPI_COMM_WORLD_SIZE=2) but mpi4py's MPI sees 1: mpiexec and mpi4py come from "
            "different MPI libraries") in result.stderr
    assert not (tmp_path / "run").exists()


def test_bench_reports(tmp_path):
    from numformer.bench import mpi, mpi_scaling

    rows = mpi_scaling.predict(0.05, 0.005, 12, 3.2e6, 0.001, 10)
    config = {"config": "configs/shakespeare_char.toml", "parameters": 800_000, "gradient_bytes": 3.2e6, "batch": 12,
              "block_size": 64, "t_step_s": 0.05, "t_opt_s": 0.005, "t_local_allreduce_s": 0.001,
              "local_allreduce_gb_per_s": 3.2, "predictions": {"10": rows}}
    text = mpi_scaling.markdown({"cores": 2, "latency_s": 5e-5, "configs": {"nanogpt": config},
                                 "load_average_before": [0.1] * 3, "load_average_after": [0.2] * 3}, tmp_path)
    assert text.count("\n| ") == 1 + len(mpi_scaling.MACHINES) and "| 64 |" in text and "re-run" not in text
    result = {"config": "configs/shakespeare_char.toml", "cores": 2, "ranks": 2, "forked_processes": 2, "batch": 12,
              "block_size": 64, "rounds": 7, "steps_per_round": 20, "warmup": 5, "forked_median_tokens_per_s": 1e4,
              "mpi_median_tokens_per_s": 9.5e3, "median_ratio": 0.95, "min_ratio": 0.9, "max_ratio": 1.0,
              "combine_ms": 1.0, "forked_median_cpu_ms_per_step": 70.0, "mpi_median_cpu_ms_per_step": 75.0,
              "load_average_before": [12.0] * 3, "load_average_after": [1.0] * 3}
    text = mpi.markdown(result, tmp_path)
    assert "**0.95**" in text and "forked 70.0 ms, MPI 75.0 ms" in text and "quiet machine" in text
