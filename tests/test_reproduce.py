"""numformer reproduce: each synthetic experiment's quick version writes its JSON, markdown, figures and the index."""
from __future__ import annotations

import json

import pytest

from numformer.cli import main
from numformer.experiments import resolve

# name -> (target metric, attention figures): the encoder-decoders draw cross, decoder and encoder attention.
SYNTHETIC = {
    "copy": ("exact_match", ["copy_attention_cross.png", "copy_attention_decoder.png", "copy_attention_encoder.png"]),
    "reversal": ("exact_match", ["reversal_attention_cross.png"]),
    "parity": ("accuracy", ["parity_attention_cross.png"]),
    "addition": ("exact_match", ["addition_attention.png"]),
    "sorting": ("exact_match", ["sorting_attention.png"]),
}


def quick(name, tmp_path):
    results, runs = tmp_path / "results", tmp_path / "runs"
    assert main(["reproduce", name, "--quick", "--results", str(results), "--runs", str(runs), "--quiet"]) == 0
    return results


@pytest.mark.parametrize("name", list(SYNTHETIC))
def test_quick_reproduce_writes_results(tmp_path, capsys, name):
    results = quick(name, tmp_path)
    metric, attention = SYNTHETIC[name]
    record = json.loads((results / f"{name}.json").read_text())
    assert {metric, "test_loss"} <= set(record["figures"])
    assert record["targets"] == {metric: ">= 0.95" if name == "parity" else ">= 0.99"}
    for key in ("config", "seed", "wall_time_s", "commit", "machine", "steps", "date", "command"):
        assert key in record
    assert record["config"]["train"]["max_steps"] == 12          # the quick overrides
    assert record["command"] == f"numformer reproduce {name} --quick"
    md = (results / f"{name}.md").read_text()
    assert f"| {metric} |" in md and "Model: " in md and ("Why this model" in md or "Technique" in md)
    for png in [f"{name}_loss.png", f"{name}_metrics.png", *attention]:
        assert f"figures/{png}" in md
        assert (results / "figures" / png).stat().st_size > 1000
    assert f"[{name}]({name}.md)" in (results / "README.md").read_text()
    assert f"{name}: test_loss" in capsys.readouterr().out
    if name == "parity":                                       # the EncoderClassifier baseline is reported too
        assert 0 <= record["figures"]["classifier_accuracy"] <= 1
        assert record["config"]["model"]["type"] == "transformer"
        assert "Baseline: the EncoderClassifier" in md
    if name == "copy":                                         # cross-attention first: it shows the diagonal
        assert md.index("copy_attention_cross.png") < md.index("copy_attention_encoder.png")


def test_groups_and_unknown_names():
    assert [e.name for e in resolve("synthetic")] == ["copy", "reversal", "parity", "addition", "sorting"]
    with pytest.raises(ValueError, match="unknown experiment 'bogus'"):
        resolve("bogus")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SYNTHETIC))
def test_full_experiment_reaches_its_target(tmp_path, name):
    """The real experiment (minutes each; `make test-slow`): it reaches the seed's figure."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    assert main(["reproduce", name, "--results", str(results), "--runs", str(runs), "--quiet"]) == 0
    record = json.loads((results / f"{name}.json").read_text())
    assert all(record["met"].values()), record["figures"]


def test_quick_reproduce_shakespeare_char(tmp_path, capsys):
    """The main job as an experiment: validation loss target, bits per character, a sample, the figures."""
    results = quick("shakespeare_char", tmp_path)
    record = json.loads((results / "shakespeare_char.json").read_text())
    assert record["targets"] == {"test_loss": "<= 1.93"}
    figures = record["figures"]
    assert figures["bits_per_character"] == pytest.approx(figures["test_loss"] / 0.6931471805599453)
    assert figures["processes"] >= 1 and figures["train_tokens_per_s"] > 0
    assert record["config"]["train"]["max_steps"] == 12 and record["config"]["model"]["n_layers"] == 1
    md = (results / "shakespeare_char.md").read_text()
    assert "```text\nROMEO:" in md and "ROMEO:ROMEO:" not in md and "| test_loss |" in md and "nanoGPT" in md
    for png in ("shakespeare_char_loss.png", "shakespeare_char_attention.png"):
        assert (results / "figures" / png).stat().st_size > 1000
    assert "[shakespeare_char](shakespeare_char.md)" in (results / "README.md").read_text()


@pytest.mark.slow
def test_full_shakespeare_char_reaches_its_target(tmp_path):
    results, runs = tmp_path / "results", tmp_path / "runs"
    assert main(["reproduce", "shakespeare_char", "--results", str(results), "--runs", str(runs), "--quiet"]) == 0
    record = json.loads((results / "shakespeare_char.json").read_text())
    assert all(record["met"].values()), record["figures"]


def test_quick_llama_experiment_compares_seed_studies(tmp_path):
    """shakespeare_char_llama's page compares its seed study with shakespeare_char's over their common seeds."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    common = ["--quick", "--results", str(results), "--runs", str(runs), "--quiet"]
    assert main(["reproduce", "shakespeare_char", "--seeds", "3", *common]) == 0
    assert main(["reproduce", "shakespeare_char_llama", "--seeds", "2", *common]) == 0
    ours = json.loads((results / "shakespeare_char_llama_seeds.json").read_text())
    theirs = json.loads((results / "shakespeare_char_seeds.json").read_text())
    assert ours["config"]["model"]["positional"] == "rope" and theirs["config"]["model"]["positional"] == "learned"
    md = (results / "shakespeare_char_llama.md").read_text()
    mean = sum(r["val_loss"] for r in theirs["seeds"][:2]) / 2          # seeds 0 and 1 only: the common ones
    assert "## Against `shakespeare_char`" in md and f"| shakespeare_char | {mean:.4f} |" in md
    assert "nanoGPT's 1.88" not in md


def test_the_committed_results_index_is_the_one_its_records_generate(tmp_path):
    """results/README.md lists every committed result as write_index makes it from the JSON records (a record
    copied in from a run elsewhere must come with the index regenerated)."""
    import shutil
    from pathlib import Path

    from numformer.experiments.runner import write_index

    results = Path(__file__).resolve().parents[1] / "results"
    for path in [*results.glob("*.json"), results / "bench.md"]:
        shutil.copy(path, tmp_path / path.name)
    write_index(tmp_path)
    assert (tmp_path / "README.md").read_text() == (results / "README.md").read_text(), \
        "results/README.md is stale: regenerate it with numformer.experiments.runner.write_index('results')"
