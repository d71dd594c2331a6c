"""numformer reproduce positional: the quick version writes its table, figures and JSON; learned position tables
have rows up to 4L that training never reaches, and the evaluation at lengths beyond L runs on them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from numformer import ops
from numformer.cli import main
from numformer.data.base import IGNORE
from numformer.experiments import Context, resolve
from numformer.experiments.positional import ENCODINGS, TASKS, eval_lengths, position_accuracy, run_config
from numformer.train import Trainer


def test_eval_lengths():
    assert eval_lengths(16) == [8, 16, 24, 32, 48, 64]
    assert eval_lengths(8) == [4, 8, 12, 16, 24, 32]


def test_quick_reproduce_writes_table_and_figures(tmp_path, capsys):
    results, runs = tmp_path / "results", tmp_path / "runs"
    assert main(["reproduce", "positional", "--quick", "--results", str(results), "--runs", str(runs),
                 "--quiet"]) == 0
    record = json.loads((results / "positional.json").read_text())
    L = record["L"]
    assert L == 8 and record["eval_lengths"] == [4, 8, 12, 16, 24, 32]
    assert ENCODINGS == ("sinusoidal", "learned", "rope", "alibi")
    assert record["command"] == "numformer reproduce positional --quick"
    for t in TASKS:
        for e in ENCODINGS:
            run = record["runs"][f"{t}/{e}"]
            assert set(run["exact_match"]) == {"4", "8", "12", "16", "24", "32"}
            assert all(0 <= v <= 1 for v in run["token_accuracy"].values())
            assert len(run["position_accuracy@32"]) == 33           # 32 symbols and <eos>
            for n in record["eval_lengths"]:
                assert 0 <= record["figures"][f"{t}_{e}_exact_match@{n}"] <= 1
            assert (runs / f"positional_{t}_{e}" / "model.safetensors").is_file()
    md = (results / "positional.md").read_text()
    assert "| task | encoding | 4 | 8 (L) | 12 | 16 | 24 | 32 |" in md
    assert md.count("| copy | ") == 4 + 4 and md.count("| reversal | ") == 4 + 4   # results and training tables
    assert "| copy | rope |" in md and "| reversal | alibi |" in md
    assert "**Reading**" in md and "Not learned within the trained lengths" in md  # honest about a 12-step run
    for png in ("positional.png", "positional_positions.png"):
        assert f"figures/{png}" in md
        assert (results / "figures" / png).stat().st_size > 5000
    assert "[positional](positional.md)" in (results / "README.md").read_text()
    assert "positional: copy_sinusoidal_exact_match@4" in capsys.readouterr().out


def test_learned_rows_beyond_L_get_no_gradient_and_evaluate(tmp_path):
    """Training on lengths 1..L touches the first L (source) and L + 1 (target) rows of the learned tables only;
    the model still has rows up to 4L + 1, so evaluating at 1.5L .. 4L runs (on untrained rows)."""
    exp = resolve("positional")[0]
    ctx = Context(runs_dir=tmp_path, results_dir=tmp_path, quick=True, quiet=True)
    config = run_config(exp, ctx, "reversal", "learned")
    L = config["data"]["length"]
    trainer = Trainer(config, tmp_path / "run", quiet=True)
    model, task = trainer.model, trainer.task
    assert model.max_len >= 4 * L + 1 and task.min_length == 1
    rng = np.random.default_rng(0)
    for _ in range(3):                              # batches of mixed lengths, up to L
        batch = task.train_batch(64, rng)
        assert batch.inputs["src"].shape[1] <= L
        model.zero_grad()
        logits = model(**batch.inputs)
        _, cache = ops.cross_entropy_forward(logits, batch.targets, ignore_index=IGNORE)
        model.backward(ops.cross_entropy_backward(cache))
        src_g, tgt_g = model.src_pos.weight.grad, model.tgt_pos.weight.grad
        assert np.all(src_g[L:] == 0) and np.all(tgt_g[L + 1:] == 0)
        assert np.abs(tgt_g[:L + 1]).sum() > 0
    model.eval()
    metrics = task.evaluate(model, "test")
    for n in eval_lengths(L):
        key = "" if n == L else f"@{n}"
        assert 0 <= metrics[f"exact_match{key}"] <= 1 and 0 <= metrics[f"token_accuracy{key}"] <= 1
    acc = position_accuracy(model, task, 2 * L)
    assert acc.shape == (2 * L + 1,) and np.all((0 <= acc) & (acc <= 1))
    assert not Path(tmp_path / "run" / "model.safetensors").exists()     # nothing trained or written here


def test_reading_of_the_committed_full_run():
    """The reading names the runs that did not learn, and mentions --quick only for a quick run."""
    from numformer.experiments.positional import reading, runs_from_record

    record = json.loads((Path(__file__).resolve().parents[1] / "results" / "positional.json").read_text())
    runs = runs_from_record(record)
    args = (runs, record["L"], record["eval_lengths"], int(record["config"]["data"]["vocab"]))
    full, quick = reading(*args), reading(*args, quick=True)
    assert "--quick" not in full and "--quick" in quick
    unlearned = [f"{t} with {e}" for (t, e), r in runs.items()
                 if min(r["table"][n]["exact_match"] for n in r["table"] if n <= record["L"]) < 0.9]
    assert unlearned and all(name in full for name in unlearned)
    assert f"the {len(runs) - len(unlearned)} models that did learn" in full
    low, (task, encoding), n = min((r["table"][n]["exact_match"], k, n) for k, r in runs.items()
                                   for n in r["table"] if n <= record["L"])
    assert f"the lowest exact match of the {len(runs)} models is {100 * low:.1f}% ({task} with {encoding} at " \
           f"length {n})" in full
