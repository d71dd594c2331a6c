"""Data-parallel training across processes: the same gradients and updates as one process, exact resume, faults."""
from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np
import pytest

from numformer import GPT, EncoderClassifier, Transformer
from numformer.optim import AdamW, clip_grad_norm, param_groups
from numformer.train import Trainer
from numformer.train.parallel import DataParallel, usable_processes
from numformer.train.step import loss_and_backward

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="data parallelism forks (Linux only)")

IGNORE = -100


def _gpt():
    return GPT(vocab_size=11, block_size=8, n_layers=2, n_heads=2, d_model=16, dropout=0.0,
               rng=np.random.default_rng(0)).astype(np.float64)


def _gpt_batch(rng, B=5):
    idx = rng.integers(0, 11, (B, 8))
    targets = rng.integers(0, 11, (B, 8))
    targets[0, :6] = IGNORE                       # uneven counts of targets across the shares
    targets[3, 2] = IGNORE
    return {"idx": idx}, targets


def _cases():
    rng = np.random.default_rng(1)
    yield "gpt", _gpt, _gpt_batch(rng)
    clf = lambda: EncoderClassifier(vocab_size=13, n_classes=3, max_len=10, d_model=16, n_heads=2, n_layers=1,
                                    dropout=0.0, pad_id=0, rng=np.random.default_rng(0)).astype(np.float64)
    ids = rng.integers(1, 13, (6, 10))
    ids[1, 7:] = 0                                # padding
    yield "classifier", clf, ({"ids": ids}, rng.integers(0, 3, 6))
    tr = lambda: Transformer(src_vocab_size=9, tgt_vocab_size=10, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                             dropout=0.0, max_len=12, rng=np.random.default_rng(0)).astype(np.float64)
    tgt = rng.integers(0, 10, (4, 7))
    yield "transformer", tr, ({"src": rng.integers(0, 9, (4, 6)), "tgt": tgt}, rng.integers(0, 10, (4, 7)))


@pytest.mark.parametrize("processes", [2, 3])
@pytest.mark.parametrize("name", ["gpt", "classifier", "transformer"])
def test_split_batch_gives_the_single_process_gradient(name, processes):
    make, (inputs, targets) = next((m, b) for n, m, b in _cases() if n == name)
    single = make()
    loss1 = loss_and_backward(single, inputs, targets, 0.1, 0.5)
    model = make()
    with DataParallel(model, processes, seed=0) as dp:
        loss2, counted = dp.forward_backward(inputs, targets, label_smoothing=0.1, grad_scale=0.5)
    assert counted == int((targets != IGNORE).sum())
    assert loss2 == pytest.approx(loss1, rel=1e-12)
    for (pname, a), (_, b) in zip(single.named_parameters(), model.named_parameters()):
        np.testing.assert_allclose(b.grad, a.grad, rtol=1e-10, atol=1e-13, err_msg=pname)


def test_workers_compute_with_the_updated_parameters():
    """Three AdamW steps on two processes equal three steps on one (the optimizer updates shared memory)."""
    rng = np.random.default_rng(2)
    batches = [_gpt_batch(rng) for _ in range(3)]
    models = []
    for processes in (1, 2):
        model = _gpt()
        opt = AdamW(param_groups(model, 0.1), lr=1e-2)
        with DataParallel(model, processes, seed=0) as dp:
            for inputs, targets in batches:
                opt.zero_grad()
                dp.forward_backward(inputs, targets)
                clip_grad_norm(opt.params, 1.0)
                opt.step()
        models.append(model)
    for (name, a), (_, b) in zip(models[0].named_parameters(), models[1].named_parameters()):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-10, atol=1e-13, err_msg=name)
        assert b.data.flags.owndata                       # close() moved the parameters back to private memory


def test_rebound_parameter_is_copied_into_shared_memory():
    model = _gpt()
    single = _gpt()
    inputs, targets = _gpt_batch(np.random.default_rng(3))
    with DataParallel(model, 2, seed=0) as dp:
        name = "blocks.0.ff.linear1.weight"
        dict(model.named_parameters())[name].data = np.full((64, 16), 0.01)     # user code assigning weights
        dict(single.named_parameters())[name].data[...] = 0.01
        dp.forward_backward(inputs, targets)
    loss_and_backward(single, inputs, targets, 0.0, 1.0)
    for (pname, a), (_, b) in zip(single.named_parameters(), model.named_parameters()):
        np.testing.assert_allclose(b.grad, a.grad, rtol=1e-10, atol=1e-13, err_msg=pname)


