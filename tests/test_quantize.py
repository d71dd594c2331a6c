"""numformer.quantize: absmax int8 quantization, its fast kernel against the reference, QuantizedLinear and
quantize_model on every model (logits against the float model with the dequantized weights, generation with
the KV cache, cross-attention, bytes in memory, every layer taking effect)."""
from __future__ import annotations

import numpy as np
import pytest

from numformer import GPT, EncoderClassifier, Transformer, _runtime, reference_mode
from numformer.nn import Linear, Module, Parameter
from numformer.quantize import (QuantizedLinear, QuantizedQKVProjection, dequantize, kernel, quantize,
                                quantize_model, quantized_linear_forward, weight_bytes)

TOL = {np.float32: 1e-5, np.float64: 1e-12}


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# -- the reference --------------------------------------------------------------------------------------------
def test_absmax_by_hand():
    """Per channel: s = max|row| / 127, q = round(W / s); the largest magnitude maps to ±127."""
    W = np.array([[0.5, -1.0, 0.25, 0.0], [2.0, 1.0, -0.5, 0.03]])
    q, s = quantize(W)
    np.testing.assert_array_equal(s, [[1.0 / 127], [2.0 / 127]])
    np.testing.assert_array_equal(q, [[64, -127, 32, 0], [127, 64, -32, 2]])    # 63.5 -> 64, 31.75 -> 32
    assert q.dtype == np.int8 and s.dtype == W.dtype


