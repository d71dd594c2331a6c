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
    run = (tmp_path / "runs" / "shakespeare_char").as_posix()   # the page's commands name the run where it is
    assert f"`numformer eval {run}`" in md and f"`numformer generate {run} --prompt" in md
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


def test_the_results_index_marks_quick_runs(tmp_path):
    """A --quick record (it has quick_overrides) is listed as a quick run, as its page's title says; a full
    run's row is not."""
    from numformer.experiments.runner import write_index

    base = {"figures": {"accuracy": 0.5}, "targets": {"accuracy": ">= 0.9"}, "wall_time_s": 6.0,
            "commit": "abc1234", "date": "2026-11-30"}
    (tmp_path / "quick_one.json").write_text(json.dumps({"name": "quick_one", **base,
                                                          "quick_overrides": ["train.max_steps=2"]}))
    (tmp_path / "full_one.json").write_text(json.dumps({"name": "full_one", **base}))
    write_index(tmp_path)
    rows = {line.split("]")[0][3:]: line for line in (tmp_path / "README.md").read_text().splitlines()
            if line.startswith("| [")}
    assert rows["quick_one"].startswith("| [quick_one](quick_one.md) (quick run) | accuracy 0.5000 (>= 0.9) |")
    assert rows["full_one"].startswith("| [full_one](full_one.md) | accuracy 0.5000 (>= 0.9) |")


# --quick --seeds N trains the N seeds asked for: gpt_to_llama trained 1 and the speedrun ablation at most 2,
# silently, while the record said --seeds N. Tiny settings (3,000 characters of text, a few steps or a short
# budget on the fake clock): a few seconds each.
QUICK_SEEDS = {"gpt_to_llama": ["train.max_steps=2", "train.eval_every=2", "train.checkpoint_every=2"],
               "shakespeare_speedrun_ablation": ["train.budget_minutes=0.01"]}


def _seeds_trained(name, record):
    """The seeds each rung (gpt_to_llama) or row (the ablation) of a results record was trained with."""
    parts = record["rungs"] if name == "gpt_to_llama" else record["rows"]
    return {tuple(sorted(run["seed"] for run in part["runs"])) for part in parts}


@pytest.mark.parametrize("name", list(QUICK_SEEDS))
def test_quick_trains_every_seed_asked_for(tmp_path, fake_clock, name):
    from numformer.data.text import read_corpus

    fake_clock.tick = 0.05        # the ablation's budget runs on the fake clock: the same steps on any machine
    (tmp_path / "small.txt").write_text(read_corpus("")[:3000])
    settings = [*QUICK_SEEDS[name], f"data.path={tmp_path / 'small.txt'}"]
    results = tmp_path / "results"
    assert main(["reproduce", name, "--quick", "--seeds", "3", "--results", str(results), "--runs",
                 str(tmp_path / "runs"), "--quiet", *(arg for s in settings for arg in ("--set", s))]) == 0
    record = json.loads((results / f"{name}.json").read_text())
    assert _seeds_trained(name, record) == {(0, 1, 2)} and "--seeds 3" in record["command"]


@pytest.mark.parametrize("name, quick_seeds", [("gpt_to_llama", 1), ("shakespeare_speedrun_ablation", 2)])
def test_quick_without_seeds_trains_its_own_count_and_says_so(tmp_path, name, quick_seeds):
    """--quick alone trains the quick version's seeds, and ctx.seeds (the recorded --seeds) says how many;
    --quick --seeds 3 plans all 3 (runner.seeds_context)."""
    from numformer.experiments import Context
    from numformer.experiments.runner import planned_runs, seeds_context

    (exp,) = resolve(name)

    def planned_seeds(seeds):
        ctx = Context(tmp_path / "runs", tmp_path / "results", quick=True, seeds=seeds)
        return {int(folder.name.rsplit("seed_", 1)[1]) for folder, _ in planned_runs(exp, ctx)}

    assert seeds_context(exp, Context(tmp_path / "runs", tmp_path / "results", quick=True)).seeds == quick_seeds
    assert planned_seeds(0) == set(range(quick_seeds)) and planned_seeds(3) == {0, 1, 2}


def test_the_figures_table_shows_a_rate_in_whole_units_and_the_rest_to_4_places():
    from numformer.experiments.runner import figures_table

    record = {"figures": {"val_loss": 1.23456, "train_tokens_per_s": 21594.0, "steps": 2000},
              "targets": {"val_loss": "<= 1.5"}, "met": {"val_loss": True}}
    assert figures_table(record).splitlines()[2:] == ["| val_loss | 1.2346 | <= 1.5 | yes |",
                                                      "| train_tokens_per_s | 21,594 |  |  |", "| steps | 2000 |  |  |"]
