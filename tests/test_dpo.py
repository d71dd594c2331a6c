"""DPO ([train] objective = "dpo", [data] task = "preference"): the step's gradient by finite differences, the
reference log-probabilities computed once and stored, training that raises the implicit reward's accuracy
(full and LoRA), exact resume, and the one-line errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from numformer.cli import main
from numformer.data.chat_tasks import PreferenceTask, sequence_logprobs
from numformer.gradcheck import check_gradients
from numformer.models import GPT
from numformer.train import Trainer
from numformer.train.run_folder import REFERENCE
from numformer.train.step import dpo_loss_and_backward

from conftest import assert_gradcheck, interrupt_after_the_header
from test_chat_sft import CORPUS, tokenizer
from test_train import checkpoint_arrays

PAIRS = [{"prompt": "Is this review positive or negative? A wonderful film.", "chosen": "positive",
          "rejected": "negative"},
         {"instruction": "Write a negative review about a boat.", "input": "",
          "chosen": "The boat sank. Dull.", "rejected": "A wonderful film."},
         {"prompt": [{"role": "user", "content": "Shorter?"}], "chosen": "Dull.", "rejected": "The film, the boat."}]


def write_pairs(tmp_path):
    (tmp_path / "pairs.json").write_text(json.dumps(PAIRS * 4))
    return tmp_path / "pairs.json"


def test_dpo_step_gradients_by_finite_differences(tmp_path):
    tok = tokenizer()
    task = PreferenceTask({"path": str(write_pairs(tmp_path)), "val_size": 1}, 0, tok.to_dict())
    model = GPT(vocab_size=tok.vocab_size, d_model=8, n_layers=1, n_heads=2, block_size=64, rng=0, dtype=np.float64)
    task.set_reference(sequence_logprobs(model, task, np.arange(len(task.examples))) - 0.3)
    batch = task.pair_batch(np.array([0, 1, 2]))
    params = {n: p for n, p in model.named_parameters() if n in ("blocks.0.ff.linear1.weight", "lm_head.weight",
                                                                  "tok_emb.weight")}

    def loss():
        from numformer import ops
        logp, _ = ops.sequence_logprob_forward(model(**batch.inputs), batch.targets)
        return np.asarray(ops.dpo_loss_forward(logp[:3], logp[3:], batch.extra["reference"][:3],
                                               batch.extra["reference"][3:], 0.5)[0])

    def backward(dy):
        model.zero_grad()
        dpo_loss_and_backward(model, batch, 0.5, float(dy))
        return {n: p.grad for n, p in params.items()}

    assert_gradcheck(check_gradients(loss, backward, {n: p.data for n, p in params.items()}))


def sft_base(tmp_path):
    (tmp_path / "t.txt").write_text(CORPUS * 20)
    assert main(["train", "configs/shakespeare_char.toml", "--out", str(tmp_path / "base"), "--set",
                 f"data.path={tmp_path / 't.txt'}", "--set", "data.tokenizer=bpe", "--set", "data.vocab_size=300",
                 "--set", "data.block_size=96", "--set", "train.max_steps=2", "--set", "model.n_layers=1",
                 "--set", "model.d_model=16", "--set", "train.processes=1", "--quiet"]) == 0
    return tmp_path / "base"


def dpo_config(tmp_path, base, lora=False, **train):
    return {"model": {"init_from": str(base)},
            "data": {"task": "preference", "path": str(write_pairs(tmp_path)), "block_size": 96, "val_size": 3},
            "train": {"objective": "dpo", "beta": 0.5, "max_steps": 20, "batch_size": 4, "lr": 1e-2, "eval_every": 10,
                      "checkpoint_every": 10, "log_every": 5, "processes": 1, **train},
            **({"lora": {"r": 4, "alpha": 8, "target_modules": ["c_attn", "c_fc"]}} if lora else {})}


@pytest.mark.parametrize("lora", [False, True])
def test_dpo_run_raises_the_reward_accuracy_and_stores_the_reference(tmp_path, lora):
    base = sft_base(tmp_path)
    trainer = Trainer(dpo_config(tmp_path, base, lora), tmp_path / "dpo", quiet=True)
    start = sequence_logprobs(trainer.model, trainer.task, np.arange(len(trainer.task.examples)))
    stored = checkpoint_arrays_of(tmp_path / "dpo" / REFERENCE)
    np.testing.assert_array_equal(stored, start)                       # the starting model's, stored once
    before = trainer.task.evaluate(trainer.model, "train")
    assert abs(before["logratio_margin"]) < 1e-4           # policy = reference (float32 batches padded differently)
    trainer.train()
    after = trainer.task.evaluate(trainer.model, "train")
    assert after["reward_accuracy"] == 1.0 and after["logratio_margin"] > 0
    np.testing.assert_array_equal(checkpoint_arrays_of(tmp_path / "dpo" / REFERENCE), start)   # not recomputed


def test_a_dpo_run_keeps_its_last_weights_unless_told_otherwise(tmp_path, capsys):
    """DPO raises the replies' cross-entropy (val_loss) as it works, so its "best" weights by val_loss would be
    those of before the tuning: restore_best defaults to false for objective = "dpo" (model.safetensors holds
    the last step's weights); a config that sets it keeps its choice, and cross-entropy runs keep true."""
    from numformer.config import resolve_config
    from numformer.run_files import MODEL, weights_step

    base = sft_base(tmp_path)
    trainer = Trainer(dpo_config(tmp_path, base), tmp_path / "dpo", quiet=True)
    assert trainer.config["train"]["restore_best"] is False
    trainer.train()
    assert weights_step(tmp_path / "dpo" / MODEL) == 20
    capsys.readouterr()                                 # eval reports the figures training showed
    assert main(["eval", str(tmp_path / "dpo"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    expected = trainer.task.evaluate(trainer.model, "val")
    assert shown["reward_accuracy"] == expected["reward_accuracy"]
    assert shown["logratio_margin"] == pytest.approx(expected["logratio_margin"], rel=1e-6)
    chosen = Trainer(dpo_config(tmp_path, base, restore_best=True), tmp_path / "dpo_best", quiet=True)
    assert chosen.config["train"]["restore_best"] is True
    sft = resolve_config({"data": {"task": "copy"}})[0]
    assert sft["train"]["restore_best"] is True


def checkpoint_arrays_of(path):
    from safetensors.numpy import load_file
    return load_file(str(path))["reference"]


def test_dpo_run_resumes_bit_exact(tmp_path):
    base = sft_base(tmp_path)
    Trainer(dpo_config(tmp_path, base, True), tmp_path / "straight", quiet=True).train()
    Trainer(dpo_config(tmp_path, base, True), tmp_path / "resumed", quiet=True).train(stop_after=10)
    Trainer(None, tmp_path / "resumed", resume=True, quiet=True).train()
    a, b = checkpoint_arrays(tmp_path / "straight"), checkpoint_arrays(tmp_path / "resumed")
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_dpo_run_stopped_before_its_first_step_is_trained_again_without_overwrite(tmp_path):
    """The reference log-probabilities are written when the Trainer is built, config.json with the first step:
    a folder holding the reference alone is no run, and a new run replaces it (resume has nothing to resume)."""
    base = sft_base(tmp_path)
    Trainer(dpo_config(tmp_path, base), tmp_path / "run", quiet=True).close()        # stopped before train()
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["reference_logps.safetensors"]
    with pytest.raises(ValueError, match="no config.json"):
        Trainer(None, tmp_path / "run", resume=True, quiet=True)
    Trainer(dpo_config(tmp_path, base), tmp_path / "run", quiet=True).train(stop_after=2)
    assert (tmp_path / "run" / "config.json").is_file()


def test_an_interrupted_reference_write_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    """The reference log-probabilities go a tensor at a time into a temporary file renamed into place: a
    write cut short after the header leaves the file that was there and no partial file."""
    from safetensors.numpy import load_file

    from numformer.train import dpo

    class Pairs:
        examples = [None] * 3

        def set_reference(self, reference):
            self.reference = reference

    old, new = np.full((3, 2), -1.5), np.full((3, 2), -2.5)
    monkeypatch.setattr(dpo, "sequence_logprobs", lambda model, task, rows: old)
    dpo.set_reference_logprobs(None, Pairs(), tmp_path, resumed=False, write=True)
    path = tmp_path / REFERENCE
    assert np.array_equal(load_file(str(path))["reference"], old)
    before = path.read_bytes()
    monkeypatch.setattr(dpo, "sequence_logprobs", lambda model, task, rows: new)
    interrupt_after_the_header(monkeypatch, dpo)
    with pytest.raises(KeyboardInterrupt):
        dpo.set_reference_logprobs(None, Pairs(), tmp_path, resumed=False, write=True)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [REFERENCE]
    assert np.array_equal(dpo.read_reference(path, 3), old)


def test_objective_and_task_must_go_together(tmp_path):
    base = sft_base(tmp_path)
    c = dpo_config(tmp_path, base)
    with pytest.raises(ValueError, match=r'holds preference pairs for DPO: set \[train\] objective = "dpo"'):
        Trainer({**c, "train": {**c["train"], "objective": "cross_entropy"}}, tmp_path / "a", quiet=True)
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                                                  {"role": "assistant", "content": "Dull."}]}))
    chat = {**c, "data": {"task": "chat", "path": str(tmp_path / "chat.jsonl"), "block_size": 96, "val_size": 0}}
    with pytest.raises(ValueError, match=r'objective = "dpo" trains on preference pairs: set \[data\] task = '):
        Trainer(chat, tmp_path / "b", quiet=True)
    with pytest.raises(ValueError, match=r'objective = "dpo" trains in one process; set \[train\] processes = 1'):
        Trainer({**c, "train": {**c["train"], "processes": 2}}, tmp_path / "c", quiet=True)


