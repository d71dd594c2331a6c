"""Parity with torch.nn through numformer.interop.torch: forward outputs and every gradient."""
from __future__ import annotations

import numpy as np
import pytest

from numformer.interop.torch import from_torch, grads_to_torch, relu_squared, to_torch

from conftest import F32_TOL, F64_TOL, assert_close

torch = pytest.importorskip("torch")
# torch's own notices about the reference's inputs (a float attn_mask beside a bool padding mask, which the
# parity tests use on purpose; nested tensors, which torch turns off itself for pre-LN): not about numformer
pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask:UserWarning",
                                        "ignore:enable_nested_tensor is True:UserWarning")
nn = torch.nn

DTYPES = [(torch.float64, np.float64, F64_TOL), (torch.float32, np.float32, F32_TOL)]


def run_both(tmod, inputs, kwargs, n_grad_inputs, tol):
    """Call the torch module and its conversion with the same arguments; compare outputs and all gradients."""
    tmod.train()  # dropout is 0 in these tests; train mode keeps torch off its inference fast path
    tmod.zero_grad()
    adapter = from_torch(tmod)
    t_inputs = [torch.from_numpy(x.copy()).requires_grad_(True) for x in inputs]
    t_kwargs = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in kwargs.items()}
    t_out = tmod(*t_inputs, **t_kwargs)
    t_main = t_out[0] if isinstance(t_out, tuple) else t_out
    dout = np.random.default_rng(0).standard_normal(t_main.shape).astype(inputs[0].dtype)
    t_main.backward(torch.from_numpy(dout))

    out = adapter(*inputs, **kwargs)
    main = out[0] if isinstance(out, tuple) else out
    assert_close(main, t_main.detach().numpy(), tol, "output")
    if isinstance(t_out, tuple) and t_out[1] is not None:
        assert_close(out[1], t_out[1].detach().numpy(), tol, "attention weights")
    grads = adapter.backward(dout)
    grads = grads if isinstance(grads, tuple) else (grads,)
    assert len(grads) == n_grad_inputs
    expected = [t.grad.numpy() for t in t_inputs]
    if n_grad_inputs < len(inputs):       # the same array passed as several arguments: gradients add up
        expected = [sum(expected[n_grad_inputs - 1:])] if n_grad_inputs == 1 else expected
    for i, (g, e) in enumerate(zip(grads, expected)):
        assert_close(g, e, tol, f"input gradient {i}")
    ours = grads_to_torch(adapter)
    theirs = {n: p.grad.numpy() for n, p in tmod.named_parameters()}
    assert set(ours) == set(theirs), "gradient names differ from torch's named_parameters()"
    for n in theirs:
        assert_close(ours[n], theirs[n], tol, f"grad {n}")
    return adapter


def mha_masks(rng, B, L, S, H):
    attn_bool = rng.random((L, S)) < 0.3
    attn_bool[:, 0] = False
    kpm = np.zeros((B, S), dtype=bool)
    kpm[1, -2:] = True
    causal = np.triu(np.ones((L, S), dtype=bool), k=1)
    return {
        "none": {},
        "attn_bool": {"attn_mask": attn_bool},
        "attn_float": {"attn_mask": rng.standard_normal((L, S))},
        "attn_3d_float": {"attn_mask": rng.standard_normal((B * H, L, S))},
        "key_padding_bool": {"key_padding_mask": kpm},
        "causal_hint": {"attn_mask": causal, "is_causal": True},
        "bool_and_padding": {"attn_mask": attn_bool, "key_padding_mask": kpm},
    }


@pytest.mark.parametrize("tdtype,ndtype,tol", DTYPES)
@pytest.mark.parametrize("mask", ["none", "attn_bool", "attn_float", "attn_3d_float", "key_padding_bool",
                                  "causal_hint", "bool_and_padding"])
@pytest.mark.parametrize("bias", [True, False])
def test_mha_self_attention(tdtype, ndtype, tol, mask, bias):
    torch.manual_seed(0)
    B, L, E, H = 2, 5, 16, 4
    tmod = nn.MultiheadAttention(E, H, bias=bias, batch_first=True).to(tdtype)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, L, E)).astype(ndtype)
    kw = dict(mha_masks(rng, B, L, L, H)[mask])
    kw = {k: (v.astype(ndtype) if isinstance(v, np.ndarray) and v.dtype != bool else v) for k, v in kw.items()}
    # torch sees three distinct tensors; numformer gets one array (fused QKV) and returns its total gradient.
    adapter = from_torch(tmod)
    t_x = [torch.from_numpy(x.copy()).requires_grad_(True) for _ in range(3)]
    t_kw = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    t_out, t_w = tmod(*t_x, **t_kw)
    dout = rng.standard_normal(t_out.shape).astype(ndtype)
    t_out.backward(torch.from_numpy(dout))
    out, w = adapter(x, x, x, **kw)
    assert_close(out, t_out.detach().numpy(), tol, "output")
    assert_close(w, t_w.detach().numpy(), tol, "weights")
    dx = adapter.backward(dout)
    assert_close(dx, sum(t.grad.numpy() for t in t_x), tol, "dx")
    theirs = {n: p.grad.numpy() for n, p in tmod.named_parameters()}
    ours = grads_to_torch(adapter)
    assert set(ours) == set(theirs)
    for n in theirs:
        assert_close(ours[n], theirs[n], tol, n)


