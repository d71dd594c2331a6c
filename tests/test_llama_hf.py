"""Hugging Face LlamaForCausalLM in and out (numformer.interop.hf, family "llama").

Every model is a random-weight transformers Llama (LlamaConfig with fewer key/value heads than query heads,
rope_theta set, tied and untied embeddings) saved with save_pretrained into a temporary folder; nothing is
downloaded. transformers computes its rotary angles and RMS statistics in float32 whatever the model's dtype,
so the float64 comparisons give it float64 arithmetic there (``_float64_arithmetic``); the float32 ones compare
against transformers as it is.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from numformer.interop import hf
from numformer.models import GPT

from test_interop_hf import (TEXT, left_pad, loss_and_grads_numformer, loss_and_grads_torch, rel_err, save_tokenizer,
                             transformers_greedy)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, N_POS, EOS = 300, 48, 0
SHAPES = {
    "gqa_untied": dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=24, tie_word_embeddings=False, rope_theta=500.0),
    "mqa_tied": dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=1,
                     intermediate_size=40, tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5),
    "mha_bias": dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                     intermediate_size=20, tie_word_embeddings=False, rope_theta=1e6, attention_bias=True,
                     mlp_bias=True),
}


def llama_config(**kw):
    return transformers.LlamaConfig(**{"vocab_size": VOCAB, "max_position_embeddings": N_POS, "bos_token_id": EOS,
                                       "eos_token_id": EOS, "pad_token_id": None, **kw})


def _float64_arithmetic(model):
    """transformers computes RoPE's cos/sin in float32, and its RMSNorms their statistics (Gemma's ``1 + w`` too),
    whatever the model's dtype, and its eager attention (Gemma 2's, for soft-capping) the softmax: give all of
    them float64 arithmetic (the same formulas; the frequencies from transformers' own RoPE functions run in
    float64, ``test_rope_scaling.transformers_in_float64``), so float64 models compare at float64 precision."""
    from test_rope_scaling import transformers_in_float64

    for m in model.modules():
        kind = type(m).__name__
        if kind.endswith("RMSNorm"):
            eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
            plus_one = kind.startswith("Gemma")
            m.forward = (lambda m, eps, one: lambda h: (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))
                         * (one + m.weight))(m, eps, 1.0 if plus_one else 0.0)
    rot = model.model.rotary_emb
    cfg = model.config
    types = sorted(set(cfg.layer_types)) if isinstance(cfg.rope_parameters.get("full_attention"), dict) else [None]
    tables = {}
    for layer_type in types:
        params = cfg.rope_parameters if layer_type is None else cfg.rope_parameters[layer_type]
        kw = {} if layer_type is None else {"layer_type": layer_type}
        assert params["rope_type"] != "dynamic", "dynamic RoPE changes with the length: compare it elsewhere"
        with transformers_in_float64():
            if params["rope_type"] == "default":
                tables[layer_type] = type(rot).compute_default_rope_parameters(cfg, **kw)
            else:
                from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
                tables[layer_type] = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, None, **kw)

    def forward(x, position_ids, layer_type=None):
        inv_freq, factor = tables[layer_type]
        freqs = position_ids[..., None].double() * inv_freq.double()
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * factor).to(x.dtype), (emb.sin() * factor).to(x.dtype)

    rot.forward = forward
    if cfg._attn_implementation == "eager":          # its softmax names torch.float32: float64 while it runs
        run = model.forward

        def forward64(*args, **kwargs):
            with transformers_in_float64():
                return run(*args, **kwargs)
        model.forward = forward64
    return model


def make_llama(tmp_path, name="llama", torch_dtype=torch.float32, seed=0, **kw):
    """A random Llama saved into tmp_path/name; returns (folder, torch model in eval mode)."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(llama_config(**kw)).to(torch_dtype).eval()
    with torch.no_grad():                        # norm weights and biases away from 1 and 0: every tensor matters
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path / name
    model.save_pretrained(folder)
    if torch_dtype == torch.float64:
        _float64_arithmetic(model)
    return folder, model


def _grad_table(model):
    """{Hugging Face name: numformer gradient (the matching rows of a stacked qkv_proj)}."""
    fam = hf.FAMILIES["llama"]
    cfg = model.config
    grads = {n: p.grad for n, p in model.named_parameters()}
    return hf.to_hf_state(fam, cfg, {row.nf: grads[row.nf] for row in fam.tensors(cfg)})