def test_a_preference_file_with_a_utf8_bom_is_read(tmp_path):
    """A byte order mark was "not valid JSON (Unexpected UTF-8 BOM ...); JSON lines hold one value per line"."""
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAIRS), encoding="utf-8-sig")
    task = PreferenceTask({"path": str(path), "val_size": 0, "block_size": 96}, 0, tokenizer().to_dict())
    assert len(task.examples) == len(PAIRS)


@pytest.mark.parametrize("record, says", [
    ({"instruction": "Add", "input": 5, "chosen": "6", "rejected": "7"}, 'record 1: "input" is the number 5, not a'),
    ({"prompt": "Add", "chosen": 6, "rejected": "7"}, 'record 1: "chosen" is the number 6, not a string'),
    ({"prompt": "Add", "chosen": "6", "rejected": [{"role": "assistant", "content": "7"}]},
     'record 1: "rejected" is a JSON list, not a string'),
    ({"prompt": 5, "chosen": "6", "rejected": "7"}, 'record 1: "prompt" is the number 5, not a string or a list'),
    ({"chosen": "6", "rejected": "7"}, 'record 1 has no "prompt" (or "instruction")'),
    ({"prompt": [], "chosen": "6", "rejected": "7"}, 'record 1: "prompt" is an empty list'),
    ({"prompt": [{"role": "gpt", "content": "Add"}], "chosen": "6", "rejected": "7"},
     'record 1, prompt[0]: role "gpt" is not a chat role'),
    ({"prompt": [{"role": "assistant", "content": "Hi"}], "chosen": "6", "rejected": "7"},
     "record 1 starts with the assistant's message"),
    ({"prompt": "Add", "chosen": "6"}, "record 1 is not a preference pair"),
])
def test_a_preference_record_of_the_wrong_shape_is_one_line_naming_the_file_the_record_and_the_field(
        tmp_path, record, says):
    """``"input": 5`` was "internal error (AttributeError)"; a reply or prompt of the wrong type, or a prompt with
    an unknown role, "not a preference pair" or a silent drop, naming no field."""
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps([PAIRS[0], record]))
    with pytest.raises(ValueError) as e:
        PreferenceTask({"path": str(path), "val_size": 0, "block_size": 96}, 0, tokenizer().to_dict())
    message = str(e.value)
    assert says in message and str(path) in message and "\n" not in message, message


