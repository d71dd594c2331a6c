"""Models: finite-difference gradient checks of every parameter, and their options."""
from __future__ import annotations

import numpy as np
import pytest

from numformer import EncoderClassifier, GPT, Transformer, build_model
from numformer.models import format_parameter_report, parameter_counts

from conftest import assert_gradcheck, module_gradcheck

F64 = np.float64


def small_gpt(**kw):
    args = dict(vocab_size=11, block_size=8, n_layers=2, n_heads=2, d_model=8, dropout=0.0,
                rng=np.random.default_rng(0), dtype=F64)
    args.update(kw)
    return GPT(**args)


@pytest.mark.parametrize("options", [
    {},
    {"tie_weights": False},
    {"norm_first": False, "activation": "relu"},
    {"positional": "sinusoidal", "activation": "gelu_tanh"},
])
def test_gpt_gradients(options):
    m = small_gpt(**options)
    idx = np.random.default_rng(1).integers(0, 11, size=(2, 6))
    assert_gradcheck(module_gradcheck(m, {}, lambda: m(idx)))


def test_gpt_weight_tying():
    m = small_gpt()
    assert m.lm_head.weight is m.tok_emb.weight
    names = [n for n, _ in m.named_parameters()]
    assert "lm_head.weight" not in names and "tok_emb.weight" in names
    untied = small_gpt(tie_weights=False)
    assert untied.num_parameters() == m.num_parameters() + 11 * 8


def test_gpt_is_causal():
    m = small_gpt()
    idx = np.random.default_rng(1).integers(0, 11, size=(1, 6))
    a = m(idx)
    idx2 = idx.copy()
    idx2[0, 4:] = (idx2[0, 4:] + 1) % 11
    b = m(idx2)
    np.testing.assert_array_equal(a[0, :4], b[0, :4])
    assert not np.allclose(a[0, 4:], b[0, 4:])


@pytest.mark.parametrize("pooling", ["mean", "first"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_classifier_gradients(pooling, norm_first):
    m = EncoderClassifier(13, 3, max_len=10, d_model=8, n_heads=2, n_layers=2, dropout=0.0, pooling=pooling,
                          norm_first=norm_first, pad_id=0, rng=np.random.default_rng(0), dtype=F64)
    ids = np.array([[3, 4, 5, 6, 7], [8, 9, 2, 0, 0]])
    assert_gradcheck(module_gradcheck(m, {}, lambda: m(ids)))


def test_classifier_ignores_padding():
    m = EncoderClassifier(13, 3, max_len=10, d_model=8, n_heads=2, n_layers=2, dropout=0.0, pad_id=0,
                          rng=np.random.default_rng(0), dtype=F64)
    short = m(np.array([[3, 4, 5]]))
    padded = m(np.array([[3, 4, 5, 0, 0, 0]]))
    np.testing.assert_allclose(short, padded, atol=1e-12)


@pytest.mark.parametrize("options", [
    {},
    {"norm_first": True, "activation": "gelu"},
    {"share_embeddings": True, "tie_output": True, "positional": "learned"},
])
def test_transformer_gradients(options):
    m = Transformer(12, 12, d_model=8, n_heads=2, n_layers=2, d_ff=16, dropout=0.0, max_len=16, src_pad_id=0,
                    tgt_pad_id=0, rng=np.random.default_rng(0), dtype=F64, **options)
    src = np.array([[3, 4, 5, 6], [7, 8, 0, 0]])
    tgt = np.array([[1, 5, 6], [1, 9, 0]])
    assert_gradcheck(module_gradcheck(m, {}, lambda: m(src, tgt)))


def test_transformer_seed_api():
    m = Transformer(src_vocab_size=30, tgt_vocab_size=20, d_model=16, n_heads=4, n_layers=2, d_ff=32, dropout=0.1,
                    rng=np.random.default_rng(0))
    src = np.random.default_rng(0).integers(0, 30, size=(2, 7))
    tgt = np.random.default_rng(1).integers(0, 20, size=(2, 5))
    assert m(src, tgt).shape == (2, 5, 20)
    m.eval()
    memory = m.encode(src)
    assert memory.shape == (2, 7, 16)
    np.testing.assert_allclose(m.decode(tgt, memory), m(src, tgt), rtol=1e-6)


def test_transformer_cached_decoding_matches_full():
    m = Transformer(12, 12, d_model=8, n_heads=2, n_layers=2, d_ff=16, dropout=0.0, rng=np.random.default_rng(0),
                    dtype=F64).eval()
    src = np.array([[3, 4, 5, 6]])
    tgt = np.array([[1, 5, 6, 7, 2]])
    full = m(src, tgt)
    memory = m.encode(src)
    caches = m.new_caches()
    steps = [m.decode(tgt[:, t:t + 1], memory, caches=caches) for t in range(tgt.shape[1])]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=1e-10)


def test_gpt_cached_decoding_matches_full():
    m = small_gpt().eval()
    idx = np.random.default_rng(2).integers(0, 11, size=(2, 8))
    full = m(idx)
    caches = m.new_kv_caches()
    steps = [m(idx[:, :3], kv_caches=caches)] + [m(idx[:, t:t + 1], kv_caches=caches) for t in range(3, 8)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=1e-10)


def test_parameter_counts_of_the_worked_solutions():
    """Solution 6.4: d_model=512, 8 heads, d_ff=2048, attention without biases."""
    m = Transformer(100, 100, d_model=512, n_heads=8, n_layers=6, d_ff=2048, attn_bias=False,
                    rng=np.random.default_rng(0))
    c = parameter_counts(m)
    assert c["encoder.layers.0.self_attn"] == 1_048_576
    assert c["encoder.layers.0.ff"] == 2_099_712
    assert c["encoder.layers.0"] == 3_150_336
    assert 6 * c["encoder.layers.0"] == 18_902_016
    # The solution's decoder figure, 4,198,912 = 3,150,336 + 1,048,576, adds cross-attention to the
    # encoder layer but leaves out the decoder's third LayerNorm (2 x 512): the decoder layer has three
    # Add & Norm steps (its own Steps 2, 4 and 6), so the true count is 1,024 more.
    dec = "decoder.layers.0"
    assert c[dec] - c[f"{dec}.norm3"] == 4_198_912
    assert c[f"{dec}.norm3"] == 1_024
    assert c[dec] == 4_199_936
    report = format_parameter_report(m)
    assert "3,150,336" in report and "4,199,936" in report


def test_build_model_from_config_and_errors():
    m = build_model({"type": "gpt", "vocab_size": 11, "block_size": 8, "n_layers": 1, "d_model": 8, "n_heads": 2})
    assert isinstance(m, GPT)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['n_layer'\] for model type 'gpt'; valid keys: .*n_layers"):
        build_model({"type": "gpt", "vocab_size": 11, "block_size": 8, "n_layer": 2})
    with pytest.raises(ValueError, match="unknown model type 'bert'"):
        build_model({"type": "bert"})
    with pytest.raises(ValueError, match=r"needs \['block_size'\]"):
        build_model({"type": "gpt", "vocab_size": 11})