# -- import: parity with transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("tdtype,ndtype,tol", [(torch.float64, np.float64, 1e-9), (torch.float32, np.float32, 1e-4)])
def test_llama_logits_and_every_gradient_match_transformers(tmp_path, shape, tdtype, ndtype, tol):
    folder, tmodel = make_llama(tmp_path, torch_dtype=tdtype, **SHAPES[shape])
    model = hf.load_pretrained(folder, dtype=ndtype)[0].train()
    rng = np.random.default_rng(1)
    idx, targets = rng.integers(0, VOCAB, (3, 11)), rng.integers(0, VOCAB, (3, 11))
    t_logits, t_loss, t_grads = loss_and_grads_torch(tmodel, idx, targets)
    logits, loss, _ = loss_and_grads_numformer(model, idx, targets)
    assert rel_err(logits, t_logits) < tol
    assert abs(loss - t_loss) < tol
    grads = _grad_table(model)
    assert set(grads) == set(t_grads), "every transformers parameter has a numformer counterpart"
    for name, g in t_grads.items():
        assert rel_err(grads[name], g) < tol, name


def test_llama_config_is_mapped(tmp_path):
    folder, tmodel = make_llama(tmp_path, **SHAPES["gqa_untied"])
    model = hf.load_pretrained(folder)[0]
    cfg = model.config.to_dict()
    assert (cfg["positional"], cfg["activation"], cfg["norm"], cfg["bias"]) == ("rope", "swiglu", "rms", False)
    assert (cfg["n_heads"], cfg["n_kv_heads"], cfg["rope_theta"], cfg["d_ff"]) == (4, 2, 500.0, 24)
    assert model.blocks[0].self_attn.qkv_proj.weight.shape == (16 + 2 * 2 * 4, 16)
    assert model.num_parameters() == sum(p.numel() for p in tmodel.parameters())
    tied = hf.load_pretrained(make_llama(tmp_path, "tied", **SHAPES["mqa_tied"])[0])[0]
    assert tied.lm_head.weight is tied.tok_emb.weight


def test_llama_greedy_generation_equals_transformers_generate(tmp_path):
    folder, tmodel = make_llama(tmp_path, **SHAPES["gqa_untied"])
    model = hf.load_pretrained(folder)[0]
    prompt = np.array([[5, 17, 3, 44, 9]])
    np.testing.assert_array_equal(model.generate(prompt, 20, greedy=True), transformers_greedy(tmodel, prompt, 20))


def test_llama_cached_and_uncached_decoding_are_equal(tmp_path):
    folder, _ = make_llama(tmp_path, torch_dtype=torch.float64, **SHAPES["mqa_tied"])
    model = hf.load_pretrained(folder, dtype=np.float64)[0]
    prompt = np.array([[5, 17, 3], [8, 2, 1]])
    a, la = model.generate(prompt, 30, rng=3, return_logits=True)
    b, lb = model.generate(prompt, 30, rng=3, use_cache=False, return_logits=True)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(la, lb, rtol=0, atol=1e-10)
    caches = model.new_kv_caches()
    model(prompt, kv_caches=caches)
    assert caches[0].k.shape[1] == 1                  # multi-query: the cache holds one key/value head


def test_llama_left_padded_batch_matches_transformers(tmp_path):
    """RoPE with per-row positions (a left-padded batch), against transformers' generate."""
    folder, tmodel = make_llama(tmp_path, **SHAPES["gqa_untied"])
    model = hf.load_pretrained(folder)[0]
    ids, mask = left_pad([[5, 17, 3, 44, 9, 12, 7], [8, 2], [30, 31, 32, 33]])
    batch = model.generate(ids, 10, greedy=True, attention_mask=mask)
    with torch.no_grad():
        ref = tmodel.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=10,
                              do_sample=False, pad_token_id=EOS, eos_token_id=None).numpy()
    np.testing.assert_array_equal(batch, ref)


def test_llama_tokenizer_is_loaded(tmp_path):
    folder, _ = make_llama(tmp_path, **SHAPES["gqa_untied"])
    save_tokenizer(folder)
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    _, tok = hf.load_pretrained(folder)
    text = "However little known, the feelings of such a man!"
    assert tok.encode(text) == reference(text)["input_ids"] and tok.decode(tok.encode(text)) == text
    assert max(tok.encode(TEXT)) < VOCAB


