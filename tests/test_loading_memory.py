"""Loading in the model's own memory: a run folder's weights read one tensor at a time (their checksum still
checked), and int8 quantization while loading (``numformer.quantize.LayerQuantizer``): each linear layer
quantized as soon as its weights are written and its float weights released, the result bit for bit
``quantize_model``'s after a float load, for Hugging Face folders and run folders, and in ``generate`` /
``chat --quantize int8``."""
from __future__ import annotations

import copy
import json
import weakref

import numpy as np
import pytest

from numformer import GPT, safetensors_reader
from numformer.interop import hf, sources
from numformer.lora import add_lora, lora_adapters, merge_lora
from numformer.nn import Linear
from numformer.quantize import LayerQuantizer, QuantizedLinear, quantize_model, weight_bytes
from numformer.run_files import CHECKSUM, load_metadata, load_model_weights, save_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from test_interop_hf import SHAPES, make_hf, save_tokenizer  # noqa: E402


def tiny_gpt(seed=0, **kw):
    return GPT(vocab_size=50, block_size=16, n_layers=2, n_heads=2, d_model=16, tie_weights=False,
               rng=np.random.default_rng(seed), **kw)


def watch_reads(monkeypatch, on_read):
    """Call ``on_read()`` each time a stored tensor starts being read (whole, or a piece at a time)."""
    real_read, real_chunks = safetensors_reader.StoredTensor.read, safetensors_reader.StoredTensor._chunks

    def read(self):
        on_read()
        return real_read(self)

    def chunks(self):
        on_read()
        yield from real_chunks(self)

    monkeypatch.setattr(safetensors_reader.StoredTensor, "read", read)
    monkeypatch.setattr(safetensors_reader.StoredTensor, "_chunks", chunks)


def assert_same_int8_model(model, expected):
    """The same layers (int8 ones where expected has them, with equal int8 weights and scales) and weights."""
    got, want = dict(model.named_modules()), dict(expected.named_modules())
    assert list(got) == list(want)
    for name, m in want.items():
        assert type(got[name]) is type(m), name
        if isinstance(m, QuantizedLinear):
            np.testing.assert_array_equal(got[name].qweight, m.qweight)
            np.testing.assert_array_equal(got[name].scales, m.scales)
    for (name, p), (_, q) in zip(model.named_parameters(), expected.named_parameters(), strict=True):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)


# -- run folders: one tensor at a time -----------------------------------------------------------------------
def test_a_model_file_is_read_one_tensor_at_a_time_and_checked_first(tmp_path, monkeypatch):
    """load_model_weights checks names and shapes before reading any tensor (a misshapen file is refused with
    none read), then reads each tensor straight into its parameter, CHUNK_BYTES at a time (no whole copy of
    a tensor is made). The checksum is still checked: a changed byte is refused naming the file."""
    saved = tiny_gpt(seed=1)
    save_model(tmp_path / "model.safetensors", saved, {"step": 3})
    monkeypatch.setattr(safetensors_reader, "CHUNK_BYTES", 256)
    chunks = []
    real_decoded = safetensors_reader._decoded
    monkeypatch.setattr(safetensors_reader, "_decoded", lambda raw, *a: chunks.append(len(raw)) or
                        real_decoded(raw, *a))
    monkeypatch.setattr(safetensors_reader.StoredTensor, "read", lambda self: pytest.fail("a whole tensor read"))
    with pytest.raises(ValueError, match="shape mismatch"):
        load_model_weights(tmp_path / "model.safetensors", tiny_gpt(d_ff=24))
    assert chunks == []
    model = tiny_gpt(seed=2)
    assert load_model_weights(tmp_path / "model.safetensors", model)["step"] == "3"
    assert max(chunks) <= 256 and sum(chunks) == sum(p.data.nbytes for p in saved.parameters())
    for (name, p), (_, q) in zip(model.named_parameters(), saved.named_parameters(), strict=True):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
    raw = bytearray((tmp_path / "model.safetensors").read_bytes())
    raw[-3] ^= 0x40                                                  # a byte of the last tensor
    (tmp_path / "bad.safetensors").write_bytes(bytes(raw))
    assert CHECKSUM in load_metadata(tmp_path / "bad.safetensors", "model file")
    with pytest.raises(ValueError, match=r"bad\.safetensors is corrupt: its tensors' bytes changed"):
        load_model_weights(tmp_path / "bad.safetensors", tiny_gpt())


