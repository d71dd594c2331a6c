"""numformer reproduce induction_heads: the quick version writes its record, page and figures; the pieces that
read the curves (the phase change, the ablation) on hand-made inputs."""
from __future__ import annotations

import json

import numpy as np
import pytest

from numformer.cli import main
from numformer.experiments.induction_heads import ablation, phase_change, resolved_settings
from numformer.models import GPT

FIGURES = ("in_context_score_before", "in_context_score_after", "one_layer_in_context_score_after",
           "induction_score_max", "phase_change_step")


def test_quick_reproduce_writes_the_record_the_page_and_the_figures(tmp_path):
    results = tmp_path / "results"
    assert main(["reproduce", "induction_heads", "--quick", "--results", str(results), "--runs",
                 str(tmp_path / "runs"), "--quiet"]) == 0
    record = json.loads((results / "induction_heads.json").read_text())
    assert set(FIGURES) <= set(record["figures"])
    assert set(record["targets"]) == {"in_context_score_rise", "in_context_score_gap", "induction_score_max",
                                      "ablation_loss_increase"}
    assert 0.0 <= record["figures"]["induction_score_max"] <= 1.0
    # an ablation only of heads that are induction heads (none after 6 steps): no figure, the target unmet
    assert record["induction_heads"] == [] and "ablation_loss_increase" not in record["figures"]
    assert record["met"]["ablation_loss_increase"] is None
    two = record["history"]["two_layers"]
    assert [h["step"] for h in two] == [0, 3, 6]
    assert np.array(two[-1]["induction"]).shape == (2, 4)            # every head of both layers, every evaluation
    assert np.array(record["history"]["one_layer"][-1]["induction"]).shape == (1, 4)
    assert record["command"] == "numformer reproduce induction_heads --quick"
    md = (results / "induction_heads.md").read_text()
    assert "| induction_score_max |" in md and "Verdict: not reproduced" in md and "nothing to ablate" in md
    for name in ("curves", "positions", "scores", "pattern"):
        assert f"figures/induction_heads_{name}.png" in md
        assert (results / "figures" / f"induction_heads_{name}.png").stat().st_size > 1000
    assert "[induction_heads](induction_heads.md)" in (results / "README.md").read_text()


def test_an_unknown_setting_is_one_clear_error():
    with pytest.raises(ValueError, match="induction_heads has no setting train.stpes"):
        resolved_settings(["train.stpes=3"])
    assert resolved_settings(["train.steps=3"])["train"]["steps"] == 3
    with pytest.raises(ValueError, match="the eval positions need early - 10 >= 0"):
        resolved_settings(["eval.late_from=300"])


def test_the_phase_change_is_the_steepest_rise_of_the_best_induction_score():
    history = [{"step": s, "induction": [[0.0, v]]} for s, v in zip((0, 100, 200, 300, 400), (0.02, 0.05, 0.1, 0.7, 0.8))]
    assert phase_change(history) == (2, 250.0)


def test_ablating_a_head_that_writes_nothing_changes_no_loss_and_a_real_head_does():
    model = GPT(7, 16, n_layers=2, n_heads=2, d_model=8, feed_forward=False, rng=0, dtype=np.float64).eval()
    W = model.blocks[1].self_attn.out_proj.weight.data.reshape(8, 2, 4)
    W[:, 1] = 0.0
    ids = np.random.default_rng(0).integers(0, 7, (3, 12))
    ablated, plain = ablation(model, ids, [(1, 1)])
    np.testing.assert_allclose(ablated, plain, atol=1e-12)
    ablated, plain = ablation(model, ids, [(1, 0), (0, 1)])
    assert np.abs(ablated - plain).max() > 1e-4