# -- export -----------------------------------------------------------------------------------------------------
def test_llama_import_then_export_gives_identical_tensors_and_config(tmp_path):
    from safetensors.numpy import load_file

    folder, _ = make_llama(tmp_path, **SHAPES["gqa_untied"])
    model = hf.load_pretrained(folder)[0]
    out = hf.export_hf(model, tmp_path / "out")
    a, b = load_file(folder / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_key_value_heads"], cfg["rope_parameters"]["rope_theta"]) == ("llama", 2, 500.0)


def _export_and_compare(model, tmp_path):
    """Perturb a float64 ``model``'s weights, export it, and check transformers' float64 logits (within 1e-9)
    and a reload (within 1e-12); returns (the folder, transformers' model)."""
    for p in model.parameters():
        p.data += np.random.default_rng(2).standard_normal(p.shape) * 0.05
    out = hf.export_hf(model, tmp_path / "out")
    tmodel = _float64_arithmetic(transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64).eval())
    idx = np.random.default_rng(1).integers(0, VOCAB, (2, 24))
    with torch.no_grad():
        ref = tmodel(torch.from_numpy(idx)).logits.numpy()
    assert rel_err(model.eval()(idx), ref) < 1e-9
    again = hf.load_pretrained(out, dtype=np.float64)[0]
    assert rel_err(again(idx), model(idx)) < 1e-12
    return out, tmodel


@pytest.mark.parametrize("options", [
    dict(n_kv_heads=2, tie_weights=False, rope_theta=1000.0),
    dict(n_kv_heads=1, tie_weights=True, d_ff=20),
    dict(bias=True, tie_weights=False)])
def test_numformer_llama_exports_and_transformers_gives_the_same_logits(tmp_path, options):
    model = GPT(VOCAB, 24, n_layers=2, n_heads=4, d_model=16, positional="rope", activation="swiglu", norm="rms",
                rng=np.random.default_rng(0), dtype=np.float64, **{"bias": False, **options})
    _export_and_compare(model, tmp_path)


@pytest.mark.parametrize("options", [
    dict(activation="relu2", n_kv_heads=2, tie_weights=True),
    dict(activation="gelu_tanh", bias=True, tie_weights=False, d_ff=20)])
def test_a_rope_model_without_a_gated_feed_forward_exports_as_arcee_with_the_same_logits(tmp_path, options):
    model = GPT(VOCAB, 24, n_layers=2, n_heads=4, d_model=16, positional="rope", norm="rms",
                rng=np.random.default_rng(0), dtype=np.float64, **{"bias": False, **options})
    out, tmodel = _export_and_compare(model, tmp_path)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["model_type"], cfg["architectures"]) == ("arcee", ["ArceeForCausalLM"])
    assert type(tmodel).__name__ == "ArceeForCausalLM"


def test_arcee_refuses_a_gated_feed_forward(tmp_path):
    model = GPT(VOCAB, 16, n_layers=1, n_heads=2, d_model=8, positional="rope", activation="swiglu", norm="rms")
    with pytest.raises(ValueError, match="Arcee cannot express activation = 'swiglu'"):
        hf.export_hf(model, tmp_path / "out", model_type="arcee")
    assert not (tmp_path / "out").exists()


def test_export_refuses_what_llama_cannot_express(tmp_path):
    model = GPT(VOCAB, 16, n_layers=1, n_heads=2, d_model=8, positional="rope", activation="gelu", norm="rms")
    with pytest.raises(ValueError, match="Llama cannot express activation = 'gelu'"):
        hf.export_hf(model, tmp_path / "out", model_type="llama")
    assert not (tmp_path / "out").exists()


# -- config fields (honoured or refused, field by field): tests/test_hf_fields.py; sliding window: test_sliding_window.py


