"""Training end to end equals PyTorch: same initial weights, same batches, same AdamW, schedule and clipping.

numformer's whole training step (GPT forward, fused cross-entropy, hand-written backward,
global-norm clipping, AdamW with parameter groups, warmup + cosine schedule) is run next
to the PyTorch reference model for 20 steps in float64; losses and weights must agree.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from numformer.data.text import read_corpus
from numformer.train import Trainer

torch = pytest.importorskip("torch")


def test_twenty_training_steps_match_pytorch(tmp_path):
    from numformer.bench.torch_reference import _torch_name, from_numformer

    corpus = tmp_path / "c.txt"
    corpus.write_text(read_corpus()[:20_000])
    config = {
        "model": {"type": "gpt", "n_layers": 2, "n_heads": 2, "d_model": 16, "dropout": 0.0, "bias": False},
        "data": {"task": "text", "path": str(corpus), "block_size": 16},
        "train": {"max_steps": 20, "batch_size": 4, "lr": 1e-2, "beta2": 0.99, "weight_decay": 0.1,
                  "schedule": "cosine", "warmup_steps": 5, "min_lr": 1e-3, "grad_clip": 0.5, "log_every": 1,
                  "eval_every": 100, "checkpoint_every": 100, "dtype": "float64", "restore_best": False},
    }
    trainer = Trainer(config, tmp_path / "run", quiet=True)
    model, task = trainer.model, trainer.task
    ref = from_numformer(model).double()
    tparams = dict(ref.named_parameters())
    names = {id(p): n for n, p in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            tparams[_torch_name(ref, n)].copy_(torch.from_numpy(p.data))
    groups = [{"params": [tparams[_torch_name(ref, names[id(p)])] for p in g["params"]],
               "weight_decay": g["weight_decay"]} for g in trainer.optimizer.param_groups]
    opt = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    batch_rng = np.random.default_rng()
    batch_rng.bit_generator.state = trainer.data_rng.bit_generator.state   # the batches numformer will draw

    torch_losses = []
    for step in range(20):
        for g in opt.param_groups:
            g["lr"] = trainer.schedule(step)
        b = task.train_batch(4, batch_rng)
        logits = ref(torch.from_numpy(b.inputs["idx"]))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.from_numpy(b.targets).reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt.step()
        torch_losses.append(loss.item())

    trainer.train()
    ours = [r["train_loss"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
            if "train_loss" in r]
    np.testing.assert_allclose(ours, torch_losses, rtol=1e-9)
    assert torch_losses[-1] < torch_losses[0] - 0.5
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.data, tparams[_torch_name(ref, n)].detach().numpy(), rtol=1e-8, atol=1e-10,
                                   err_msg=n)