@pytest.mark.parametrize("tdtype,ndtype,tol", DTYPES)
@pytest.mark.parametrize("mask", ["none", "attn_bool", "key_padding_bool", "bool_and_padding"])
def test_mha_cross_attention(tdtype, ndtype, tol, mask):
    torch.manual_seed(0)
    B, L, S, E, H = 2, 3, 6, 16, 2
    tmod = nn.MultiheadAttention(E, H, batch_first=True).to(tdtype)
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((B, t, E)).astype(ndtype) for t in (L, S, S))
    kw = mha_masks(rng, B, L, S, H)[mask]
    run_both(tmod, [q, k, v], dict(kw, need_weights=False), 3, tol)


def test_mha_per_head_weights():
    torch.manual_seed(0)
    tmod = nn.MultiheadAttention(8, 2, batch_first=True).double()
    x = np.random.default_rng(0).standard_normal((2, 4, 8))
    adapter = from_torch(tmod)
    _, w = adapter(x, x, x, average_attn_weights=False)
    _, tw = tmod(*(torch.from_numpy(x),) * 3, average_attn_weights=False)
    assert w.shape == (2, 2, 4, 4)
    assert_close(w, tw.detach().numpy(), F64_TOL)
    out, none = adapter(x, x, x, need_weights=False)
    assert none is None


def layer_inputs(rng, ndtype, B=2, T=5, S=6, E=16):
    tgt_mask = np.triu(np.full((T, T), -np.inf), k=1).astype(ndtype)
    src_kpm = np.zeros((B, S), dtype=bool)
    src_kpm[1, -2:] = True
    tgt_kpm = np.zeros((B, T), dtype=bool)
    tgt_kpm[0, -1] = True
    return (rng.standard_normal((B, S, E)).astype(ndtype), rng.standard_normal((B, T, E)).astype(ndtype),
            tgt_mask, src_kpm, tgt_kpm)


@pytest.mark.parametrize("tdtype,ndtype,tol", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu", relu_squared], ids=["relu", "gelu", "relu2"])
def test_encoder_layer(tdtype, ndtype, tol, norm_first, activation):
    torch.manual_seed(0)
    tmod = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation=activation, batch_first=True,
                                      norm_first=norm_first).to(tdtype)
    src, _, _, src_kpm, _ = layer_inputs(np.random.default_rng(3), ndtype)
    run_both(tmod, [src], {"src_key_padding_mask": src_kpm}, 1, tol)
    causal = np.triu(np.ones((6, 6), dtype=bool), k=1)
    run_both(tmod, [src], {"src_mask": causal, "is_causal": True}, 1, tol)


@pytest.mark.parametrize("tdtype,ndtype,tol", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_decoder_layer(tdtype, ndtype, tol, norm_first, activation):
    torch.manual_seed(0)
    tmod = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, activation=activation, batch_first=True,
                                      norm_first=norm_first).to(tdtype)
    memory, tgt, tgt_mask, src_kpm, tgt_kpm = layer_inputs(np.random.default_rng(4), ndtype)
    run_both(tmod, [tgt, memory], {"tgt_mask": tgt_mask, "tgt_key_padding_mask": tgt_kpm,
                                   "memory_key_padding_mask": src_kpm, "tgt_is_causal": True}, 2, tol)