def test_llama_generation_benchmark_part_measures_speed_and_the_cache(tmp_path):
    from numformer.bench import llama_generate

    result = llama_generate.run(quick=True, log=None)
    m = result["model"]
    d_head = m["d_model"] // m["n_heads"]
    for kv, nbytes in result["kv_cache_bytes"].items():          # the arrays hold exactly K and V of each head
        assert nbytes == 2 * m["n_layers"] * int(kv) * d_head * result["cache_positions"] * 4
    assert set(result["kv_cache_bytes"]) == {"1", str(m["n_kv_heads"]), str(m["n_heads"])}
    assert result["row"]["same_tokens_fraction"] == 1.0 and result["row"]["transformers_tokens_per_s"] > 0
    text = llama_generate.markdown(result, tmp_path)
    assert "| key/value heads | bytes | of multi-head |" in text and "| 1 |" in text


# -- Llama 3.x: rope_type llama3 ---------------------------------------------------------------------------------
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8, "rope_theta": 500000.0}


@pytest.mark.parametrize("form", ["v5", "v4"])
def test_llama3_scaled_rope_imports_generates_and_exports_as_transformers_runs_it(tmp_path, form):
    """A Llama 3.x config (rope_type llama3, both config forms) at positions past its original context (8):
    float64 logits and every gradient within 1e-9 of transformers, float32 within 1e-4; greedy generation
    with the cache = without = transformers' generate; the export runs in transformers with the same logits."""
    from test_hf_fields import assert_parity, make_family_model, transformers_model

    rope = {"rope_parameters": LLAMA3_ROPE} if form == "v5" else \
        {"rope_parameters": "<delete>", "rope_theta": 500000.0,
         "rope_scaling": {"type": "llama3", **{k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}}}
    folder = make_family_model(tmp_path, "llama", {"tie_word_embeddings": True, **rope})
    model = assert_parity(folder, "llama", torch.float64, np.float64, 1e-9)
    assert_parity(folder, "llama", torch.float32, np.float32, 1e-4)
    scaling = model.config.layers[0].rope_scaling
    assert (scaling.rope_type, scaling.factor, scaling.original_max_position_embeddings) == ("llama3", 8.0, 8)
    model.eval()
    prompt = np.array([[5, 17, 3, 44, 9]])
    tmodel = transformers_model(folder, torch.float64)
    greedy = model.generate(prompt, 25, greedy=True)
    np.testing.assert_array_equal(greedy, transformers_greedy(tmodel, prompt, 25))
    np.testing.assert_array_equal(greedy, model.generate(prompt, 25, greedy=True, use_cache=False))
    out = hf.export_hf(model, tmp_path / "out")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_parameters"] == LLAMA3_ROPE
    idx = np.random.default_rng(1).integers(0, VOCAB, (2, 30))
    with torch.no_grad():
        ref = transformers_model(out, torch.float64)(torch.from_numpy(idx)).logits.numpy()
    assert rel_err(model(idx), ref) < 1e-9


def test_a_prompt_gets_the_special_tokens_transformers_tokenizer_adds(tmp_path, capsys):
    """A tokenizer whose post-processor puts <bos> before every text (Llama 3's, Gemma's): `numformer generate`
    and the explorer continue the prompt transformers' tokenizer(prompt) gives, <bos> included, so the greedy
    continuation is transformers' generate's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from numformer.cli import main
    from numformer.explorer import prompt_ids

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>", "<bos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok.save(str(tmp_path / "tokenizer.json"))
    torch.manual_seed(0)
    tmodel = transformers.LlamaForCausalLM(llama_config(vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                                        num_attention_heads=4, intermediate_size=64,
                                                        initializer_range=0.2, bos_token_id=1,
                                                        eos_token_id=0)).eval()
    tmodel.save_pretrained(tmp_path)
    reference = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"),
                                                     bos_token="<bos>", eos_token="<eos>")
    prompt = "It is a truth"
    ids = reference(prompt, return_tensors="pt").input_ids
    assert ids[0, 0] == 1
    with torch.no_grad():
        out = tmodel.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0,
                              attention_mask=torch.ones_like(ids))
    assert main(["generate", str(tmp_path), "--prompt", prompt, "--max-new-tokens", "8", "--greedy"]) == 0
    assert capsys.readouterr().out == prompt + reference.decode(out[0, ids.shape[1]:]) + "\n"
    model, numformer_tok = hf.load_pretrained(tmp_path)
    assert prompt_ids(model, numformer_tok, prompt)[0].tolist() == ids[0].tolist()
    assert numformer_tok.encode(prompt) == ids[0, 1:].tolist()      # text to train on: no special tokens
