"""Modules: finite-difference gradient checks (float64) of inputs and every parameter."""
from __future__ import annotations

import numpy as np
import pytest

from numformer import nn

from conftest import assert_gradcheck, module_gradcheck

F64 = np.float64


def rng0():
    return np.random.default_rng(0)


def test_linear_module(rng):
    m = nn.Linear(4, 3, rng=rng0(), dtype=F64)
    x = rng.standard_normal((2, 5, 4))
    assert_gradcheck(module_gradcheck(m, {"x": x}, lambda x: m(x), lambda g: {"x": g}))


def test_embedding_module_repeated_ids():
    m = nn.Embedding(6, 3, rng=rng0(), dtype=F64)
    ids = np.array([[0, 2, 2, 5], [5, 5, 1, 0]])
    assert_gradcheck(module_gradcheck(m, {}, lambda: m(ids)))


def test_embedding_padding_idx():
    """The padding row starts at zero and gets no lookup gradient; a negative index counts from the end."""
    m = nn.Embedding(10, 4, rng=0, padding_idx=-1, dtype=F64)
    assert m.padding_idx == 9 and not m.weight.data[9].any() and m.weight.data[:9].all()
    m(np.array([[9, 1, 9]]))
    m.backward(np.ones((1, 3, 4)))
    assert not m.weight.grad[9].any() and (m.weight.grad[1] == 1).all()
    for bad in (10, -11):
        with pytest.raises(ValueError, match=f"padding_idx {bad} is outside the table of 10 rows"):
            nn.Embedding(10, 4, padding_idx=bad)


@pytest.mark.parametrize("padding_idx", [3, -1])
def test_embedding_padding_idx_as_torch(padding_idx):
    torch = pytest.importorskip("torch")
    m = nn.Embedding(10, 4, rng=0, padding_idx=padding_idx, dtype=F64)
    t = torch.nn.Embedding(10, 4, padding_idx=padding_idx, dtype=torch.float64)
    with torch.no_grad():
        t.weight.copy_(torch.from_numpy(m.weight.data))
    assert m.padding_idx == t.padding_idx and not m.weight.data[t.padding_idx].any()
    ids = np.array([[9, 1, 3], [3, 9, 0]])
    dy = np.random.default_rng(1).standard_normal((2, 3, 4))
    m(ids)
    m.backward(dy)
    t(torch.from_numpy(ids)).backward(torch.from_numpy(dy))
    np.testing.assert_allclose(m.weight.grad, t.weight.grad.numpy(), atol=1e-15)


def test_a_batch_norm_without_bias_is_refused():
    with pytest.raises(ValueError, match="the batch norm always has a bias"):
        nn.make_norm("batch", 4, bias=False)


def test_a_block_config_with_keyword_form_arguments_is_refused():
    from numformer.models.config import BlockConfig

    with pytest.raises(TypeError, match=r"give either a BlockConfig or the keyword form.*bogus, norm_first, qk_norm"):
        nn.EncoderBlock(16, BlockConfig(n_heads=2), qk_norm=True, norm_first=True, bogus=3)
    nn.EncoderBlock(16, BlockConfig(n_heads=2), dropout=0.0, norm="rms")     # the block's own arguments


@pytest.mark.parametrize("kind", ["layer", "rms", "batch"])
def test_norm_modules(rng, kind):
    m = nn.make_norm(kind, 5, dtype=F64)
    for p in m.parameters():
        p.data[...] = rng.standard_normal(p.shape)
    x = rng.standard_normal((2, 3, 5)) * 2 + 0.5
    assert_gradcheck(module_gradcheck(m, {"x": x}, lambda x: m(x), lambda g: {"x": g}))


@pytest.mark.parametrize("activation", ["relu", "relu2", "gelu", "gelu_tanh"])
def test_feedforward(rng, activation):
    m = nn.FeedForward(4, 8, activation, dropout=0.2, rng=rng0(), dtype=F64)
    x = rng.standard_normal((2, 3, 4))

    def call(x):
        m.dropout.rng = np.random.default_rng(5)   # the same mask at every evaluation
        return m(x)

    assert_gradcheck(module_gradcheck(m, {"x": x}, call, lambda g: {"x": g}))


