"""numformer reproduce: a quick experiment writes its JSON, markdown, figures and the results index."""
from __future__ import annotations

import json

import pytest

from numformer.cli import main
from numformer.experiments import resolve


def test_quick_reproduce_writes_results(tmp_path, capsys):
    results, runs = tmp_path / "results", tmp_path / "runs"
    assert main(["reproduce", "copy", "--quick", "--results", str(results), "--runs", str(runs), "--quiet"]) == 0
    record = json.loads((results / "copy.json").read_text())
    assert {"exact_match", "test_loss"} <= set(record["figures"])
    assert record["targets"] == {"exact_match": ">= 0.99"}
    for key in ("config", "seed", "wall_time_s", "commit", "machine", "steps"):
        assert key in record
    assert record["config"]["train"]["max_steps"] == 20          # the quick overrides
    md = (results / "copy.md").read_text()
    assert "| exact_match |" in md and "figures/copy_loss.png" in md and "figures/copy_attention.png" in md
    for png in ("copy_loss.png", "copy_attention.png"):
        assert (results / "figures" / png).stat().st_size > 1000
    index = (results / "README.md").read_text()
    assert "[copy](copy.md)" in index
    assert "copy: test_loss" in capsys.readouterr().out


def test_groups_and_unknown_names():
    assert [e.name for e in resolve("synthetic")] == ["copy", "reversal", "parity", "addition", "sorting"]
    with pytest.raises(ValueError, match="unknown experiment 'bogus'"):
        resolve("bogus")