def test_a_truncated_model_file_is_named(tmp_path):
    save_model(tmp_path / "model.safetensors", tiny_gpt(), {})
    raw = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[:-100])
    with pytest.raises(ValueError, match=r"cut\.safetensors is corrupt or truncated"):
        load_model_weights(tmp_path / "cut.safetensors", tiny_gpt())


def test_a_checkpoint_is_resumed_one_tensor_at_a_time(tmp_path, monkeypatch):
    """load_checkpoint checks the checksum a piece of the file at a time, then reads each tensor as the model
    and the optimizer take it: what it holds beyond the optimizer state it restores is one tensor, not the
    file (a whole read of the checkpoint would be three times the model's weights)."""
    import tracemalloc

    from numformer.optim import AdamW
    from numformer.run_files import load_checkpoint, save_checkpoint

    saved = GPT(vocab_size=200, block_size=16, n_layers=4, n_heads=2, d_model=128, tie_weights=False,
                rng=np.random.default_rng(1))
    optimizer = AdamW(saved.parameters(), lr=1e-3)
    for p in saved.parameters():
        p.grad = np.full_like(p.data, 0.5)
    optimizer.step()
    save_checkpoint(tmp_path / "checkpoint.safetensors", saved, optimizer, {"step": 1})
    weights = sum(p.data.nbytes for p in saved.parameters())
    largest = max(p.data.nbytes for p in saved.parameters())
    assert largest * 8 < weights
    model = GPT(vocab_size=200, block_size=16, n_layers=4, n_heads=2, d_model=128, tie_weights=False,
                rng=np.random.default_rng(2))
    resumed = AdamW(model.parameters(), lr=1e-3)
    monkeypatch.setattr(safetensors_reader, "CHUNK_BYTES", 4096)
    tracemalloc.start()
    try:
        state = load_checkpoint(tmp_path / "checkpoint.safetensors", model, resumed)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert state == {"step": 1}
    assert kept >= 2 * weights                                       # the two moments it restored
    assert peak - kept < 2 * largest + 3 * 4096
    for (name, p), (_, q) in zip(model.named_parameters(), saved.named_parameters(), strict=True):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
    for p, q in zip(model.parameters(), saved.parameters(), strict=True):
        np.testing.assert_array_equal(resumed.state[id(p)]["exp_avg"], optimizer.state[id(q)]["exp_avg"])


# -- quantizing while loading ----------------------------------------------------------------------------------
def quantizing_reads(monkeypatch):
    """Watch a load with a LayerQuantizer: at each tensor read, (float linear weights alive, layers quantized),
    against the linear layers the model had."""
    state = {"refs": [], "seen": []}
    real_start = LayerQuantizer.start

    def start(self, model):
        real_start(self, model)
        state["quantizer"] = self
        embeddings = {id(p) for name, m in model.named_modules() if not isinstance(m, Linear)
                      for p in m._parameters.values() if p is not None}
        state["refs"] = [weakref.ref(m.weight.data) for m in {id(m): m for m in model.modules()
                                                              if isinstance(m, Linear)}.values()
                         if id(m.weight) not in embeddings]
        return self

    monkeypatch.setattr(LayerQuantizer, "start", start)
    watch_reads(monkeypatch, lambda: state["refs"] and state["seen"].append(
        (sum(r() is not None for r in state["refs"]), len(state["quantizer"].report.quantized))))
    return state


def check_released_as_quantized(state, tied):
    """At every tensor read, each layer quantized so far has released its float weight (float weights alive +
    layers quantized = all; one more once a tied output layer is quantized, whose float table stays the
    embedding's), and layers were quantized during the load, not all at its end."""
    n = len(state["refs"])
    assert state["seen"]
    for alive, done in state["seen"]:
        assert alive + done in ((n, n + 1) if tied else (n,)), (alive, done, n)
    assert max(done for _, done in state["seen"]) >= n - 2


@pytest.mark.parametrize("group_size", [None, 8])
@pytest.mark.parametrize("tie", [True, False])
def test_a_hugging_face_model_is_quantized_as_it_loads(tmp_path, monkeypatch, group_size, tie):
    """load_pretrained(quantize=LayerQuantizer(...)) gives quantize_model's model after a float load, bit for
    bit (same report); at every tensor read each layer already quantized has released its float weight, and
    layers were quantized during the load."""
    folder, _ = make_hf(tmp_path, **SHAPES["n_inner"], tie_word_embeddings=tie)
    expected, _ = hf.load_pretrained(folder)
    report = quantize_model(expected, group_size=group_size)
    state = quantizing_reads(monkeypatch)
    quantizer = LayerQuantizer(group_size=group_size)
    model, _ = hf.load_pretrained(folder, quantize=quantizer)
    assert_same_int8_model(model, expected)
    assert str(quantizer.report) == str(report) and quantizer.report.quantized == report.quantized
    assert quantizer.report.bytes_after == weight_bytes(model) == report.bytes_after
    check_released_as_quantized(state, tie)