def test_dropout_module_train_eval():
    d = nn.Dropout(0.5, np.random.default_rng(0))
    x = np.ones((10, 10))
    assert (d(x) == 0).any()
    d.eval()
    assert d(x) is x


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_positional_modules(rng, kind):
    m = nn.make_positional(kind, 6, 10, rng=rng0(), dtype=F64)
    x = rng.standard_normal((2, 4, 6))
    assert_gradcheck(module_gradcheck(m, {"x": x}, lambda x: m(x, offset=3), lambda g: {"x": g}))


def _mha_masks(rng, B, Tq, Tk, H):
    attn_bool = rng.random((Tq, Tk)) < 0.3
    attn_bool[:, 0] = False
    kpm = np.zeros((B, Tk), dtype=bool)
    kpm[1, -1] = True
    return {
        "none": {},
        "attn_bool": {"attn_mask": attn_bool},
        "attn_float": {"attn_mask": rng.standard_normal((Tq, Tk))},
        "attn_3d": {"attn_mask": rng.standard_normal((B * H, Tq, Tk))},
        "key_padding": {"key_padding_mask": kpm},
        "causal": {"is_causal": True},
        "all": {"attn_mask": attn_bool, "key_padding_mask": kpm, "is_causal": Tq == Tk},
    }


@pytest.mark.parametrize("mask", ["none", "attn_bool", "attn_float", "attn_3d", "key_padding", "causal", "all"])
def test_mha_self_attention(rng, mask):
    B, T, E, H = 2, 4, 8, 2
    m = nn.MultiHeadAttention(E, H, rng=rng0(), dtype=F64)
    kw = _mha_masks(rng, B, T, T, H)[mask]
    x = rng.standard_normal((B, T, E))
    assert_gradcheck(module_gradcheck(m, {"x": x}, lambda x: m(x, **kw), lambda g: {"x": g}))


@pytest.mark.parametrize("mask", ["none", "attn_bool", "key_padding", "all"])
def test_mha_cross_attention_different_lengths(rng, mask):
    B, Tq, Tk, E, H = 2, 3, 5, 8, 4
    m = nn.MultiHeadAttention(E, H, rng=rng0(), dtype=F64)
    kw = _mha_masks(rng, B, Tq, Tk, H)[mask]
    x, mem = rng.standard_normal((B, Tq, E)), rng.standard_normal((B, Tk, E))
    assert_gradcheck(module_gradcheck(m, {"x": x, "mem": mem}, lambda x, mem: m(x, mem, **kw),
                                      lambda g: {"x": g[0], "mem": g[1]}))


def test_mha_separate_key_value_no_bias(rng):
    B, Tq, Tk, E, H = 2, 3, 4, 6, 3
    m = nn.MultiHeadAttention(E, H, bias=False, rng=rng0(), dtype=F64)
    q, k, v = (rng.standard_normal((B, t, E)) for t in (Tq, Tk, Tk))
    assert_gradcheck(module_gradcheck(m, {"q": q, "k": k, "v": v}, lambda q, k, v: m(q, k, v),
                                      lambda g: dict(zip("qkv", g))))


def test_mha_dropout_and_head_mask(rng):
    m = nn.MultiHeadAttention(8, 2, dropout=0.25, rng=rng0(), dtype=F64)
    m.head_mask = np.array([1.0, 0.5])
    x = rng.standard_normal((2, 4, 8))

    def call(x):
        m.rng = np.random.default_rng(3)
        return m(x, is_causal=True)

    assert_gradcheck(module_gradcheck(m, {"x": x}, call, lambda g: {"x": g}))


