"""Hugging Face Gemma 2 (``Gemma2ForCausalLM``) and Gemma 3 text (``Gemma3ForCausalLM``, model_type
"gemma3_text") in and out (numformer.interop.hf, gemma2.py and gemma3.py): √d embeddings, 1 + w RMSNorms, four
norms per block, tanh GeGLU, query_pre_attn_scalar, soft-caps (Gemma 2), q/k norms and a RoPE per layer type
(Gemma 3), windows shorter than the sequence. Random-weight models written by transformers; nothing is
downloaded. Field-by-field checks are in test_hf_fields.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from numformer.interop import hf

from test_hf_fields import (VOCAB, assert_greedy_generation_matches, assert_parity, base_config_json, fine_tune_from,
                            make_family_model, transformers_model)
from test_interop_hf import rel_err

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0,
          "original_max_position_embeddings": 8, "rope_theta": 1e4}
CASES = {   # (family, config.json edits): windows of 5 and 2 on 24 tokens, head_dim 6 with hidden 16 / 4 heads
    "gemma2-default-caps": ("gemma2", {"final_logit_softcapping": "<delete>", "attn_logit_softcapping": "<delete>"}),
    "gemma2-small-caps-untied": ("gemma2", {"tie_word_embeddings": False, "num_key_value_heads": 1}),
    "gemma3-v5-nested-rope": ("gemma3_text", {}),
    "gemma3-v4-llama3-pattern": ("gemma3_text", {"rope_parameters": "<delete>", "layer_types": "<delete>",
                                                 "sliding_window_pattern": 2, "rope_theta": 5e4,
                                                 "rope_local_base_freq": 100.0, "sliding_window": 2,
                                                 "rope_scaling": {k: v for k, v in LLAMA3.items()
                                                                  if k != "rope_theta"},
                                                 "final_logit_softcapping": 2.0}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gemma_logits_and_every_gradient_match_transformers(tmp_path, case):
    fam, edits = CASES[case]
    folder = make_family_model(tmp_path, fam, edits)
    model = assert_parity(folder, fam, torch.float64, np.float64, 1e-9)
    assert_parity(folder, fam, torch.float32, np.float32, 1e-4)
    cfg = model.config
    assert (cfg.norm, cfg.scale_embeddings, cfg.layers[0].norm_placement, cfg.layers[0].activation) == \
        ("rms_plus_one", True, "sandwich", "geglu")
    assert cfg.layers[0].qk_norm == (fam == "gemma3_text")
    assert cfg.layers[0].attn_scale == pytest.approx(10 ** -0.5)
    tmodel = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert model.num_parameters() == sum(p.numel() for p in tmodel.parameters())
    if case == "gemma2-default-caps":
        assert (cfg.final_logit_softcap, cfg.layers[0].attn_logit_softcap) == (30.0, 50.0)
    if case == "gemma3-v4-llama3-pattern":        # sliding unless i + 1 is a multiple of 2; llama3 on full layers
        assert [(b.sliding_window, b.rope_theta, b.rope_scaling and b.rope_scaling.rope_type)
                for b in cfg.layers] == [(2, 100.0, None), (None, 5e4, "llama3"), (2, 100.0, None)]


@pytest.mark.parametrize("case", ["gemma2-small-caps-untied", "gemma3-v4-llama3-pattern"])
def test_gemma_greedy_generation_cached_equals_uncached_and_transformers(tmp_path, case):
    fam, edits = CASES[case]
    folder = make_family_model(tmp_path, fam, edits)
    assert_greedy_generation_matches(folder)


@pytest.mark.parametrize("case", ["gemma2-default-caps", "gemma3-v4-llama3-pattern"])
def test_gemma_import_export_round_trip_and_transformers_runs_the_export(tmp_path, case):
    from safetensors.numpy import load_file

    fam, edits = CASES[case]
    folder = make_family_model(tmp_path, fam, edits)
    model = hf.load_pretrained(folder, dtype=np.float64)[0]
    out = hf.export_hf(model, tmp_path / "out")                      # the default family, from the norms
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == fam
    a, b = load_file(folder / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(b) <= set(a) and set(a) - set(b) <= {"lm_head.weight"}       # a tied head is not written
    assert all(np.array_equal(a[k], b[k].astype(a[k].dtype)) for k in b)
    assert hf.load_pretrained(out, dtype=np.float64)[0].config == model.config
    idx = np.random.default_rng(1).integers(0, VOCAB, (2, 24))
    with torch.no_grad():
        ref = transformers_model(out, torch.float64)(torch.from_numpy(idx)).logits.numpy()
    assert rel_err(model(idx), ref) < 1e-9


def test_gemma_exports_refuse_what_the_family_cannot_express(tmp_path):
    from numformer.models import GPT

    gemma = dict(vocab_size=VOCAB, block_size=24, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=6, d_model=16,
                 positional="rope", activation="geglu", norm="rms_plus_one", norm_placement="sandwich", bias=False,
                 scale_embeddings=True, qk_norm=True)
    model = GPT(**gemma, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="Gemma2 cannot express q/k norms"):
        hf.export_hf(model, tmp_path / "g2", model_type="gemma2")
    with pytest.raises(ValueError, match="Llama cannot express post-norm or sandwich blocks"):
        hf.export_hf(model, tmp_path / "llama", model_type="llama")
    with pytest.raises(ValueError, match="Gemma3 cannot express attention soft-capping"):
        hf.export_hf(GPT(**gemma, attn_logit_softcap=5.0, rng=np.random.default_rng(0)), tmp_path / "g3")
    with pytest.raises(ValueError, match="Gemma3 cannot express activation = 'swiglu'"):
        hf.export_hf(GPT(**{**gemma, "activation": "swiglu"}, rng=np.random.default_rng(0)), tmp_path / "g3")


@pytest.mark.parametrize("fam,qk_norm", [("gemma3_text", True), ("gemma2", False)])
def test_gemma_export_without_sliding_layers_runs_in_transformers_with_the_same_logits(tmp_path, fam, qk_norm):
    """No layer slides: the export writes a positive window (block_size) with every layer full attention, as
    transformers' forward builds the sliding mask from the window whatever the layers (a null one fails)."""
    from numformer.models import GPT

    model = GPT(VOCAB, 24, n_layers=2, n_heads=4, d_model=16, positional="rope", activation="geglu",
                norm="rms_plus_one", bias=False, qk_norm=qk_norm, norm_placement="sandwich", scale_embeddings=True,
                attn_logit_softcap=None, rng=np.random.default_rng(0), dtype=np.float64)
    out = hf.export_hf(model, tmp_path / "out", model_type=fam)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["model_type"], cfg["sliding_window"], cfg["layer_types"]) == (fam, 24, ["full_attention"] * 2)
    again = hf.load_pretrained(out, dtype=np.float64)[0]
    assert [b.sliding_window for b in again.config.layers] == [None, None]
    idx = np.random.default_rng(1).integers(0, VOCAB, (2, 24))
    with torch.no_grad():
        ref = transformers_model(out, torch.float64)(torch.from_numpy(idx)).logits.numpy()
    assert rel_err(model.eval()(idx), ref) < 1e-9 and rel_err(again(idx), ref) < 1e-9


