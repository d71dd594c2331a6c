"""Gradient checkpointing per block gives bit-for-bit the gradients of the ordinary path (dropout and masks on)."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from numformer import GPT, EncoderClassifier, Transformer
from numformer.models import build_model
from numformer.nn import Encoder, EncoderBlock, checkpoint


def _grads(model):
    return {n: p.grad.copy() for n, p in model.named_parameters() if p.grad is not None}


def _assert_identical(a, b, what):
    assert a.shape == b.shape, what
    assert np.array_equal(a, b), f"{what}: max difference {np.max(np.abs(a - b)):.3e} (expected bit-identical)"


def _run_pair(make, call, rng_of, steps=2):
    """Train-mode forward + backward of the same model with and without checkpointing; compare everything."""
    base, ckpt = make(False), make(True)
    for step in range(steps):                                   # two steps: the generator state carries over
        results = []
        for m in (base, ckpt):
            m.zero_grad()
            out = call(m)
            dout = np.random.default_rng(step).standard_normal(out.shape)
            m.backward(dout)
            results.append((out, _grads(m)))
        (o1, g1), (o2, g2) = results
        _assert_identical(o2, o1, f"step {step} output")
        assert g1.keys() == g2.keys()
        for n in g1:
            _assert_identical(g2[n], g1[n], f"step {step} {n}")
    # the shared generators end in the same state: the next draws agree
    assert rng_of(base).random() == rng_of(ckpt).random()


@pytest.mark.parametrize("norm_first", [True, False])
def test_gpt_checkpointing_identical_gradients(rng, norm_first):
    idx = rng.integers(0, 17, (3, 10))
    _run_pair(lambda c: GPT(17, 16, n_layers=3, n_heads=2, d_model=8, dropout=0.3, norm_first=norm_first,
                            rng=np.random.default_rng(0), dtype=np.float64, gradient_checkpointing=c),
              lambda m: m(idx), lambda m: m.drop.rng)


def test_transformer_checkpointing_identical_gradients(rng):
    src = rng.integers(1, 13, (2, 9))
    src[1, -3:] = 0
    tgt = rng.integers(1, 13, (2, 7))
    tgt[0, -2:] = 0
    src_mask = rng.standard_normal((9, 9)) * 0.1
    _run_pair(lambda c: Transformer(13, 13, d_model=8, n_heads=2, n_layers=2, d_ff=16, dropout=0.25, src_pad_id=0,
                                    tgt_pad_id=0, rng=np.random.default_rng(0), dtype=np.float64,
                                    gradient_checkpointing=c),
              lambda m: m(src, tgt, src_mask=src_mask), lambda m: m.src_drop.rng)


def test_classifier_checkpointing_identical_gradients(rng):
    ids = rng.integers(1, 13, (3, 8))
    ids[2, -5:] = 0
    _run_pair(lambda c: EncoderClassifier(13, 3, max_len=16, d_model=8, n_heads=2, n_layers=3, dropout=0.2,
                                          rng=np.random.default_rng(0), dtype=np.float64, gradient_checkpointing=c),
              lambda m: m(ids), lambda m: m.drop.rng)


def test_checkpointing_with_flash_attention_and_float32(rng):
    idx = rng.integers(0, 17, (2, 12))
    # flash attention has no attention dropout, so dropout stays 0 here; float32 must be bit-identical too
    _run_pair(lambda c: GPT(17, 16, n_layers=2, n_heads=2, d_model=8, attention="flash",
                            rng=np.random.default_rng(0), gradient_checkpointing=c),
              lambda m: m(idx), lambda m: m.drop.rng)


def test_encoder_stack_checkpointing_with_separate_generators(rng):
    """Blocks with their own generators (and one shared by two blocks) are all replayed."""
    def make(c):
        g = [np.random.default_rng(s) for s in (1, 2)]
        blocks = [EncoderBlock(8, 2, 16, dropout=0.3, rng=g[i], dtype=np.float64) for i in (0, 1, 1)]
        return Encoder(blocks, gradient_checkpointing=c)

    x = rng.standard_normal((2, 6, 8))
    pad = np.zeros((2, 6), dtype=bool)
    pad[0, -2:] = True
    attn = rng.random((6, 6)) < 0.2
    base, ckpt = make(False), make(True)
    outs = []
    for m in (base, ckpt):
        y = m(x, mask=attn, key_padding_mask=pad)
        dx = m.backward(np.ones_like(y))
        outs.append((y, dx, _grads(m)))
    _assert_identical(outs[1][0], outs[0][0], "output")
    _assert_identical(outs[1][1], outs[0][1], "dx")
    for n in outs[0][2]:
        _assert_identical(outs[1][2][n], outs[0][2][n], n)
    assert len(checkpoint.generators(ckpt)) == 2


def test_checkpointed_forward_keeps_only_block_inputs():
    """After a checkpointed forward, the blocks hold no caches; the retained memory is much smaller."""
    idx = np.random.default_rng(0).integers(0, 50, (4, 64))

    def retained(c):
        m = GPT(50, 64, n_layers=4, n_heads=4, d_model=64, rng=np.random.default_rng(0), gradient_checkpointing=c)
        tracemalloc.start()
        try:
            m(idx)
            held = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        return m, held

    m, held_ckpt = retained(True)
    assert all(checkpoint.is_checkpointed(b) for b in m.blocks)
    for b in m.blocks:
        assert all(sub.__dict__.get("_cache") is None for sub in b.modules())
    _, held_plain = retained(False)
    assert held_ckpt < held_plain / 2, (held_ckpt, held_plain)


def test_stale_checkpoint_is_forgotten_when_switched_off(rng):
    idx = rng.integers(0, 17, (2, 8))
    other = rng.integers(0, 17, (2, 8))
    a = GPT(17, 16, n_layers=2, n_heads=2, d_model=8, rng=np.random.default_rng(0), dtype=np.float64,
            gradient_checkpointing=True)
    b = GPT(17, 16, n_layers=2, n_heads=2, d_model=8, rng=np.random.default_rng(0), dtype=np.float64)
    a(other)                                            # checkpointed forward, never backpropagated
    a.gradient_checkpointing = False
    for m in (a, b):
        out = m(idx)
        m.backward(np.ones_like(out))
    for n, g in _grads(b).items():
        _assert_identical(_grads(a)[n], g, n)


def test_kv_cache_decoding_ignores_checkpointing(rng):
    gpt = build_model({"type": "gpt", "vocab_size": 11, "block_size": 16, "n_layers": 2, "n_heads": 2, "d_model": 8,
                       "gradient_checkpointing": True}, rng=np.random.default_rng(0), dtype=np.float64)
    assert gpt.gradient_checkpointing
    gpt.eval()
    idx = rng.integers(0, 11, (1, 6))
    full = gpt(idx)
    caches = gpt.new_kv_caches()
    steps = [gpt(idx[:, t:t + 1], kv_caches=caches) for t in range(6)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-12)
    assert not any(checkpoint.is_checkpointed(b) for b in gpt.blocks)


def test_transformer_config_switches():
    m = build_model({"type": "transformer", "src_vocab_size": 9, "tgt_vocab_size": 9, "d_model": 8, "n_heads": 2,
                     "n_layers": 1, "d_ff": 16, "dropout": 0.0, "attention": "flash",
                     "gradient_checkpointing": True})
    assert m.encoder.gradient_checkpointing and m.decoder.gradient_checkpointing
    assert m.decoder.layers[0].cross_attn.attention == "flash"


def test_recompute_without_checkpoint_is_an_error():
    block = EncoderBlock(8, 2, 16, dropout=0.0)
    with pytest.raises(RuntimeError, match="nothing to recompute"):
        checkpoint.recompute(block)


def test_a_forward_hook_turns_the_decoders_checkpointing_off(rng):
    """A forward hook that changes an activation must reach backward: the recomputation of a checkpointed block
    would run without it (the hook is removed after the forward, as run_with_hooks does), so the decoder, like
    the encoder and the GPT, does not checkpoint while one is attached."""
    src, tgt = rng.integers(1, 13, (2, 9)), rng.integers(1, 13, (2, 7))
    grads = []
    for checkpointing in (False, True):
        model = Transformer(13, 13, d_model=8, n_heads=2, n_layers=2, d_ff=16, rng=np.random.default_rng(0),
                            dtype=np.float64, gradient_checkpointing=checkpointing)
        point = model.decoder.layers[0].hook_mlp_out
        zero = lambda act, hook: np.zeros_like(act)      # noqa: E731
        point.add_hook(zero)
        logits = model(src, tgt)
        point.remove_hook(zero)
        model.backward(np.ones_like(logits))
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert not grads[0]["decoder.layers.0.ff.linear2.weight"].any()          # the zeroed output's weights
    for name in grads[0]:
        np.testing.assert_allclose(grads[1][name], grads[0][name], atol=1e-13, err_msg=name)
