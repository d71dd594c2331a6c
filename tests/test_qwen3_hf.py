"""Hugging Face Qwen3ForCausalLM (dense Qwen3) in and out (numformer.interop.hf, qwen3.py): q/k RMSNorms before
RoPE, head_dim of its own, attention_bias on all four projections, Qwen2's windows, scaled RoPE. Random-weight
models written by transformers; nothing is downloaded. Field-by-field checks are in test_hf_fields.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from numformer.interop import hf

from test_hf_fields import (VOCAB, assert_greedy_generation_matches, assert_parity, make_family_model,
                            transformers_model)
from test_interop_hf import rel_err

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CASES = {
    "tied-head6": {"tie_word_embeddings": True},
    "untied-windows-bias": {"tie_word_embeddings": False, "attention_bias": True, "use_sliding_window": True,
                            "sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"]},
    "yarn-past-context": {"head_dim": 8, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                             "original_max_position_embeddings": 8}},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_qwen3_logits_and_every_gradient_match_transformers(tmp_path, case):
    folder = make_family_model(tmp_path, "qwen3", CASES[case])
    model = assert_parity(folder, "qwen3", torch.float64, np.float64, 1e-9)
    assert_parity(folder, "qwen3", torch.float32, np.float32, 1e-4)
    assert model.config.layers[0].qk_norm and model.config.layers[0].head_dim == CASES[case].get("head_dim", 6)


def test_qwen3_greedy_generation_cached_equals_uncached_and_transformers(tmp_path):
    folder = make_family_model(tmp_path, "qwen3", CASES["untied-windows-bias"])
    assert_greedy_generation_matches(folder)


@pytest.mark.parametrize("case", ["untied-windows-bias", "yarn-past-context"])
def test_qwen3_import_export_round_trip_and_transformers_runs_the_export(tmp_path, case):
    from safetensors.numpy import load_file

    folder = make_family_model(tmp_path, "qwen3", CASES[case])
    model = hf.load_pretrained(folder, dtype=np.float64)[0]
    out = hf.export_hf(model, tmp_path / "out")                   # q/k norms: qwen3 by default
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3"
    a, b = load_file(folder / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(b) <= set(a) and set(a) - set(b) <= {"lm_head.weight"}       # a tied head is not written
    assert all(np.array_equal(a[k], b[k].astype(a[k].dtype)) for k in b)
    assert hf.load_pretrained(out, dtype=np.float64)[0].config == model.config
    idx = np.random.default_rng(1).integers(0, VOCAB, (2, 24))
    with torch.no_grad():
        ref = transformers_model(out, torch.float64)(torch.from_numpy(idx)).logits.numpy()
    assert rel_err(model(idx), ref) < 1e-9


def test_qwen3_generation_benchmark_part_measures_both_libraries_at_batch_1_and_8(tmp_path):
    from numformer.bench import qwen3_generate

    result = qwen3_generate.run(quick=True, log=None)
    assert [(k, r["batch"]) for k, r in result["rows"].items()] == [("1", 1), ("8", 8)]
    for row in result["rows"].values():
        assert row["same_tokens_fraction"] == 1.0 and row["transformers_tokens_per_s"] > 0 and row["ratio"] > 0
        assert row["ratio"] == max(row["numformer_tokens_per_s"].values()) / row["transformers_tokens_per_s"]
    m = result["model"]                                              # an own head size, as Qwen3-0.6B's
    assert m["head_dim"] * m["n_heads"] != m["d_model"] and m["sliding_layers"] == 0
    text = qwen3_generate.markdown(result, tmp_path)
    assert "| batch | numformer one_thread |" in text and "| 8 |" in text