@pytest.mark.parametrize("group_size", [None, 1, 4, 7, 16, 64])
@pytest.mark.parametrize("bits", [8, 4])
def test_quantize_error_is_at_most_half_a_step(group_size, bits, rng):
    """|W - Ŵ| <= s/2 for every weight; q within ±q_max; symmetric (-W gives -q); the last group may be shorter."""
    W = rng.standard_normal((13, 30)).astype(np.float32)
    q, s = quantize(W, bits, group_size)
    g = 30 if group_size is None else min(group_size, 30)
    assert s.shape == (13, -(-30 // g))
    assert np.abs(q).max() == 2 ** (bits - 1) - 1
    step = np.repeat(s, g, axis=1)[:, :30]
    assert np.all(np.abs(W - dequantize(q, s, group_size)) <= step / 2 * (1 + 1e-6))
    q_neg, s_neg = quantize(-W, bits, group_size)
    np.testing.assert_array_equal(q_neg, -q)
    np.testing.assert_array_equal(s_neg, s)


def test_smaller_groups_make_smaller_errors(rng):
    W = rng.standard_normal((64, 256)) * np.exp(rng.standard_normal((1, 256)))     # columns of different scales
    errors = [np.abs(W - dequantize(*quantize(W, 8, g), g)).mean() for g in (None, 128, 32, 8)]
    assert errors == sorted(errors, reverse=True)


def test_zero_groups_and_bad_arguments():
    q, s = quantize(np.zeros((2, 8), np.float32), 8, 4)
    assert not q.any() and not s.any()
    with pytest.raises(ValueError, match="bits must be an integer from 2 to 8"):
        quantize(np.ones((2, 2)), bits=16)
    with pytest.raises(ValueError, match="group_size must be a positive integer or None"):
        quantize(np.ones((2, 2)), group_size=0)
    with pytest.raises(ValueError, match="2-D float weight"):
        quantize(np.ones((2, 2), np.int64))


# -- the kernel against the reference -------------------------------------------------------------------------
SHAPES = [(1, 1, None), (37, 45, None), (37, 45, 9), (37, 45, 8), (100, 344, 64), (256, 128, 32), (64, 128, 256),
          (300, 96, 1)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("N,K,group_size", SHAPES)
@pytest.mark.parametrize("batch", [1, 8, 40])
def test_kernel_equals_reference(N, K, group_size, batch, dtype, rng, monkeypatch):
    """Batch 1 and 8 (the block-by-block path, with small blocks so that there are several and the last is
    ragged) and 40 (dequantize then one product), with a bias and leading axes; float32 and float64."""
    monkeypatch.setattr(kernel, "BLOCK_BYTES", 4096)
    W = rng.standard_normal((N, K)).astype(dtype)
    b = rng.standard_normal(N).astype(dtype)
    q, s = quantize(W, 8, group_size)
    x = rng.standard_normal((2, batch // 2 or 1, K) if batch > 1 else (batch, K)).astype(dtype)
    expected = quantized_linear_forward(x, q, s, group_size, b)
    got = kernel.quantized_linear_forward(x, q, s, group_size, b)
    assert got.dtype == dtype and got.shape == expected.shape and got.flags.c_contiguous
    assert rel_err(got, expected) < TOL[dtype]


@pytest.mark.parametrize("small_kernels", [True, False])
@pytest.mark.parametrize("group_size", [None, 32])
@pytest.mark.parametrize("batch", [2, 5, 16])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_several_rows_take_the_small_matrix_kernels(small_kernels, group_size, batch, dtype, rng, monkeypatch):
    """Several rows of x: each block's product is made 8 rows of the block at a time where the BLAS has
    small-matrix kernels (``_runtime.few_rows_columns``, its limit shrunk here), whole where it has none; the
    reference's result either way, on blocks of 64 rows and a ragged last one."""
    monkeypatch.setattr(_runtime, "small_kernels", lambda: small_kernels)
    monkeypatch.setattr(_runtime, "SMALL_MNK", batch * 8 * 64)
    monkeypatch.setattr(kernel, "BLOCK_BYTES", 64 * 64 * np.dtype(dtype).itemsize)
    assert _runtime.few_rows_columns(batch, 64) == (8 if small_kernels else 0)
    W = rng.standard_normal((203, 64)).astype(dtype)
    q, s = quantize(W, 8, group_size)
    x = rng.standard_normal((batch, 64)).astype(dtype)
    got = kernel.quantized_linear_forward(x, q, s, group_size)
    assert got.dtype == dtype and rel_err(got, quantized_linear_forward(x, q, s, group_size)) < TOL[dtype]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("own_blas", [True, False])
def test_kernel_threads_and_blas_modes(threads, own_blas, rng, monkeypatch):
    """The result does not depend on how the rows are shared among threads, nor on who owns the BLAS."""
    monkeypatch.setattr(kernel, "BLOCK_BYTES", 8192)
    monkeypatch.setattr(kernel, "MIN_PIECE_WEIGHTS", 1)            # split even this small matrix
    monkeypatch.setitem(_runtime._threads, "n", threads)
    monkeypatch.setitem(_runtime._state, "own_blas", own_blas)
    W = rng.standard_normal((203, 96))
    q, s = quantize(W, 8, 32)
    for m in (1, 8):
        x = rng.standard_normal((m, 96))
        assert rel_err(kernel.quantized_linear_forward(x, q, s, 32), quantized_linear_forward(x, q, s, 32)) < 1e-12


@pytest.mark.parametrize("N,K", [(3 * 1024, 1024), (1024, 3072), (1024, 1024), (200, 96)])
def test_the_threads_share_the_rows_equally(N, K, monkeypatch):
    """Each thread gets half the output rows (to 8) of a matrix worth splitting, whatever its number of blocks
    (three 4 MiB blocks, four uneven ones, one): the time of a product is its slowest thread's. A matrix of
    fewer than 2 · MIN_PIECE_WEIGHTS weights stays on one thread."""
    monkeypatch.setitem(_runtime._threads, "n", 2)
    monkeypatch.setattr(kernel, "BLOCK_BYTES", 4 << 20)
    shares, split = [], kernel.parallel_for

    def spy(n, fn, grain):                  # the real split, each piece's rows recorded
        def piece(lo, hi):
            shares.append(min(hi * kernel.ROW_UNIT, N) - lo * kernel.ROW_UNIT)
            fn(lo, hi)
        split(n, piece, grain)

    monkeypatch.setattr(kernel, "parallel_for", spy)
    q, s = quantize(np.ones((N, K), np.float32))
    y = kernel.quantized_linear_forward(np.ones((1, K), np.float32), q, s)
    assert np.allclose(y, K)
    if N * K >= 2 * kernel.MIN_PIECE_WEIGHTS:
        assert len(shares) == 2 and abs(shares[0] - shares[1]) <= kernel.ROW_UNIT and sum(shares) == N
    else:
        assert shares == [N]


def test_fast_dequantize_equals_reference(rng):
    W = rng.standard_normal((70, 344)).astype(np.float32)
    for g in (None, 64, 5):
        q, s = quantize(W, 8, g)
        np.testing.assert_array_equal(kernel.dequantize(q, s, g), dequantize(q, s, g))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blockwise_quantize_equals_reference(dtype, rng, monkeypatch):
    """kernel.quantize works a block of rows at a time: the reference's int8 weights and scales bit for bit, with
    blocks of one row, of a few rows (the last shorter) and of the whole matrix; the reference's errors."""
    W = rng.standard_normal((70, 344)).astype(dtype)
    W[3] = 0                                                            # a row of zeros: scale 0
    for block_bytes in (1, 344 * np.dtype(dtype).itemsize * 8, 1 << 30):
        monkeypatch.setattr(kernel, "QUANTIZE_BLOCK_BYTES", block_bytes)
        for bits, g in ((8, None), (8, 64), (4, 5), (3, 344)):
            q, s = kernel.quantize(W, bits, g)
            q_ref, s_ref = quantize(W, bits, g)
            assert q.dtype == np.int8 and s.dtype == dtype
            np.testing.assert_array_equal(q, q_ref)
            np.testing.assert_array_equal(s, s_ref)
    for bad in (W[0], W.astype(np.int32)):
        with pytest.raises(ValueError, match="2-D float weight"):
            kernel.quantize(bad)
    with pytest.raises(ValueError, match="bits must be an integer from 2 to 8"):
        kernel.quantize(W, bits=9)


# -- QuantizedLinear -------------------------------------------------------------------------------------------
def test_quantized_linear_from_linear(rng):
    lin = Linear(48, 20, rng=rng)
    layer = QuantizedLinear.from_linear(lin, group_size=16)
    assert layer.qweight.dtype == np.int8 and layer.scales.shape == (20, 3)
    assert layer.nbytes == 20 * 48 + 20 * 3 * 4 + 20 * 4
    x = rng.standard_normal((3, 5, 48)).astype(np.float32)
    y = layer(x)
    np.testing.assert_allclose(y, x @ layer.dequantized_weight().T + lin.bias.data, rtol=1e-5, atol=1e-6)
    assert rel_err(y, lin(x)) < 0.02                        # int8 per group of 16 against the float layer
    with reference_mode():
        assert rel_err(layer(x), y) < 1e-5
    with pytest.raises(RuntimeError, match="inference only"):
        layer.backward(np.ones_like(y))
    with pytest.raises(ValueError, match="last dimension 48"):
        layer(np.ones((2, 47), np.float32))
    with pytest.raises(ValueError, match="needs int8 weights"):
        QuantizedLinear(layer.qweight.astype(np.int16), layer.scales, group_size=16)


def test_quantized_linear_follows_the_model_dtype(rng):
    layer = QuantizedLinear.from_linear(Linear(8, 4, rng=rng))
    layer.astype(np.float64)
    assert layer.qweight.dtype == np.int8 and layer.scales.dtype == np.float64 and layer.bias.dtype == np.float64
    assert layer(np.ones((1, 8))).dtype == np.float64


# -- quantize_model on GPTs ----------------------------------------------------------------------------------
def speedrun_like(seed=0, **kw):
    """A small GPT of the speedrun's kind (RoPE, grouped-query attention, RMSNorm, SwiGLU, no biases, tied)."""
    config = dict(vocab_size=65, block_size=32, n_layers=2, n_heads=4, n_kv_heads=2, d_model=64,
                  positional="rope", activation="swiglu", norm="rms", bias=False)
    return GPT(**{**config, **kw}, rng=np.random.default_rng(seed))


def gpt2_like(seed=0, **kw):
    """GPT-2's kind: learned positions, GELU, LayerNorm, biases; the output layer untied."""
    return GPT(vocab_size=50, block_size=32, n_layers=2, n_heads=4, d_model=48, tie_weights=False,
               rng=np.random.default_rng(seed), **kw)


def logits_both_ways(model, ids):
    """(logits of ids without the cache, the same logits token by token through the KV cache)."""
    full = model(ids)
    model.clear_cache()
    caches = model.new_kv_caches()
    steps = np.concatenate([model(ids[:, t:t + 1], kv_caches=caches) for t in range(ids.shape[1])], axis=1)
    return full, steps


@pytest.mark.parametrize("build", [speedrun_like, gpt2_like])
@pytest.mark.parametrize("group_size,bound", [(None, 0.02), (16, 0.01)])
def test_quantized_logits_stay_close_to_float(build, group_size, bound):
    """Error bound: max |Δlogits| <= bound × max |logits|, with and without the cache: 2% for int8 per channel,
    1% per group of 16 (measured on these random-weight models: 0.23% and 0.66% per channel, 0.18% and 0.49%
    per group of 16)."""
    model = build().eval()
    ids = np.random.default_rng(1).integers(0, model.vocab_size, (2, 12))
    before = logits_both_ways(model, ids)
    quantize_model(model, group_size=group_size)
    after = logits_both_ways(model, ids)
    for a, b in zip(after, before):
        assert rel_err(a, b) < bound
    np.testing.assert_allclose(after[1], after[0], rtol=1e-4, atol=1e-5)     # the cache changes nothing


def with_dequantized_weights(model, quantized):
    """``model`` (a float copy of ``quantized`` before quantizing) with each Linear's weight replaced by the
    weight its int8 twin multiplies by (Ŵ = s · q): the reference the int8 model must equal to rounding. A tied
    output layer gets a weight of its own, as its int8 twin has: the embedding keeps the float table."""
    layers = dict(quantized.named_modules())
    for name, m in model.named_modules():
        if isinstance(m, Linear):
            m.weight = Parameter(layers[name].dequantized_weight())
    return model


GQA_TIED = dict(n_layers=2, n_heads=6, n_kv_heads=2, d_model=48)      # 3 query heads share each key/value head


@pytest.mark.parametrize("build,group_size", [(speedrun_like, None), (speedrun_like, 16), (gpt2_like, None),
                                              (lambda seed=0: speedrun_like(seed, **GQA_TIED), 8)])
def test_gpt_logits_equal_the_dequantized_reference(build, group_size):
    """Every linear layer, the attention's qkv_proj and out_proj included, is int8, and the int8 GPT's logits
    (the fast kernel, with the KV cache and without) equal the float GPT's with Ŵ = s · q in its layers."""
    model = build().eval()
    report = quantize_model(model, group_size=group_size)
    names = {n for n, m in build().named_modules() if isinstance(m, Linear)}
    assert sorted(report.quantized) == sorted(names) and not report.kept_float
    assert isinstance(model.blocks[0].self_attn.qkv_proj, QuantizedQKVProjection)
    assert isinstance(model.blocks[0].self_attn.out_proj, QuantizedLinear)
    reference = with_dequantized_weights(build().eval(), model)
    ids = np.random.default_rng(5).integers(0, model.vocab_size, (2, 10))
    for got, want in zip(logits_both_ways(model, ids), logits_both_ways(reference, ids)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_tied_output_layer_gets_its_own_int8_table():
    """A tied lm_head is quantized; the embedding lookup keeps reading the float table."""
    model = speedrun_like()
    table = model.tok_emb.weight.data.copy()
    assert model.lm_head.weight is model.tok_emb.weight
    quantize_model(model)
    assert isinstance(model.lm_head, QuantizedLinear) and model.tok_emb.weight.data.dtype == np.float32
    np.testing.assert_array_equal(model.tok_emb.weight.data, table)
    np.testing.assert_allclose(model.lm_head.dequantized_weight(), table, atol=np.abs(table).max() / 254 * 1.0001)


def test_encoder_decoder_and_classifier_are_quantized_whole():
    """Cross-attention projects the query and the memory with different rows of its int8 QKV projection (and
    the cached decoder reuses the memory's keys); a classifier's layers are all int8 too: both equal their
    float models with the dequantized weights."""
    def translator():
        return Transformer(12, 12, d_model=16, n_heads=4, n_layers=2, d_ff=24, dropout=0.0,
                           rng=np.random.default_rng(0)).eval()

    model = translator()
    report = quantize_model(model, group_size=8)
    assert not report.kept_float and isinstance(model.decoder.layers[0].cross_attn.qkv_proj, QuantizedQKVProjection)
    reference = with_dequantized_weights(translator(), model)
    src, tgt = np.array([[3, 4, 5, 6, 7]]), np.array([[1, 5, 6, 7, 2]])
    np.testing.assert_allclose(model(src, tgt), reference(src, tgt), rtol=1e-4, atol=1e-5)
    memory, caches = model.encode(src), model.new_caches()
    steps = np.concatenate([model.decode(tgt[:, t:t + 1], memory, caches=caches) for t in range(5)], axis=1)
    np.testing.assert_allclose(steps, reference(src, tgt), rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="inference only"):
        model.backward(np.ones_like(steps))

    def classifier():
        return EncoderClassifier(20, 3, max_len=9, d_model=16, n_heads=2, n_layers=2, dropout=0.0,
                                 rng=np.random.default_rng(1)).eval()

    model = classifier()
    assert quantize_model(model).quantized
    ids = np.array([[2, 3, 4, 5, 0, 0]])
    np.testing.assert_allclose(model(ids), with_dequantized_weights(classifier(), model)(ids), rtol=1e-4, atol=1e-5)


def test_every_quantized_layer_takes_effect():
    """Swapped but not used: corrupting one quantized layer's weights must change the logits, with the cache
    and without it."""
    model = speedrun_like().eval()
    report = quantize_model(model)
    ids = np.random.default_rng(2).integers(0, 65, (1, 6))
    base = logits_both_ways(model, ids)
    for name in report.quantized:
        q = model.get_submodule(name).qweight
        saved = q.copy()
        q[...] = np.random.default_rng(3).integers(-127, 128, q.shape)
        changed = logits_both_ways(model, ids)
        q[...] = saved
        for a, b in zip(changed, base):
            assert rel_err(a, b) > 1e-3, f"{name} was swapped but the model does not use it"


def test_a_shared_layer_is_quantized_once():
    class Shared(Module):
        def __init__(self):
            super().__init__()
            self.a = Linear(4, 4, rng=np.random.default_rng(0))
            self.b = self.a

        def forward(self, x):
            return self.b(self.a(x))

    model = Shared()
    report = quantize_model(model)
    assert report.quantized == ["a"] and model.a is model.b and isinstance(model.a, QuantizedLinear)


def test_weights_are_int8_in_memory():
    """Count the bytes: each quantized layer's float32 weight (4 bytes a weight) becomes 1 byte a weight plus
    4 bytes per scale; the tied output layer adds an int8 copy of the table while the embedding stays float."""
    for build, tied in ((gpt2_like, False), (speedrun_like, True)):
        model = build()
        layers = dict(model.named_modules())
        before = weight_bytes(model)
        assert before == sum(p.data.nbytes for p in model.parameters())
        report = quantize_model(model, group_size=16)
        layers_after = dict(model.named_modules())
        change = 0
        for name in report.quantized:
            N, K = layers[name].weight.shape
            q = layers_after[name]
            assert q.qweight.dtype == np.int8 and q.qweight.shape == (N, K) and q.scales.dtype == np.float32
            freed = 0 if (tied and name == "lm_head") else 4 * N * K
            change += N * K + 4 * N * -(-K // 16) - freed
        assert report.bytes_before == before and report.bytes_after == weight_bytes(model) == before + change
        assert ("lm_head" in report.quantized) and (model.tok_emb.weight.dtype == np.float32)


def test_greedy_generation_with_the_kv_cache():
    """The int8 model generates the same tokens and logits with the cache as without it, and mostly the float
    model's tokens (a near tie may flip one)."""
    model = gpt2_like()
    prompt = np.random.default_rng(4).integers(0, 50, (2, 5))
    float_tokens = model.generate(prompt, 12, greedy=True)
    quantize_model(model)
    cached, logits_c = model.generate(prompt, 12, greedy=True, return_logits=True)
    plain, logits_p = model.generate(prompt, 12, greedy=True, use_cache=False, return_logits=True)
    np.testing.assert_array_equal(cached, plain)
    np.testing.assert_allclose(logits_c, logits_p, rtol=1e-4, atol=1e-5)
    assert (cached == float_tokens).mean() > 0.8


def test_skip_and_modes_are_kept():
    model = gpt2_like(dropout=0.1).train()
    report = quantize_model(model, skip=("lm_head", "blocks.1.*"))
    assert report.kept_float["lm_head"] == "skip" and "blocks.1.ff.linear1" in report.kept_float
    assert "blocks.0.ff.linear1" in report.quantized and isinstance(model.lm_head, Linear)
    assert all(m.training for m in model.modules())
    assert "int8 (per channel)" in str(report) and "kept float" in str(report)


def test_the_report_says_where_a_group_is_a_whole_row():
    """A group size at least a layer's inputs is one scale per row there (``group_width``): the report says so,
    for every layer or for those it concerns."""
    widths = {n: m.in_features for n, m in gpt2_like().named_modules() if isinstance(m, Linear)}
    widest, narrowest = max(widths.values()), min(widths.values())
    assert str(quantize_model(gpt2_like(), group_size=widest)).startswith(
        f"int8 (groups of {widest}, that is one per row: no layer has more inputs)")
    some = quantize_model(gpt2_like(), group_size=narrowest)
    assert sorted(some.whole_rows) == sorted(n for n, w in widths.items() if w <= narrowest) != sorted(widths)
    assert f"(groups of {narrowest}; one per row in the {len(some.whole_rows)} layers of at most" in str(some)
    assert quantize_model(gpt2_like(), group_size=narrowest // 2).whole_rows == []


def test_generate_command_quantize(tmp_path, run_cli, cli_error, monkeypatch):
    """`numformer generate RUN --quantize int8` generates and says what it quantized; --group-size needs it."""
    from numformer.data.text import read_corpus
    from conftest import tiny_text_toml

    (tmp_path / "small.txt").write_text(read_corpus("")[:2000])
    (tmp_path / "t.toml").write_text(tiny_text_toml(tmp_path / "small.txt", max_steps=2))
    assert run_cli("train", tmp_path / "t.toml", "--out", tmp_path / "run", "--quiet")[0] == 0
    rc, out, err = run_cli("generate", tmp_path / "run", "--prompt", "The", "--max-new-tokens", "5", "--greedy",
                           "--quantize", "int8", "--group-size", "8")
    assert rc == 0 and out.startswith("The") and len(out.rstrip("\n")) >= 3
    assert "int8 (groups of 8)" in err
    # on two threads the int8 products go through a worker process: the same text
    from numformer.quantize import processes

    pools = []
    monkeypatch.setitem(_runtime._threads, "n", 2)
    monkeypatch.setattr(processes, "MIN_PIECE_WEIGHTS", 1)
    monkeypatch.setattr(processes.WorkerProcesses, "close", lambda self, close=processes.WorkerProcesses.close:
                        (pools.append(self._job), close(self)))
    assert run_cli("generate", tmp_path / "run", "--prompt", "The", "--max-new-tokens", "5", "--greedy",
                   "--quantize", "int8", "--group-size", "8")[1] == out
    assert len(pools) == 1 and pools[0] > 0
    assert "--group-size" in cli_error("generate", tmp_path / "run", "--group-size", "8")
    rc, _, err = run_cli("generate", tmp_path / "run", "--prompt", "\u00e9", "--quantize", "int8")
    assert rc == 2 and "not in the vocabulary" in err and "a trained model's vocabulary is fixed" in err
    assert "Traceback" not in err
    assert "--group-size must be a positive number of inputs per scale" in cli_error(
        "generate", tmp_path / "run", "--quantize", "int8", "--group-size", "0")
    assert f"adapter folder {tmp_path / 'nope'} does not exist" in cli_error(
        "generate", tmp_path / "run", "--adapter", tmp_path / "nope")


def test_a_lora_model_is_refused_until_merged():
    """quantize_model refuses a model with LoRA adapters (its adapted layers would stay float, unsaid); merged,
    every linear layer is int8 (`--quantize int8` merges first: tests/test_loading_memory.py)."""
    import copy

    from numformer.lora import add_lora, lora_adapters, merge_lora

    model = add_lora(gpt2_like(), r=4, target_modules=("c_attn", "c_fc"), rng=np.random.default_rng(1))
    for _, adapter, _, _ in lora_adapters(model):
        adapter.lora_B.data[...] = np.random.default_rng(2).standard_normal(adapter.lora_B.data.shape)
    with pytest.raises(ValueError, match=r"merge them into their layers first \(numformer.lora.merge_lora"):
        quantize_model(copy.deepcopy(model))
    merged = merge_lora(copy.deepcopy(model))
    report = quantize_model(merged)
    assert not getattr(merged, "lora_config", None) and len(report.quantized) == 2 * 4 + 1
    assert sum(isinstance(m, QuantizedLinear) for m in merged.modules()) == len(report.quantized)