@pytest.mark.parametrize("tdtype,ndtype,tol", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_and_decoder_stacks(tdtype, ndtype, tol, norm_first):
    torch.manual_seed(0)
    enc_layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
    enc = nn.TransformerEncoder(enc_layer, 2, norm=nn.LayerNorm(16), enable_nested_tensor=False).to(tdtype)
    dec_layer = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
    dec = nn.TransformerDecoder(dec_layer, 2, norm=None).to(tdtype)
    memory, tgt, tgt_mask, src_kpm, tgt_kpm = layer_inputs(np.random.default_rng(5), ndtype)
    run_both(enc, [memory], {"src_key_padding_mask": src_kpm}, 1, tol)
    run_both(dec, [tgt, memory], {"tgt_mask": tgt_mask, "memory_key_padding_mask": src_kpm}, 2, tol)


@pytest.mark.parametrize("tdtype,ndtype,tol", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_full_transformer(tdtype, ndtype, tol, norm_first, activation):
    torch.manual_seed(0)
    tmod = nn.Transformer(16, 4, 2, 2, 32, dropout=0.0, activation=activation, batch_first=True,
                          norm_first=norm_first).to(tdtype)
    memory_in, tgt, tgt_mask, src_kpm, tgt_kpm = layer_inputs(np.random.default_rng(6), ndtype)
    run_both(tmod, [memory_in, tgt], {"tgt_mask": tgt_mask, "src_key_padding_mask": src_kpm,
                                      "tgt_key_padding_mask": tgt_kpm, "memory_key_padding_mask": src_kpm}, 2, tol)


def test_to_torch_roundtrip():
    torch.manual_seed(0)
    for tmod in (nn.MultiheadAttention(8, 2, batch_first=True),
                 nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, norm_first=True, activation="gelu"),
                 nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, activation=relu_squared),
                 nn.TransformerDecoderLayer(8, 2, 16, batch_first=True),
                 nn.Transformer(8, 2, 1, 1, 16, batch_first=True)):
        back = to_torch(from_torch(tmod.double()))
        assert type(back) is type(tmod)
        a = dict(tmod.named_parameters())
        b = dict(back.named_parameters())
        assert set(a) == set(b)
        for n in a:
            assert torch.equal(a[n], b[n]), n


def test_from_torch_rejects_unsupported():
    with pytest.raises(ValueError, match="batch_first=True"):
        from_torch(nn.MultiheadAttention(8, 2))
    with pytest.raises(TypeError, match="does not know Linear"):
        from_torch(nn.Linear(2, 2))


def memory_masks(rng, ndtype, T=5, S=6, B=2):
    """memory_mask variants for the decoder's cross-attention: (T, S), T != S."""
    mem_bool = rng.random((T, S)) < 0.3
    mem_bool[:, 0] = False                               # every query keeps one key
    mem_kpm = np.zeros((B, S), dtype=bool)
    mem_kpm[1, -2:] = True
    causal = np.triu(np.ones((T, S), dtype=bool), k=1)   # torch's is_causal is top-left aligned
    return {
        "bool": {"memory_mask": mem_bool},
        "float": {"memory_mask": rng.standard_normal((T, S)).astype(ndtype)},
        "bool_and_padding": {"memory_mask": mem_bool, "memory_key_padding_mask": mem_kpm},
        # torch drops the mask and runs attention with is_causal=True here (no padding, no weights)
        "causal_hint": {"memory_mask": causal, "memory_is_causal": True},
    }


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("mask", ["bool", "float", "bool_and_padding", "causal_hint"])
@pytest.mark.parametrize("stack", [False, True])
def test_decoder_memory_mask(norm_first, mask, stack):
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
    tmod = nn.TransformerDecoder(layer, 2, norm=nn.LayerNorm(16)) if stack else layer
    tmod = tmod.to(torch.float64)
    rng = np.random.default_rng(7)
    memory, tgt, tgt_mask, _, tgt_kpm = layer_inputs(rng, np.float64)
    kw = {"tgt_mask": tgt_mask, "tgt_key_padding_mask": tgt_kpm, **memory_masks(rng, np.float64)[mask]}
    run_both(tmod, [tgt, memory], kw, 2, F64_TOL)


def test_decoder_memory_mask_is_applied():
    """The memory_mask changes the output (so the parity above is not the unmasked path twice)."""
    torch.manual_seed(0)
    tmod = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True).double()
    rng = np.random.default_rng(7)
    memory, tgt, _, _, _ = layer_inputs(rng, np.float64)
    adapter = from_torch(tmod)
    plain = adapter(tgt, memory)
    for kw in memory_masks(rng, np.float64).values():
        assert np.max(np.abs(adapter(tgt, memory, **kw) - plain)) > 1e-3


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("mask", ["bool", "float", "causal_hint", "all_masks"])
def test_full_transformer_src_mask(norm_first, mask):
    torch.manual_seed(0)
    tmod = nn.Transformer(16, 4, 2, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first).double()
    rng = np.random.default_rng(8)
    src, tgt, tgt_mask, src_kpm, tgt_kpm = layer_inputs(rng, np.float64)
    S = src.shape[1]
    src_bool = rng.random((S, S)) < 0.3
    src_bool[:, 0] = False
    kw = {
        "bool": {"src_mask": src_bool},
        "float": {"src_mask": rng.standard_normal((S, S))},
        "causal_hint": {"src_mask": np.triu(np.ones((S, S), dtype=bool), k=1), "src_is_causal": True,
                        "tgt_mask": tgt_mask, "tgt_is_causal": True},
        "all_masks": {"src_mask": src_bool, "tgt_mask": tgt_mask, **memory_masks(rng, np.float64)["float"],
                      "src_key_padding_mask": src_kpm, "tgt_key_padding_mask": tgt_kpm,
                      "memory_key_padding_mask": src_kpm},
    }[mask]
    run_both(tmod, [src, tgt], kw, 2, F64_TOL)