def test_mha_fully_masked_query_is_zero_and_finite(rng):
    m = nn.MultiHeadAttention(8, 2, bias=False, rng=rng0(), dtype=F64)
    x = rng.standard_normal((1, 3, 8))
    mask = np.zeros((3, 3), dtype=bool)
    mask[1] = True                       # query 1 may attend nothing
    out = m(x, attn_mask=mask)
    assert np.all(np.isfinite(out)) and np.allclose(out[0, 1], 0)
    dx = m.backward(np.ones_like(out))
    assert np.all(np.isfinite(dx)) and all(np.all(np.isfinite(p.grad)) for p in m.parameters())


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_encoder_block(rng, norm_first, norm):
    m = nn.EncoderBlock(8, 2, 16, dropout=0.0, activation="gelu", norm_first=norm_first, norm=norm, rng=rng0(),
                        dtype=F64)
    kpm = np.zeros((2, 4), dtype=bool)
    kpm[0, 3] = True
    x = rng.standard_normal((2, 4, 8))
    assert_gradcheck(module_gradcheck(m, {"x": x}, lambda x: m(x, key_padding_mask=kpm, is_causal=True),
                                      lambda g: {"x": g}))


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block(rng, norm_first):
    m = nn.DecoderBlock(8, 2, 16, dropout=0.0, norm_first=norm_first, rng=rng0(), dtype=F64)
    x, mem = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 5, 8))
    mkpm = np.zeros((2, 5), dtype=bool)
    mkpm[1, 3:] = True
    assert_gradcheck(module_gradcheck(
        m, {"x": x, "mem": mem}, lambda x, mem: m(x, mem, memory_key_padding_mask=mkpm, tgt_is_causal=True),
        lambda g: {"x": g[0], "mem": g[1]}))


def test_block_with_dropout_everywhere(rng):
    """Dropout in attention, feed-forward and residuals: gradients still exact for a fixed mask."""
    shared = np.random.default_rng(0)
    m = nn.EncoderBlock(8, 2, 16, dropout=0.2, rng=shared, dtype=F64)
    x = rng.standard_normal((2, 4, 8))
    state = shared.bit_generator.state

    def call(x):
        shared.bit_generator.state = state
        return m(x)

    assert_gradcheck(module_gradcheck(m, {"x": x}, call, lambda g: {"x": g}))


def test_stacks(rng):
    enc = nn.Encoder([nn.EncoderBlock(8, 2, 16, 0.0, rng=rng0(), dtype=F64) for _ in range(2)],
                     nn.LayerNorm(8, dtype=F64))
    dec = nn.Decoder([nn.DecoderBlock(8, 2, 16, 0.0, rng=rng0(), dtype=F64) for _ in range(2)],
                     nn.LayerNorm(8, dtype=F64))
    src, tgt = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 3, 8))
    assert_gradcheck(module_gradcheck(enc, {"x": src}, lambda x: enc(x), lambda g: {"x": g}))
    assert_gradcheck(module_gradcheck(dec, {"x": tgt, "mem": src}, lambda x, mem: dec(x, mem, tgt_is_causal=True),
                                      lambda g: {"x": g[0], "mem": g[1]}))


def test_module_state_dict_roundtrip_and_errors():
    a = nn.EncoderBlock(8, 2, 16, rng=np.random.default_rng(0))
    b = nn.EncoderBlock(8, 2, 16, rng=np.random.default_rng(1))
    b.load_state_dict({k: v.copy() for k, v in a.state_dict().items()})
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and np.array_equal(pa.data, pb.data)
    names = [n for n, _ in a.named_parameters()]
    assert names[:2] == ["self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias"]
    sd = dict(a.state_dict())
    sd.pop("norm1.weight")
    sd["extra"] = np.zeros(1)
    with pytest.raises(ValueError, match=r"missing keys: \['norm1.weight'\].*unexpected keys: \['extra'\]"):
        b.load_state_dict(sd)
    c = nn.EncoderBlock(8, 2, 32)
    with pytest.raises(ValueError, match="shape mismatch: ff.linear1.weight"):
        c.load_state_dict(a.state_dict())


def test_train_eval_and_zero_grad():
    m = nn.EncoderBlock(8, 2, 16, dropout=0.5)
    m.eval()
    assert all(not mod.training for mod in m.modules())
    m.train()
    assert all(mod.training for mod in m.modules())
    x = np.random.default_rng(0).standard_normal((1, 3, 8)).astype(np.float32)
    m.backward(np.ones_like(m(x)))
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())


def test_kv_cache_matches_full_attention(rng):
    m = nn.MultiHeadAttention(8, 2, rng=rng0(), dtype=F64)
    x = rng.standard_normal((2, 7, 8))
    full = m(x, is_causal=True)
    cache = nn.KVCache()
    steps = [m(x[:, :3], is_causal=True, kv_cache=cache)]
    steps += [m(x[:, t:t + 1], is_causal=True, kv_cache=cache) for t in range(3, 7)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=1e-12)