@pytest.mark.parametrize("fam", ["gemma3_text", "gemma2"])
def test_gemma_null_window_is_refused_as_transformers_cannot_run_it_even_with_full_layers(tmp_path, fam):
    folder = tmp_path / "m"
    folder.mkdir()
    cfg = {**base_config_json(fam), "model_type": fam, "sliding_window": None, "layer_types": ["full_attention"] * 3}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"{fam} config.json field sliding_window = None: transformers' Gemma "
                                         r"forward builds the sliding-window mask .*set it to a positive integer"):
        hf.hf_model_config(folder, cfg)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(folder))
    with pytest.raises(ValueError, match="Could not find a `sliding_window` argument"):   # what transformers does
        model(torch.zeros((1, 6), dtype=torch.long))


def test_gemma3_sliding_layers_kv_cache_is_bounded_by_the_window():
    """Decoding step by step, a sliding layer's cache keeps at most its window's keys and values (its bytes
    stop growing), a full-attention layer's grows with the sequence."""
    from numformer.interop.hf.gemma3 import to_config
    from numformer.models import GPT

    cfg = to_config({"model_type": "gemma3_text", **base_config_json("gemma3_text"), "max_position_embeddings": 512})
    model = GPT(cfg, rng=np.random.default_rng(0), dtype=np.float64).eval()
    caches = model.new_kv_caches()
    ids = np.random.default_rng(1).integers(0, VOCAB, (1, 300))
    nbytes = {}
    for t in range(300):
        model(ids[:, t:t + 1], kv_caches=caches)
        if t + 1 in (32, 128, 300):
            nbytes[t + 1] = [c.k.nbytes + c.v.nbytes for c in caches]
    sliding = [i for i, b in enumerate(cfg.layers) if b.sliding_window is not None]
    full = [i for i, b in enumerate(cfg.layers) if b.sliding_window is None]
    assert sliding and full
    per_position = 2 * cfg.layers[0].n_kv_heads * cfg.layers[0].head_dim * 8            # k and v, float64
    for i in sliding:
        assert nbytes[32][i] == nbytes[128][i] == nbytes[300][i] <= 2 * (cfg.layers[i].sliding_window + 1) * \
            per_position
    for i in full:
        assert nbytes[32][i] < nbytes[128][i] < nbytes[300][i]
        assert nbytes[300][i] >= 300 * per_position