def _causal_without_mask_cases():
    E, H, T, S = 16, 4, 5, 6
    enc_layer = lambda: nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True)  # noqa: E731
    dec_layer = lambda: nn.TransformerDecoderLayer(E, H, 32, dropout=0.0, batch_first=True)  # noqa: E731
    x, mem = (T, "x"), (S, "mem")
    return [
        ("mha_self", lambda: nn.MultiheadAttention(E, H, batch_first=True), [x, x, x], {"is_causal": True},
         "attn_mask"),
        ("mha_self_no_weights", lambda: nn.MultiheadAttention(E, H, batch_first=True), [x, x, x],
         {"is_causal": True, "need_weights": False}, "attn_mask"),
        ("mha_cross", lambda: nn.MultiheadAttention(E, H, batch_first=True), [x, mem, mem],
         {"is_causal": True, "need_weights": False}, "attn_mask"),
        ("encoder_layer", enc_layer, [x], {"is_causal": True}, "src_mask"),
        ("decoder_layer_tgt", dec_layer, [x, mem], {"tgt_is_causal": True}, "tgt_mask"),
        ("decoder_layer_memory", dec_layer, [x, mem], {"memory_is_causal": True}, "memory_mask"),
        ("encoder", lambda: nn.TransformerEncoder(enc_layer(), 2, enable_nested_tensor=False), [x],
         {"is_causal": True}, "mask"),
        ("decoder_tgt", lambda: nn.TransformerDecoder(dec_layer(), 2), [x, mem], {"tgt_is_causal": True},
         "tgt_mask"),
        ("decoder_memory", lambda: nn.TransformerDecoder(dec_layer(), 2), [x, mem], {"memory_is_causal": True},
         "memory_mask"),
        ("transformer_src", lambda: nn.Transformer(E, H, 1, 1, 32, dropout=0.0, batch_first=True), [mem, x],
         {"src_is_causal": True}, "src_mask"),
        ("transformer_tgt", lambda: nn.Transformer(E, H, 1, 1, 32, dropout=0.0, batch_first=True), [mem, x],
         {"tgt_is_causal": True}, "tgt_mask"),
        ("transformer_memory", lambda: nn.Transformer(E, H, 1, 1, 32, dropout=0.0, batch_first=True), [mem, x],
         {"memory_is_causal": True}, "memory_mask"),
    ]


@pytest.mark.parametrize("name,make,shapes,kwargs,mask_name", _causal_without_mask_cases(),
                         ids=[c[0] for c in _causal_without_mask_cases()])
def test_is_causal_without_mask_raises_as_torch(name, make, shapes, kwargs, mask_name):
    """torch 2.13 refuses an is_causal flag without its mask; the converted module refuses it too."""
    torch.manual_seed(0)
    tmod = make().double().train()
    rng = np.random.default_rng(9)
    arrays = {tag: rng.standard_normal((2, n, 16)) for n, tag in shapes}
    inputs = [arrays[tag] for _, tag in shapes]          # the same array where torch gets the same tensor
    t_arrays = {tag: torch.from_numpy(a).requires_grad_(True) for tag, a in arrays.items()}
    with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
        tmod(*[t_arrays[tag] for _, tag in shapes], **kwargs)
    adapter = from_torch(tmod)
    flag = next(k for k, v in kwargs.items() if k.endswith("is_causal"))
    with pytest.raises(ValueError, match=rf"{flag}=True needs the causal mask.*pass the causal mask as {mask_name}"):
        adapter(*inputs, **kwargs)


# -- whole encoder-decoder models ----------------------------------------------------------------------------------
SEQ2SEQ_OPTIONS = {
    "post_ln": dict(),                                                   # numformer's default: no final norms
    "pre_ln_shared_tied": dict(norm_first=True, share_embeddings=True, tie_output=True, activation="gelu"),
    "learned_final_norm": dict(positional="learned", final_norm=True, scale_embeddings=False, n_decoder_layers=1),
    "relu2": dict(norm_first=True, activation="relu2"),
}


