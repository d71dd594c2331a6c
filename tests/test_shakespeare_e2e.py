"""End to end: train a tiny char-level GPT on a slice of tiny Shakespeare, evaluate it, generate from the run."""
from __future__ import annotations

import json

import pytest

from numformer.cli import main
from numformer.data.text import read_corpus


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shakespeare")
    corpus = tmp / "slice.txt"
    corpus.write_text(read_corpus()[:50_000])
    cfg = tmp / "tiny.toml"
    cfg.write_text(f"""
[model]
type = "gpt"
n_layers = 2
n_heads = 2
d_model = 32
bias = false
[data]
task = "text"
path = "{corpus}"
block_size = 32
[train]
max_steps = 60
batch_size = 16
lr = 3e-3
schedule = "cosine"
warmup_steps = 10
min_lr = 3e-4
eval_every = 30
checkpoint_every = 30
""")
    run = tmp / "run"
    assert main(["train", str(cfg), "--out", str(run), "--quiet"]) == 0
    return run


def test_training_reduced_the_loss(run_dir):
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [x["train_loss"] for x in lines if "train_loss" in x]
    assert train[-1] < train[0] - 0.8          # from ~ln(vocab) toward character statistics


def test_eval_reports_perplexity_and_bits_per_character(run_dir, capsys):
    assert main(["eval", str(run_dir), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["perplexity"] > 1 and abs(r["bits_per_character"] * 0.6931471805599453 - r["loss"]) < 1e-9


def test_generate_streams_a_repeatable_sample(run_dir, capsys):
    args = ["generate", str(run_dir), "--prompt", "ROMEO:", "--max-new-tokens", "40", "--seed", "7",
            "--top-k", "20", "--temperature", "0.8"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert first.startswith("ROMEO:") and len(first) == len("ROMEO:") + 40 + 1
    assert main(args) == 0
    assert capsys.readouterr().out == first
    assert main(["generate", str(run_dir), "--prompt", "ROMEO:", "--max-new-tokens", "40", "--greedy"]) == 0


def test_generate_rejects_unknown_characters(run_dir, capsys):
    assert main(["generate", str(run_dir), "--prompt", "Zürich ☃", "--max-new-tokens", "5"]) == 2
    err = capsys.readouterr().err
    assert "not in the vocabulary" in err and "☃" in err and "ü" in err