def test_expected_bytes_are_the_quantized_model_s(tmp_path):
    for tie in (True, False):
        for group_size in (None, 8):
            model = GPT(vocab_size=50, block_size=16, n_layers=2, n_heads=2, d_model=16, tie_weights=tie,
                        rng=np.random.default_rng(0))
            quantizer = LayerQuantizer(group_size=group_size).start(model)
            expected = quantizer.expected_bytes()
            assert quantizer.finish().bytes_after == weight_bytes(model) == expected


def test_a_quantized_load_is_checked_against_the_int8_model_s_memory(tmp_path, monkeypatch):
    """With memory for the int8 model (and its largest float layer, held until quantized) but not the float
    one, a quantized load goes ahead and a float one is refused; with less than the int8 model needs, the
    error says linear layers are counted in int8. The reading's temporaries are the same for both."""
    from numformer import _platform

    folder, _ = make_hf(tmp_path, **SHAPES["n_inner"])
    model, _ = hf.load_pretrained(folder)
    largest_layer = max(m.weight.data.nbytes for m in model.modules() if isinstance(m, Linear)
                        and m.weight is not model.tok_emb.weight)
    with_int8 = LayerQuantizer().finish(copy.deepcopy(model)).bytes_after + largest_layer
    float_need = weight_bytes(model)
    assert with_int8 < float_need
    from numformer.interop.hf import checkpoints

    stored = hf.read_safetensors(folder, lazy=True)
    transposed = checkpoints.transposed_tensors(hf.family("gpt2"), model.config, stored)
    reading = checkpoints.memory_needed(stored, np.float32, transposed=transposed)[0] - float_need
    with_int8 += reading
    probe = LayerQuantizer()
    monkeypatch.setattr(_platform, "available_memory", lambda: with_int8)
    with pytest.raises(ValueError, match=r"weights in float32\), but this machine has"):
        hf.load_pretrained(folder)
    hf.load_pretrained(folder, quantize=probe)
    monkeypatch.setattr(_platform, "available_memory", lambda: with_int8 - 1)
    with pytest.raises(ValueError, match=r"weights in float32, linear layers in int8\), but this machine has"):
        hf.load_pretrained(folder, quantize=LayerQuantizer())


def test_a_run_folder_is_quantized_as_it_loads(tmp_path, monkeypatch, run_cli):
    """sources.load(run, quantize=...) gives quantize_model's model after a float load, bit for bit, releasing
    each float layer as it is quantized; a LoRA run is refused before any weight is read."""
    from conftest import tiny_text_toml
    from numformer.data.text import read_corpus

    (tmp_path / "small.txt").write_text(read_corpus("")[:2000])
    (tmp_path / "t.toml").write_text(tiny_text_toml(tmp_path / "small.txt", max_steps=2))
    assert run_cli("train", tmp_path / "t.toml", "--out", tmp_path / "run", "--quiet")[0] == 0
    expected, _ = sources.load(tmp_path / "run")
    report = quantize_model(expected, group_size=8)
    state = quantizing_reads(monkeypatch)
    quantizer = LayerQuantizer(group_size=8)
    model, tokenizer = sources.load(tmp_path / "run", quantize=quantizer)
    assert tokenizer is not None and quantizer.report.quantized == report.quantized
    assert_same_int8_model(model, expected)
    check_released_as_quantized(state, model.config.tie_weights)
    # a run folder is checked against the memory left too, before any weight is read
    from numformer import _platform

    monkeypatch.setattr(_platform, "available_memory", lambda: 1 << 20)
    state["seen"].clear()
    with pytest.raises(ValueError, match=r"run needs about .* GiB of memory \([\d,]+ weights in float32\), but this"):
        sources.load(tmp_path / "run")
    with pytest.raises(ValueError, match=r"[\d,]+ weights in float32, linear layers in int8\), but this machine"):
        sources.load(tmp_path / "run", quantize=LayerQuantizer())
    assert state["seen"] == []