@pytest.mark.parametrize("options", sorted(SEQ2SEQ_OPTIONS))
@pytest.mark.parametrize("tdtype,ndtype,tol", DTYPES)
def test_full_numformer_transformer_to_torch_and_back(options, tdtype, ndtype, tol):
    from numformer import ops
    from numformer.models import Transformer

    V, PAD = 23, 0
    model = Transformer(V, V, d_model=16, n_heads=4, n_layers=2, d_ff=24, dropout=0.0, max_len=20, src_pad_id=PAD,
                        tgt_pad_id=PAD, rng=np.random.default_rng(0), dtype=ndtype, **SEQ2SEQ_OPTIONS[options])
    tmod = to_torch(model)
    assert type(tmod).__name__ == "TorchSeq2Seq"
    rng = np.random.default_rng(1)
    src, tgt, targets = rng.integers(1, V, (2, 7)), rng.integers(1, V, (2, 5)), rng.integers(1, V, (2, 5))
    src[1, -2:] = PAD
    tgt[0, -1] = PAD
    t_logits = tmod(torch.from_numpy(src), torch.from_numpy(tgt))
    torch.nn.functional.cross_entropy(t_logits.reshape(-1, V), torch.from_numpy(targets).reshape(-1)).backward()
    logits = model(src, tgt)
    loss, cache = ops.cross_entropy_forward(logits, targets)
    model.backward(ops.cross_entropy_backward(cache))
    assert_close(logits, t_logits.detach().numpy(), tol, "logits")
    t_grads = {n: p.grad.numpy() for n, p in tmod.named_parameters()}
    ours = {n: p.grad for n, p in model.named_parameters()}
    from numformer.interop.torch import _seq2seq_torch_name
    assert {_seq2seq_torch_name(n) for n in ours} == set(t_grads)
    for n, g in ours.items():
        assert_close(g, t_grads[_seq2seq_torch_name(n)], tol, f"grad {n}")
    back = from_torch(tmod)
    assert back.encoder.norm is None if options == "post_ln" else back.encoder.norm is not None
    assert_close(back(src, tgt), logits, tol, "logits after the round trip")


def test_torch_tutorial_seq2seq_model_into_numformer():
    """The usual torch model: two nn.Embedding, nn.Transformer (post-LN, with final norms), a generator."""
    from numformer.interop.torch import from_torch_seq2seq
    from numformer.nn.positional import sinusoidal_table

    torch.manual_seed(0)
    d, V_src, V_tgt = 16, 19, 17
    src_embed, tgt_embed = nn.Embedding(V_src, d).double(), nn.Embedding(V_tgt, d).double()
    transformer = nn.Transformer(d, 4, 2, 2, 32, dropout=0.0, batch_first=True).double()
    generator = nn.Linear(d, V_tgt, bias=False).double()
    pe = torch.from_numpy(sinusoidal_table(30, d))

    def torch_forward(src, tgt):
        T = tgt.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
        x = src_embed(src) * d ** 0.5 + pe[:src.shape[1]]
        y = tgt_embed(tgt) * d ** 0.5 + pe[:T]
        return generator(transformer(x, y, tgt_mask=mask))

    model = from_torch_seq2seq(transformer, src_embed, tgt_embed, generator, max_len=30)
    assert model.encoder.norm is not None and model.decoder.norm is not None     # final_norm from nn.Transformer
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(0, V_src, (2, 6)), rng.integers(0, V_tgt, (2, 4))
    assert_close(model(src, tgt), torch_forward(torch.from_numpy(src), torch.from_numpy(tgt)).detach().numpy(),
                 F64_TOL, "logits")
    with pytest.raises(ValueError, match="generator has a bias"):
        from_torch_seq2seq(transformer, src_embed, tgt_embed, nn.Linear(d, V_tgt).double())


@pytest.mark.parametrize("make", [lambda nn: nn.Linear(4, 4), lambda nn: nn.ReLU(), lambda nn: "not a module",
                                  lambda nn: type("TorchSeq2Seq", (nn.Module,), {})()])
def test_from_torch_of_an_unknown_module_is_a_type_error_naming_what_it_converts(make):
    from numformer.interop.torch import from_torch

    with pytest.raises(TypeError, match=r"MultiheadAttention, TransformerEncoderLayer, .*TorchSeq2Seq") as e:
        from_torch(make(torch.nn))
    assert "\n" not in str(e.value)