@pytest.mark.parametrize("damage, says", [
    ("another tensor", r"holds \['logps'\], not the one tensor 'reference'"),
    ("another shape", r"'reference' is float64 of shape \(3, 2\), not .* of the 12 pairs \(12, 2\)"),
    ("ints", r"'reference' is int64 of shape \(12, 2\)"),
    ("nan", r"'reference' holds values that are not log-probabilities"),
    ("positive", r"'reference' holds values that are not log-probabilities"),
    ("truncated", r"reference_logps.safetensors"),
])
def test_a_damaged_reference_is_one_line_naming_it(tmp_path, damage, says):
    """A resumed DPO run reads its reference log-probabilities back: another tensor was a KeyError, another
    shape an IndexError later on, NaN or a positive 'log-probability' trained silently."""
    from safetensors.numpy import save

    base = sft_base(tmp_path)
    Trainer(dpo_config(tmp_path, base, max_steps=2, checkpoint_every=2), tmp_path / "dpo", quiet=True).train()
    path = tmp_path / "dpo" / REFERENCE
    good = checkpoint_arrays_of(path)
    arrays = {"another tensor": {"logps": good}, "another shape": {"reference": good[:3]},
              "ints": {"reference": good.astype(np.int64)}, "nan": {"reference": np.where(good < -3, np.nan, good)},
              "positive": {"reference": -good}}
    path.write_bytes(path.read_bytes()[:100] if damage == "truncated" else save(arrays[damage]))
    with pytest.raises(ValueError, match=says) as e:
        Trainer(None, tmp_path / "dpo", resume=True, overrides=["train.max_steps=4"], quiet=True)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_dpo_lora_run_resumed_with_new_train_values_uses_them(tmp_path, monkeypatch):
    """[train] keys on --resume (tests/test_resume_overrides.py) on the newer runs: beta reaches the DPO loss of
    every resumed step, weight_decay the adapters' optimizer; both are recorded."""
    import numformer.train.trainer as trainer_module

    base = sft_base(tmp_path)
    Trainer(dpo_config(tmp_path, base, True, max_steps=2, checkpoint_every=2), tmp_path / "dpo", quiet=True).train()
    betas, loss = [], trainer_module.dpo_loss_and_backward
    monkeypatch.setattr(trainer_module, "dpo_loss_and_backward",
                        lambda model, batch, beta, scale: betas.append(beta) or loss(model, batch, beta, scale))
    t = Trainer(None, tmp_path / "dpo", resume=True, quiet=True,
                overrides=["train.beta=0.25", "train.weight_decay=0.1", "train.max_steps=4"])
    t.train()
    t.close()
    assert betas == [0.25, 0.25]
    assert {g["weight_decay"] for g in t.optimizer.param_groups if g["weight_decay"]} == {0.1}
    assert all(n.endswith(("lora_A", "lora_B")) for n, p in t.model.named_parameters() if p.requires_grad)
    train = json.loads((tmp_path / "dpo" / "config.json").read_text())["train"]
    assert train["beta"] == 0.25 and train["weight_decay"] == 0.1