def test_generate_quantizes_while_loading_and_merges_an_adapter_first(tmp_path, monkeypatch, capsys):
    """`generate --quantize int8` on a Hugging Face folder quantizes while loading (the float model is never
    whole in memory); with --adapter the adapters are merged first, then every linear
    layer quantized: the merged model's int8 logits."""
    from numformer.commands import generate
    from numformer.interop.peft import save_adapter

    folder, _ = make_hf(tmp_path, **SHAPES["n_inner"])
    save_tokenizer(folder)
    state = quantizing_reads(monkeypatch)
    model, _ = generate.load_generator(folder, quantize=LayerQuantizer(group_size=8))
    assert "int8 (groups of 8)" in capsys.readouterr().err
    check_released_as_quantized(state, model.config.tie_weights)
    assert not any(isinstance(m, Linear) for m in model.modules())
    base, _ = hf.load_pretrained(folder)
    adapted = add_lora(base, r=2, target_modules=("c_attn", "c_fc"), rng=np.random.default_rng(1))
    for _, adapter, _, _ in lora_adapters(adapted):
        adapter.lora_B.data[...] = np.random.default_rng(2).standard_normal(adapter.lora_B.data.shape)
    save_adapter(adapted, tmp_path / "adapter")
    expected = merge_lora(copy.deepcopy(adapted))
    quantize_model(expected)
    model, _ = generate.load_generator(folder, tmp_path / "adapter", quantize=LayerQuantizer())
    assert "merged into their layers before quantizing" in capsys.readouterr().err
    assert not getattr(model, "lora_config", None)
    assert not any(isinstance(m, Linear) for m in model.modules())
    ids = np.random.default_rng(3).integers(0, model.vocab_size, (2, 9))
    np.testing.assert_allclose(model(ids), expected(ids), rtol=1e-5, atol=1e-5)