def test_gemma3_fine_tunes_with_init_from_and_exports(tmp_path):
    from numformer.train import load_model

    from test_interop_hf import save_tokenizer

    folder = make_family_model(tmp_path, "gemma3_text", {})
    save_tokenizer(folder)
    fine_tune_from(tmp_path, folder)
    tuned = load_model(tmp_path / "run")
    original = hf.load_pretrained(folder)[0]
    assert tuned.config.layers == original.config.layers and tuned.config.norm == "rms_plus_one"
    assert not np.array_equal(tuned.tok_emb.weight.data, original.tok_emb.weight.data)      # it trained
    out = hf.export_hf(tuned, tmp_path / "tuned_hf")
    assert json.loads((out / "config.json").read_text())["model_type"] == "gemma3_text"
    idx = np.random.default_rng(1).integers(0, VOCAB, (1, 16))
    with torch.no_grad():
        ref = transformers.AutoModelForCausalLM.from_pretrained(out).eval()(torch.from_numpy(idx)).logits.numpy()
    assert rel_err(tuned.eval()(idx), ref) < 1e-4


def test_gemma3_generation_benchmark_part_measures_speed_and_the_sliding_layers_cache(tmp_path):
    """The quick part: one sliding layer (window 8) and one full layer, a prompt of 3 windows then 8 tokens."""
    from numformer.bench import gemma3_generate

    result = gemma3_generate.run(quick=True, log=None)
    assert [r["batch"] for r in result["rows"].values()] == [1, 8]
    assert all(r["same_tokens_fraction"] == 1.0 and r["ratio"] > 0 for r in result["rows"].values())
    kv, m = result["kv_cache"], result["model"]
    p, w = kv["bytes_per_position"], kv["window"]
    assert (m["sliding_layers"], m["n_layers"], w) == (1, 2, 8) and kv["same_tokens_fraction"] == 1.0
    assert p == 2 * m["n_kv_heads"] * m["head_dim"] * 4                              # keys and values, float32
    positions = kv["prompt_tokens"] + kv["new_tokens"] - 1                           # the last token is not fed
    assert kv["end"]["positions"] == positions and kv["prompt_tokens"] == 3 * w
    assert kv["after_prompt"]["sliding"]["held"] == 3 * w * p                       # the prompt's queries need all
    assert kv["sliding_array_max_while_decoding"] <= 2 * (w + 1) * p                # bounded by the window
    assert w * p <= kv["sliding_held_max_while_decoding"] <= 2 * (w + 1) * p
    assert kv["end"]["full"]["held"] == positions * p == kv["transformers"]["full"]["held"]   # every position
    assert kv["transformers"]["sliding"]["held"] == (w - 1) * p
    text = gemma3_generate.markdown(result, tmp_path)
    assert "| numformer sliding (×1) |" in text and "| transformers full (×1) |" in text
