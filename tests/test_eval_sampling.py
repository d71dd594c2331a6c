"""Evaluations that compare like with like: a capped periodic evaluation is a fixed sample spread over the whole
validation split, the best checkpoint is chosen on one yardstick, and the summary reports the whole-split loss of
the weights it saves (what `numformer eval` prints)."""
import json
import shutil

import numpy as np
import pytest

from numformer.cli import build_parser, main
from numformer.experiments import with_seeds
from numformer.data.base import spread_sample
from numformer.train import Trainer, evaluate_loss
from numformer.train import evaluation as evaluation_module
from numformer.train.evaluation import mean_loss

from conftest import set_commit

BLOCK, EVAL_BS, EVAL_BATCHES = 16, 16, 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Training text: 100 random letters (which the model soon overfits) and "abab..."; validation text: 800
    characters of "abab..." (easy: the first 50 windows), then 3,200 random letters (hard)."""
    rng = np.random.default_rng(0)
    letters = list("abcdefgh")
    train = "".join(rng.choice(letters, 100)) + "ab" * 300
    val = "ab" * 400 + "".join(rng.choice(letters, 3200))
    path = tmp_path_factory.mktemp("corpus") / "easy_first.txt"
    path.write_text(train + val)
    return str(path), len(val) / len(train + val)


def config(corpus, **train):
    path, val_fraction = corpus
    return {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 64, "dropout": 0.0},
            "data": {"task": "text", "path": path, "block_size": BLOCK, "val_fraction": val_fraction},
            "train": {"max_steps": 150, "batch_size": 16, "lr": 3e-3, "schedule": "constant", "warmup_steps": 0,
                      "eval_every": 10, "checkpoint_every": 20, "log_every": 10, "seed": 1, "processes": 1,
                      "eval_batches": EVAL_BATCHES, "eval_batch_size": EVAL_BS, **train}}


def eval_lines(run_dir):
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if "val_tokens" in r]


def eval_cli_loss(run_dir, capsys):
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--json"]) in (0, None)
    return json.loads(capsys.readouterr().out)["loss"]


def test_spread_sample_is_fixed_and_covers_the_whole_range():
    a, b = spread_sample(1000, 10, seed=3), spread_sample(1000, 10, seed=3)
    assert np.array_equal(a, b) and not np.array_equal(a, spread_sample(1000, 10, seed=4))
    assert np.all((a >= np.arange(10) * 100) & (a < np.arange(1, 11) * 100))      # one index per tenth
    assert np.array_equal(spread_sample(5, 10), np.arange(5))                        # all when k >= n


def test_the_estimate_is_unbiased_where_the_first_windows_are_easy(corpus, tmp_path):
    trainer = Trainer(config(corpus, max_steps=20), tmp_path / "run", quiet=True)
    trainer.train()
    model, task = trainer.model, trainer.task
    n = task.eval_size("val")
    per_window = np.array([mean_loss(model, [b])[0] for b in task.eval_batches("val", 1)])
    assert len(per_window) == n
    whole = evaluate_loss(model, task, "val", EVAL_BS)
    assert whole == pytest.approx(per_window.mean(), rel=1e-5)
    k = EVAL_BATCHES * EVAL_BS
    # standard error of the mean of k windows drawn at random from n (a stratified sample does no worse)
    se = per_window.std(ddof=1) / np.sqrt(k) * np.sqrt((n - k) / (n - 1))
    first = per_window[:k].mean()                  # what capping to the first windows used to measure
    assert whole - first > 5 * se, "the constructed corpus must make the first windows much easier"
    for seed in range(5):
        estimate = evaluate_loss(model, task, "val", EVAL_BS, max_batches=EVAL_BATCHES, seed=seed)
        assert abs(estimate - whole) < 3 * se, (seed, estimate, whole, se)
    # the trainer's periodic evaluations are this sample, labelled as an estimate with its tokens
    lines = eval_lines(trainer.run_dir)
    assert lines and all("val_loss_estimate" in r and "val_loss" not in r for r in lines)
    assert all(r["val_tokens"] == k * BLOCK for r in lines)


def test_the_saved_weights_are_the_best_on_the_whole_split(corpus, tmp_path, monkeypatch, capsys):
    """Best step before the last: the step chosen on the fixed sample is saved (its whole-split loss beats the
    last step's), and the summary's best_val_loss is its whole-split loss, which `numformer eval` prints.
    (The sample ranks the steps, so its best need not be the whole split's best among all steps: the test
    recomputes the sample's ranking rather than assuming the two agree, which depends on rounding.)"""
    trainer = Trainer(config(corpus), tmp_path / "run", quiet=True)
    snapshots, estimates, real = {}, {}, trainer.evaluation.periodic

    def evaluate_and_snapshot(step):
        snapshots[trainer.step] = {k: v.copy() for k, v in trainer.model.state_dict().items()}
        result, key = real(step)
        estimates[trainer.step] = result[key]
        return result, key

    monkeypatch.setattr(trainer.evaluation, "periodic", evaluate_and_snapshot)
    summary = trainer.train()
    whole = {}
    for step, weights in snapshots.items():
        trainer.model.load_state_dict(weights)
        whole[step] = evaluate_loss(trainer.model, trainer.task, "val", EVAL_BS)
    sample_best = min(estimates, key=estimates.get)
    assert sample_best != summary["last_step"] == 150
    assert whole[sample_best] < whole[150], "the constructed corpus must make an early step best"
    assert summary["best_step"] == summary["selected_step"] == sample_best and summary["weights"] == "best"
    assert summary["best_val_loss"] == pytest.approx(whole[sample_best], abs=1e-9)
    assert summary["last_val_loss"] == pytest.approx(whole[150], abs=1e-9)
    assert summary["selected_on"] == "val_loss_estimate" and summary["estimate_examples"] == EVAL_BATCHES * EVAL_BS
    assert eval_cli_loss(trainer.run_dir, capsys) == pytest.approx(summary["best_val_loss"], abs=1e-6)


def test_the_last_weights_are_kept_when_they_are_better(corpus, tmp_path, capsys):
    summary = Trainer(config(corpus, lr=1e-3, max_steps=10, eval_every=5), tmp_path / "run", quiet=True).train()
    assert summary["best_step"] == summary["selected_step"] == summary["last_step"] == 10
    assert summary["weights"] == "last"
    assert summary["best_val_loss"] == summary["last_val_loss"]
    assert eval_cli_loss(tmp_path / "run", capsys) == pytest.approx(summary["best_val_loss"], abs=1e-6)


def test_the_whole_split_decides_between_the_selected_and_the_last_weights(corpus, tmp_path, monkeypatch, capsys):
    """The sample prefers step 5, the whole split the last step: the last weights are kept and reported."""
    sample_evaluations = []
    real = evaluation_module.mean_loss

    def estimate_favours_step_5(model, batches, bytes_seen=None):
        loss, count = real(model, batches, bytes_seen)
        if count == EVAL_BATCHES * EVAL_BS * BLOCK:        # the fixed sample: the first evaluation looks best
            sample_evaluations.append(loss)
            return (0.1 if len(sample_evaluations) == 1 else 5.0), count
        return loss, count

    monkeypatch.setattr(evaluation_module, "mean_loss", estimate_favours_step_5)
    trainer = Trainer(config(corpus, lr=1e-3, max_steps=10, eval_every=5), tmp_path / "run", quiet=True)
    summary = trainer.train()
    assert summary["selected_step"] == 5 and summary["best_step"] == 10 and summary["weights"] == "last"
    assert summary["selected_val_loss"] > summary["best_val_loss"] == summary["last_val_loss"]
    monkeypatch.undo()
    assert eval_cli_loss(tmp_path / "run", capsys) == pytest.approx(summary["best_val_loss"], abs=1e-6)


def test_a_resumed_run_evaluates_on_the_same_sample(corpus, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    a = Trainer(config(corpus, max_steps=60), straight, quiet=True).train()
    Trainer(config(corpus, max_steps=60), resumed, quiet=True).train(stop_after=30)
    b = Trainer(None, resumed, resume=True, quiet=True).train()
    assert eval_lines(straight) == eval_lines(resumed)              # every figure, bit for bit
    for key in ("best_val_loss", "best_step", "selected_step", "selected_val_loss", "last_val_loss"):
        assert a[key] == b[key], key


def test_reproduce_seeds_writes_the_seed_study(tmp_path, capsys):
    results, runs = tmp_path / "results", tmp_path / "runs"
    args = ["reproduce", "shakespeare_char", "--quick", "--seeds", "2", "--results", str(results), "--runs",
            str(runs), "--quiet"]
    assert main(args) == 0
    study = json.loads((results / "shakespeare_char_seeds.json").read_text())
    assert [r["seed"] for r in study["seeds"]] == [0, 1] and study["val_loss"]["n"] == 2
    assert study["nanogpt_estimate"]["batches"] == 20 and study["nanogpt_estimate"]["batch_size"] == 12
    md = (results / "shakespeare_char.md").read_text()
    assert "## 2 seeds" in md and "estimate_loss" in md and f"{study['val_loss']['mean']:.4f}" in md
    main_run = json.loads((results / "shakespeare_char.json").read_text())
    summary = json.loads((runs / "shakespeare_char" / "summary.json").read_text())
    assert main_run["figures"]["test_loss"] == pytest.approx(summary["best_val_loss"], abs=1e-9)
    assert main(["reproduce", "copy", "--quick", "--seeds", "2", "--results", str(results), "--quiet"]) == 2
    assert "'copy' takes no seeds (`numformer reproduce --help` names those that do)" in capsys.readouterr().err
    help_text = build_parser()._subparsers._group_actions[0].choices["reproduce"].format_help()
    assert all(name in " ".join(help_text.split()) for name in with_seeds())
    assert {"gpt_to_llama", "shakespeare_tokenizers", "shakespeare_char"} <= set(with_seeds())


def test_reproduce_seeds_resumes_a_seed_run_instead_of_restarting_it(tmp_path, monkeypatch):
    set_commit(monkeypatch, "abc1234")                 # a clean commit: runs of the same code may be reused
    results, runs = tmp_path / "results", tmp_path / "runs"
    args = ["reproduce", "shakespeare_char", "--quick", "--seeds", "2", "--results", str(results), "--runs",
            str(runs), "--quiet"]
    assert main(args) == 0
    first = json.loads((results / "shakespeare_char_seeds.json").read_text())
    checkpoint = runs / "shakespeare_char_seeds" / "seed_0" / "checkpoint.safetensors"
    written = checkpoint.stat().st_mtime_ns
    shutil.rmtree(runs / "shakespeare_char")          # the main run is gone; the finished seed runs stay
    assert main(args) == 0                             # the seed runs are reused, not trained again
    assert checkpoint.stat().st_mtime_ns == written   # not trained again
    again = json.loads((results / "shakespeare_char_seeds.json").read_text())
    assert [r["val_loss"] for r in again["seeds"]] == [r["val_loss"] for r in first["seeds"]]