def test_a_lora_model_is_refused_by_the_layer_quantizer():
    model = add_lora(tiny_gpt(), r=2, rng=np.random.default_rng(1))
    with pytest.raises(ValueError, match=r"merge them into their layers first"):
        LayerQuantizer().start(model)
    with pytest.raises(ValueError, match=r"needs the model"):
        LayerQuantizer().finish()
    assert json.dumps(LayerQuantizer().finish(tiny_gpt()).quantized)


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_model_built_for_loading_takes_no_memory_until_written(tmp_path):
    """Under nn.init.skipped() (how every load builds its model) the parameters are zeros the operating system
    maps only when written, also with numformer's malloc settings (set_fast_runtime: arrays up to 32 MiB from
    the heap): building a 100 MB model adds a few MB of resident memory, writing one matrix adds its bytes,
    and freeing it returns them."""
    import subprocess
    import sys

    script = """
import numpy as np, numformer
from numformer import GPT
from numformer.nn import init
numformer.set_fast_runtime()
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
before = resident()
with init.skipped():
    model = GPT(vocab_size=4096, block_size=64, n_layers=8, n_heads=8, d_model=512, rng=np.random.default_rng(0))
built = resident()
w = model.blocks[0].ff.linear1.weight
w.data[...] = 1.0
written = resident()
model.blocks[0].ff.linear1 = numformer.nn.Linear(1, 1)
del w
freed = resident()
print(model.num_parameters() * 4, built - before, written - built, model.blocks[1].ff.linear1.weight.data.nbytes,
      freed - written)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    params_bytes, built, written, matrix_bytes, freed = map(int, out)
    assert params_bytes > 100e6 and built < 0.05 * params_bytes, (params_bytes, built)
    assert 0.9 * matrix_bytes <= written <= 1.2 * matrix_bytes + (1 << 20), (written, matrix_bytes)
    assert freed < -0.5 * matrix_bytes, (freed, matrix_bytes)


def test_import_hf_and_init_from_refuse_a_model_too_large_before_building_it(tmp_path, monkeypatch, run_cli):
    """`numformer import-hf` and a run's [model] init_from read a source's weights into a model they build
    first: neither checked the memory left, so a model too large for the machine ended with the operating
    system killing the process. Now each is one error before the model is built and before anything is
    written."""
    from numformer import _platform, models
    from numformer.train import Trainer, build

    folder, _ = make_hf(tmp_path, n_embd=16, n_layer=1, n_head=2)
    save_tokenizer(folder)
    (tmp_path / "text.txt").write_text("hello world, the king and the queen. " * 50, encoding="utf-8")
    built = []
    real_build = models.build_model
    for module in (models, build):
        monkeypatch.setattr(module, "build_model", lambda *a, **k: built.append(1) or real_build(*a, **k))
    monkeypatch.setattr(_platform, "available_memory", lambda: 1 << 16)
    rc, _, err = run_cli("import-hf", folder, "--out", tmp_path / "run", "--data", tmp_path / "text.txt")
    assert rc == 2 and f"{folder} needs about" in err and "weights in float32), but this machine has" in err, err
    assert not (tmp_path / "run").exists() and built == []
    config = {"model": {"init_from": str(folder)},
              "data": {"task": "text", "path": str(tmp_path / "text.txt"), "block_size": 8},
              "train": {"max_steps": 1, "batch_size": 2, "processes": 1}}
    with pytest.raises(ValueError, match=r"needs about .* weights in float32\), but this machine has"):
        Trainer(config, tmp_path / "tuned", quiet=True).train()
    assert built == []
    monkeypatch.undo()
    assert run_cli("import-hf", folder, "--out", tmp_path / "run", "--data", tmp_path / "text.txt")[0] == 0
    source = tmp_path / "run"
    monkeypatch.setattr(_platform, "available_memory", lambda: 1 << 16)
    with pytest.raises(ValueError, match=rf"{source} needs about"):          # a run folder as the source
        Trainer({**config, "model": {"init_from": str(source)}}, tmp_path / "tuned2", quiet=True).train()


def test_training_refuses_a_model_whose_gradients_and_optimizer_state_do_not_fit(tmp_path, monkeypatch):
    """Training adds a gradient and the optimizer's buffers to every trained parameter (AdamW: two moments),
    allocated at the first step: a model that fits but cannot be trained ended with the operating system
    killing the process there. Now one error before anything is written; frozen parameters (LoRA's base)
    and SGD without momentum (no buffer) count less."""
    from numformer import _platform
    from numformer.train import Trainer
    from numformer.train.build import make_optimizer, training_memory_needed

    (tmp_path / "small.txt").write_text("the king and the queen walk to the castle\n" * 40, encoding="utf-8")
    config = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
              "data": {"task": "text", "path": str(tmp_path / "small.txt"), "block_size": 16},
              "train": {"max_steps": 1, "batch_size": 2, "processes": 1}}
    monkeypatch.setattr(_platform, "available_memory", lambda: 1 << 10)
    with pytest.raises(ValueError, match=rf"^training {tmp_path / 'run'} needs about .* GiB of memory \(the "
                                         rf"gradients and optimizer state of [\d,]+ trained parameters\), but"):
        Trainer(config, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()
    monkeypatch.undo()
    model = tiny_gpt()
    weights = sum(p.data.nbytes for p in model.parameters())
    train = {"weight_decay": 0.1, "no_decay": [], "lr": 1e-3, "beta1": 0.9, "beta2": 0.99, "eps": 1e-8,
             "momentum": 0.0, "nesterov": False}
    assert training_memory_needed(make_optimizer(model, {**train, "optimizer": "adamw"}))[0] == 3 * weights
    assert training_memory_needed(make_optimizer(model, {**train, "optimizer": "sgd"}))[0] == weights
    assert training_memory_needed(make_optimizer(model, {**train, "optimizer": "sgd", "momentum": 0.9}))[0] \
        == 2 * weights
    add_lora(model, r=2, alpha=4, rng=0)
    adapters = sum(p.data.nbytes for p in model.parameters() if p.requires_grad)
    assert 0 < adapters < weights
    assert training_memory_needed(make_optimizer(model, {**train, "optimizer": "adamw"}))[0] == 3 * adapters


def test_a_source_run_without_model_file_is_named_once_when_fine_tuned(tmp_path, capsys):
    """A source run whose weights are its checkpoint's (no model.safetensors) is named by one note line: the
    memory check before the model is built reads the weights' header without a note of its own."""
    from numformer.train import Trainer

    config = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
              "data": {"task": "copy", "length": 4},
              "train": {"max_steps": 2, "batch_size": 4, "eval_every": 2, "processes": 1}}
    Trainer(config, tmp_path / "source", quiet=True).train()
    (tmp_path / "source" / "model.safetensors").unlink()
    capsys.readouterr()
    Trainer({**config, "model": {"init_from": str(tmp_path / "source")}}, tmp_path / "tuned", quiet=True)
    assert capsys.readouterr().err.count("has no model.safetensors; using the last weights") == 1
