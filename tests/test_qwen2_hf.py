"""Hugging Face Qwen2ForCausalLM (Qwen2 / Qwen2.5) in and out (numformer.interop.hf, family "qwen2"): a Llama with
q/k/v biases (no output or feed-forward biases), rope_theta 1e6, tied or untied embeddings. Random-weight models
written by transformers; nothing is downloaded. Field-by-field checks are in test_hf_fields.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from numformer.interop import hf
from numformer.models import GPT

from test_hf_fields import assert_parity, fine_tune_from, make_family_model
from test_interop_hf import rel_err, save_tokenizer, transformers_greedy
from test_llama_hf import _float64_arithmetic

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SHAPES = {"tied": {"tie_word_embeddings": True}, "untied": {"tie_word_embeddings": False, "num_key_value_heads": 1}}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("tdtype,ndtype,tol", [(torch.float64, np.float64, 1e-9), (torch.float32, np.float32, 1e-4)])
def test_qwen2_logits_and_every_gradient_match_transformers(tmp_path, shape, tdtype, ndtype, tol):
    folder = make_family_model(tmp_path, "qwen2", SHAPES[shape])
    model = assert_parity(folder, "qwen2", tdtype, ndtype, tol)
    cfg = model.config.to_dict()
    assert (cfg["bias"], cfg.get("attn_bias", False), cfg["qkv_bias"], cfg["rope_theta"]) == (False, False, True, 1e6)
    assert model.tie_weights == SHAPES[shape]["tie_word_embeddings"]
    tmodel = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert model.num_parameters() == sum(p.numel() for p in tmodel.parameters())


def test_qwen2_generation_equals_transformers_and_cached_equals_uncached(tmp_path):
    folder = make_family_model(tmp_path, "qwen2", SHAPES["untied"])
    tmodel = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    model = hf.load_pretrained(folder)[0]
    prompt = np.array([[5, 17, 3, 44, 9]])
    np.testing.assert_array_equal(model.generate(prompt, 20, greedy=True), transformers_greedy(tmodel, prompt, 20))
    m64 = hf.load_pretrained(folder, dtype=np.float64)[0]
    a, la = m64.generate(prompt, 20, rng=1, return_logits=True)
    b, lb = m64.generate(prompt, 20, rng=1, use_cache=False, return_logits=True)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(la, lb, rtol=0, atol=1e-10)


@pytest.mark.parametrize("window", [None, 6])
def test_qwen2_import_export_round_trip(tmp_path, window):
    from safetensors.numpy import load_file

    edits = {"use_sliding_window": True, "sliding_window": window, "max_window_layers": 0} if window else {}
    folder = make_family_model(tmp_path, "qwen2", {**SHAPES["tied"], **edits})
    model = hf.load_pretrained(folder, dtype=np.float64)[0]
    assert model.sliding_window == window
    out = hf.export_hf(model, tmp_path / "out")
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["model_type"], cfg["architectures"], cfg["sliding_window"]) == ("qwen2", ["Qwen2ForCausalLM"], window)
    a, b = load_file(folder / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(a) - {"lm_head.weight"} == set(b)
    assert all(np.array_equal(a[k], b[k].astype(a[k].dtype)) for k in b)
    tmodel = _float64_arithmetic(transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64).eval())
    idx = np.random.default_rng(1).integers(0, 300, (2, 20))
    with torch.no_grad():
        ref = tmodel(torch.from_numpy(idx)).logits.numpy()
    assert rel_err(model(idx), ref) < 1e-9


def test_numformer_model_with_qkv_biases_exports_as_qwen2(tmp_path):
    model = GPT(300, 24, n_layers=2, n_heads=4, d_model=16, positional="rope", activation="swiglu", norm="rms",
                bias=False, qkv_bias=True, rope_theta=1e6, tie_weights=False, rng=np.random.default_rng(0),
                dtype=np.float64)
    for p in model.parameters():
        p.data += np.random.default_rng(2).standard_normal(p.shape) * 0.05
    out = hf.export_hf(model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"
    tmodel = _float64_arithmetic(transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64).eval())
    idx = np.random.default_rng(1).integers(0, 300, (2, 24))
    with torch.no_grad():
        ref = tmodel(torch.from_numpy(idx)).logits.numpy()
    assert rel_err(model.eval()(idx), ref) < 1e-9
    with pytest.raises(ValueError, match="Llama cannot express q/k/v biases without an output projection bias"):
        hf.export_hf(model, tmp_path / "as_llama", model_type="llama")


def test_qwen2_fine_tunes_with_init_from(tmp_path):
    folder = make_family_model(tmp_path, "qwen2", SHAPES["tied"])
    save_tokenizer(folder)
    fine_tune_from(tmp_path, folder)
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())["model"]
    assert (cfg["qkv_bias"], cfg["bias"], cfg["rope_theta"]) == (True, False, 1e6)
    tuned = hf.load_pretrained(hf.export_hf(__import__("numformer.train", fromlist=["load_model"]).load_model(
        tmp_path / "run"), tmp_path / "tuned_hf"))[0]
    assert tuned.blocks[0].self_attn.qkv_proj.bias is not None


def test_qwen2_generation_benchmark_part_measures_both_libraries(tmp_path):
    from numformer.bench import qwen2_generate

    result = qwen2_generate.run(quick=True, log=None)
    (row,) = result["rows"].values()
    assert row["same_tokens_fraction"] == 1.0 and row["transformers_tokens_per_s"] > 0 and row["ratio"] > 0
    assert "| batch | numformer one_thread |" in qwen2_generate.markdown(result, tmp_path)


@pytest.mark.parametrize("layer_types", [["full_attention", "sliding_attention"],
                                         ["sliding_attention", "full_attention"]])
def test_layers_with_their_own_windows_import_and_export_as_transformers_runs_them(tmp_path, layer_types):
    """Qwen2's layer_types: one window per layer (a GPTConfig whose layers differ), both ways, float64 logits
    within 1e-9 of transformers (windows shorter than the sequence)."""
    edits = {"use_sliding_window": True, "sliding_window": 5, "layer_types": layer_types}
    folder = make_family_model(tmp_path, "qwen2", {**SHAPES["tied"], **edits})
    model = hf.load_pretrained(folder, dtype=np.float64)[0]
    assert [b.sliding_window for b in model.config.layers] == [5 if t == "sliding_attention" else None
                                                              for t in layer_types]
    out = hf.export_hf(model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["layer_types"] == layer_types
    idx = np.random.default_rng(2).integers(0, 300, (2, 16))
    for path in (folder, out):
        tmodel = _float64_arithmetic(transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
                                     .eval())
        with torch.no_grad():
            assert rel_err(model(idx), tmodel(torch.from_numpy(idx)).logits.numpy()) < 1e-9