def test_error_in_a_worker_is_reported_and_the_pipes_stay_usable():
    model = _gpt()
    inputs, targets = _gpt_batch(np.random.default_rng(4), B=4)
    bad = dict(inputs)
    bad["idx"] = inputs["idx"].copy()
    bad["idx"][3, 0] = 99                             # out of the vocabulary, in the worker's share
    with DataParallel(model, 2, seed=0) as dp:
        with pytest.raises(RuntimeError, match=r"worker 1 failed(.|\n)*token ids \[99\] are outside the vocabulary"):
            dp.forward_backward(bad, targets)
        model.zero_grad()
        loss, _ = dp.forward_backward(inputs, targets)      # the next step works
        assert np.isfinite(loss)


def test_a_killed_worker_gives_a_clear_error():
    model = _gpt()
    inputs, targets = _gpt_batch(np.random.default_rng(5), B=4)
    with DataParallel(model, 2, seed=0) as dp:
        os.kill(dp._workers[0].pid, signal.SIGKILL)
        dp._workers[0].join(5)
        with pytest.raises(RuntimeError, match="worker 1 exited unexpectedly"):
            dp.forward_backward(inputs, targets)


def test_batch_statistics_norm_cannot_be_split():
    model = GPT(vocab_size=11, block_size=8, n_layers=1, n_heads=2, d_model=16, norm="batch", norm_first=True,
                rng=np.random.default_rng(0))
    assert usable_processes(model, batch_size=8, requested=0) == 1
    with pytest.raises(ValueError, match="norm = \"batch\".*cannot be split"):
        usable_processes(model, batch_size=8, requested=2)
    with pytest.raises(ValueError, match="processes must be 0"):
        usable_processes(_gpt(), batch_size=8, requested=-1)
    assert usable_processes(_gpt(), batch_size=1, requested=0) == 1          # never more shares than examples


def _config(**train):
    return {
        "model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16, "dropout": 0.2},
        "data": {"task": "copy", "length": 6, "vocab": 8},
        "train": {"max_steps": 16, "batch_size": 8, "lr": 1e-2, "eval_every": 8, "checkpoint_every": 8,
                  "log_every": 4, "seed": 5, "processes": 2, **train},
    }


def _checkpoint_arrays(run_dir):
    from safetensors.numpy import load_file

    return load_file(str(run_dir / "checkpoint.safetensors"))


def test_trainer_on_two_processes_resumes_bit_exactly_with_dropout(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    Trainer(_config(), straight, quiet=True).train()
    Trainer(_config(), resumed, quiet=True).train(stop_after=8)
    trainer = Trainer(None, resumed, resume=True, quiet=True)
    assert trainer.processes == 2 and len(trainer.workers.worker_rngs) == 1
    trainer.train()
    a, b = _checkpoint_arrays(straight), _checkpoint_arrays(resumed)
    assert set(a) == set(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    read = lambda d: [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("train_loss") for r in read(straight)] == [r.get("train_loss") for r in read(resumed)]


def test_workers_draw_their_own_dropout_masks():
    """With dropout, two processes do not repeat one process's masks: the shares are independent."""
    model = GPT(vocab_size=11, block_size=8, n_layers=1, n_heads=2, d_model=16, dropout=0.5,
                rng=np.random.default_rng(0)).astype(np.float64)
    idx = np.tile(np.arange(8), (4, 1))                              # four identical sequences
    with DataParallel(model, 2, seed=0) as dp:
        states = dp.rng_states()
        dp.forward_backward({"idx": idx}, idx)
        assert dp.rng_states() != states                             # the worker drew masks
        main_states = [model.drop.rng.bit_generator.state]
    assert len(states) == 1 and states[0] != main_states                  # reseeded from (seed, worker)


def test_a_killed_worker_is_named_when_its_generators_are_read_or_set():
    """The checkpoint reads the workers' generator states (under MPI at every checkpoint of every rank): a
    killed worker there gives the same message as in a step, not the pipe's BrokenPipeError."""
    with DataParallel(_gpt(), 2, seed=0) as dp:
        states = dp.rng_states()
        os.kill(dp._workers[0].pid, signal.SIGKILL)
        dp._workers[0].join(5)
        for call in (dp.rng_states, lambda: dp.set_rng_states(states)):
            with pytest.raises(RuntimeError, match=r"data-parallel worker 1 exited unexpectedly \(exit code -9\)"):
                call()


def test_the_start_line_names_unequal_shares_of_a_batch():
    """A batch that does not split evenly is described by its shares (7 on 2: 4 and 3; 3 on 4 ranks: one
    computes nothing), not as "1/N of every batch"."""
    from numformer.train.parallel import share_text

    assert share_text(12, 2) == "1/2 of every batch"
    assert share_text(7, 2) == "its share of every batch of 7 (3 and 4 examples)"
    assert share_text(3, 4) == "its share of every batch of 3 (0, 1, 1 and 1 examples)"
