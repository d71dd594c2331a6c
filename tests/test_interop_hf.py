"""Hugging Face GPT-2 in and out (numformer.interop.hf): parity with transformers, export, run folders.

Every model here is a random-weight GPT-2 made with transformers (GPT2Config + save_pretrained
into a temporary folder); nothing is downloaded.
"""
from __future__ import annotations

import fnmatch
import json
import re

import numpy as np
import pytest

from numformer import ops
from numformer.interop import hf
from numformer.models import GPT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

SHAPES = {
    "default_ff": dict(n_embd=16, n_layer=2, n_head=2),
    "n_inner": dict(n_embd=24, n_layer=3, n_head=4, n_inner=40),
    "untied_relu": dict(n_embd=16, n_layer=1, n_head=4, tie_word_embeddings=False, activation_function="relu"),
    "gelu_exact_eps": dict(n_embd=8, n_layer=2, n_head=1, activation_function="gelu", layer_norm_epsilon=1e-6),
    "relu2": dict(n_embd=16, n_layer=2, n_head=2, activation_function="relu2"),
}
VOCAB, N_POS, EOS = 300, 48, 0
TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
        "must be in want of a wife. However little known the feelings or views of such a man may be ") * 4


def gpt2_config(**kw):
    return transformers.GPT2Config(**{"vocab_size": VOCAB, "n_positions": N_POS, "bos_token_id": EOS,
                                      "eos_token_id": EOS, **kw})


def make_hf(tmp_path, name="gpt2", torch_dtype=torch.float32, seed=0, **kw):
    """A random GPT-2 saved with save_pretrained into tmp_path/name; returns (folder, torch model in eval mode)."""
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(gpt2_config(**kw)).to(torch_dtype).eval()
    with torch.no_grad():                        # non-zero biases and norm weights, so every tensor matters
        for n, p in model.named_parameters():
            if n.endswith("bias") or "ln_" in n:
                p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path / name
    model.save_pretrained(folder)
    return folder, model


def save_tokenizer(folder, vocab_size=VOCAB):
    """A small GPT-2-style byte-level BPE (tokenizer.json, vocab.json, merges.txt); <|endoftext|> is id EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator([TEXT], trainer=trainer)
    assert tok.token_to_id("<|endoftext|>") == EOS
    tok.save(str(folder / "tokenizer.json"))
    tok.model.save(str(folder))                                    # vocab.json + merges.txt
    return tok


def loss_and_grads_torch(model, idx, targets):
    model.zero_grad()
    logits = model(torch.from_numpy(idx)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(targets).reshape(-1))
    loss.backward()
    return logits.detach().numpy(), float(loss.detach()), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


def loss_and_grads_numformer(model, idx, targets):
    model.zero_grad()
    logits = model(idx)
    loss, cache = ops.cross_entropy_forward(logits, targets)
    model.backward(ops.cross_entropy_backward(cache))
    return logits, float(loss), {n: p.grad for n, p in model.named_parameters()}


def transformers_greedy(tmodel, prompt, new_tokens):
    """``tmodel.generate``'s greedy continuation of ``prompt`` (B, T) by ``new_tokens`` tokens (no end token)."""
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        return tmodel.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                               attention_mask=torch.ones_like(ids), pad_token_id=EOS, eos_token_id=None).numpy()


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b) / (1.0 + np.abs(b))))


# -- import: parity with transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("tdtype,ndtype,tol", [(torch.float64, np.float64, 1e-9), (torch.float32, np.float32, 1e-4)])
def test_logits_and_every_gradient_match_transformers(tmp_path, shape, tdtype, ndtype, tol):
    folder, tmodel = make_hf(tmp_path, torch_dtype=tdtype, **SHAPES[shape])
    tmodel.train()                                       # dropout is off in numformer; compare without it
    for m in tmodel.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    model = hf.load_pretrained(folder, dtype=ndtype)[0].train()
    rng = np.random.default_rng(1)
    idx, targets = rng.integers(0, VOCAB, (3, 11)), rng.integers(0, VOCAB, (3, 11))
    t_logits, t_loss, t_grads = loss_and_grads_torch(tmodel, idx, targets)
    logits, loss, grads = loss_and_grads_numformer(model, idx, targets)
    assert rel_err(logits, t_logits) < tol
    assert abs(loss - t_loss) < tol
    fam = hf.FAMILIES["gpt2"]
    names = {row.hf[0]: (row.nf, row.transpose) for row in fam.tensors(model.config)}
    assert set(names) == set(t_grads), "every transformers parameter has a numformer counterpart"
    for hf_name, g in t_grads.items():
        nf, transpose = names[hf_name]
        assert rel_err(grads[nf].T if transpose else grads[nf], g) < tol, hf_name


def test_config_is_mapped(tmp_path):
    folder, _ = make_hf(tmp_path, **SHAPES["n_inner"])
    model = hf.load_pretrained(folder)[0]
    cfg = model.config.to_dict()
    assert (cfg["d_model"], cfg["n_layers"], cfg["n_heads"], cfg["d_ff"], cfg["block_size"]) == (24, 3, 4, 40, N_POS)
    assert (cfg["activation"], cfg["bias"], cfg["tie_weights"], cfg["norm_first"]) == ("gelu_tanh", True, True, True)
    assert model.lm_head.weight is model.tok_emb.weight
    assert model.dtype == np.float32 and not model.training


def test_original_gpt2_file_layout_without_prefix_and_with_attention_buffers(tmp_path):
    """The hub's gpt2 files were saved from GPT2Model: no "transformer." prefix, and attn.bias buffers."""
    from safetensors.numpy import load_file, save_file

    folder, tmodel = make_hf(tmp_path, **SHAPES["default_ff"])
    state = {k.removeprefix("transformer."): v for k, v in load_file(folder / "model.safetensors").items()}
    state["h.0.attn.bias"] = np.tril(np.ones((1, 1, N_POS, N_POS), np.float32))
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    idx = np.arange(10)[None] % VOCAB
    np.testing.assert_allclose(hf.load_pretrained(folder)[0](idx), tmodel(torch.from_numpy(idx)).logits.detach().numpy(),
                               rtol=1e-4, atol=1e-5)


def test_greedy_generation_equals_transformers_generate(tmp_path):
    folder, tmodel = make_hf(tmp_path, **SHAPES["n_inner"])
    model = hf.load_pretrained(folder)[0]
    prompt = np.array([[5, 17, 3, 44, 9]])
    np.testing.assert_array_equal(model.generate(prompt, 20, greedy=True), transformers_greedy(tmodel, prompt, 20))


def test_seeded_sampling_repeats(tmp_path):
    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"])
    model = hf.load_pretrained(folder)[0]
    a = model.generate([1, 2, 3], 15, temperature=0.9, top_k=20, rng=7)
    b = model.generate([1, 2, 3], 15, temperature=0.9, top_k=20, rng=7)
    c = model.generate([1, 2, 3], 15, temperature=0.9, top_k=20, rng=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


# -- tokenizer --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("files", ["tokenizer.json", "vocab+merges"])
def test_tokenizer_matches_transformers(tmp_path, files):
    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"])
    save_tokenizer(folder)
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    if files == "vocab+merges":
        (folder / "tokenizer.json").unlink()
    model, tok = hf.load_pretrained(folder)
    text = "However little known,  the feelings of such a man!\nÜber 3 wives."
    assert tok.encode(text) == reference(text)["input_ids"]
    assert tok.decode(tok.encode(text)) == text
    assert tok.eos_id == EOS and tok.special_id("<eos>") == EOS and tok.vocab_size == VOCAB
    assert max(tok.encode(TEXT)) < model.vocab_size


# -- bad input ----------------------------------------------------------------------------------------------------
def test_missing_files(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        hf.load_pretrained(tmp_path)
    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"])
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="has no model.safetensors"):
        hf.load_pretrained(folder)
    with pytest.raises(ValueError, match="neither a folder nor a Hugging Face hub id"):
        hf.load_pretrained(tmp_path / "no such" / "folder here")


def test_pickle_only_folder_is_refused_with_the_conversion(tmp_path):
    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"])
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ValueError, match=r"pickle.*arbitrary code.*save_pretrained") as e:
        hf.load_pretrained(folder)
    assert "\n" not in str(e.value)


def test_shape_mismatch_names_the_tensor(tmp_path):
    folder, _ = make_hf(tmp_path, **SHAPES["n_inner"])
    cfg = json.loads((folder / "config.json").read_text())
    cfg["n_inner"] = 48
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"transformer\.h\.0\.mlp\.c_fc\.weight has shape \(24, 40\) but "
                                         r"config\.json implies \(24, 48\)"):
        hf.load_pretrained(folder)


def test_loading_checks_every_shape_before_reading_and_reads_one_tensor_at_a_time(tmp_path, monkeypatch):
    """load_pretrained checks the whole checkpoint from its headers before reading any tensor (a misshapen
    tensor is refused with none read), then copies it into the model one numformer tensor at a time, straight
    into its parameter a piece at a time (``StoredTensor.read_into``) or, for GPT-2's transposed Conv1D weights,
    read whole: when one is read, no tensor read for an earlier parameter is still held, so loading needs about
    the model's own memory; the loaded model is the one the eager reader gives."""
    import weakref

    from numformer import safetensors_reader

    folder, _ = make_hf(tmp_path, **SHAPES["n_inner"])
    real_read, reads, held = safetensors_reader.StoredTensor.read, [], []
    real_read_into, read_into = safetensors_reader.StoredTensor.read_into, []

    def read(self):
        a = real_read(self)
        held.append(sum(r() is not None for r in reads))          # earlier tensors still alive now
        reads.append(weakref.ref(a))
        return a

    monkeypatch.setattr(safetensors_reader.StoredTensor, "read", read)
    monkeypatch.setattr(safetensors_reader.StoredTensor, "read_into", lambda self, out, crc=0: read_into.append(
        (held.append(sum(r() is not None for r in reads)), self)) or real_read_into(self, out, crc))
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "n_inner": 48}))
    with pytest.raises(ValueError, match="shape mismatch"):
        hf.load_pretrained(folder)
    assert reads == read_into == []
    (folder / "config.json").write_text(json.dumps(cfg))
    model, _ = hf.load_pretrained(folder)
    n_reads, n_held = len(reads) + len(read_into), len(held)
    stored = hf.read_safetensors(folder)                           # every tensor read at once
    assert n_reads == len(stored) and reads and read_into and max(held[:n_held]) == 0
    expected = hf.to_numformer_state(hf.family("gpt2"), model.config, stored,
                                     {n: p.shape for n, p in model.named_parameters()})
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.data, expected[name])


def cfg_layers(folder):
    return json.loads((folder / "config.json").read_text())["n_layer"]


def test_a_checkpoint_larger_than_the_memory_left_is_refused_before_loading(tmp_path, monkeypatch):
    """With less memory left than the weights in float32 need (plus twice the largest tensor read whole to be
    transposed, GPT-2's Conv1D weights, and four pieces of the file read a piece at a time), one ValueError
    names both figures and the way round, before the model is built; NUMFORMER_NO_MEMORY_CHECK=1 loads it
    anyway, and so does an unknown figure (another platform)."""
    import re

    from numformer import _platform
    from numformer.interop.hf import checkpoints
    from numformer.safetensors_reader import CHUNK_BYTES

    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"])
    stored = hf.read_safetensors(folder)
    sizes = [int(np.prod(a.shape)) for a in stored.values()]
    conv1d_name = r"(transformer\.)?h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight"
    conv1d = [int(np.prod(a.shape)) for name, a in stored.items() if re.fullmatch(conv1d_name, name)]
    assert len(conv1d) == 4 * cfg_layers(folder)
    need = 4 * (sum(sizes) + 2 * max(conv1d)) + 4 * CHUNK_BYTES
    built = []
    monkeypatch.setattr(checkpoints, "GPT", lambda *a, **k: built.append(1) or GPT(*a, **k))
    monkeypatch.setattr(_platform, "available_memory", lambda: need - 1)
    with pytest.raises(ValueError, match=rf"needs about .* GiB of memory \({sum(sizes):,} weights in float32\), "
                                         r"but this machine has .* GiB left.*NUMFORMER_NO_MEMORY_CHECK=1"):
        hf.load_pretrained(folder)
    assert built == []
    hf.load_pretrained(folder, dtype=np.float16)                   # half the bytes: fits
    monkeypatch.setenv("NUMFORMER_NO_MEMORY_CHECK", "1")
    hf.load_pretrained(folder)
    monkeypatch.delenv("NUMFORMER_NO_MEMORY_CHECK")
    monkeypatch.setattr(_platform, "available_memory", lambda: need)
    hf.load_pretrained(folder)
    monkeypatch.setattr(_platform, "available_memory", lambda: None)
    hf.load_pretrained(folder)
    assert len(built) == 4


def test_a_loaded_model_draws_no_initial_weights(tmp_path, monkeypatch):
    """Inside ``nn.init.skipped()`` a model is built without drawing from its generator (its weights zeros until
    written), and load_pretrained builds its model so: the loaded weights are all the checkpoint's."""
    import contextlib

    from numformer.interop.hf import checkpoints
    from numformer.nn import init

    rng = np.random.default_rng(3)
    before = rng.bit_generator.state
    with init.skipped():
        model = GPT(vocab_size=50, block_size=8, n_layers=2, n_heads=2, d_model=8, rng=rng)
    assert rng.bit_generator.state == before
    assert all(not p.data.any() for n, p in model.named_parameters() if "norm" not in n and "ln" not in n)
    assert GPT(vocab_size=50, block_size=8, n_layers=2, n_heads=2, d_model=8, rng=rng).lm_head.weight.data.any()

    folder, torch_model = make_hf(tmp_path, **SHAPES["untied_relu"])
    entered, real_skipped = [], init.skipped

    @contextlib.contextmanager
    def skipped():
        with real_skipped():
            entered.append(1)
            yield

    monkeypatch.setattr(checkpoints.init, "skipped", skipped)
    loaded, _ = hf.load_pretrained(folder)
    assert entered == [1]
    ids = np.arange(12).reshape(2, 6)
    with torch.no_grad():
        want = torch_model(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(loaded(ids), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("meminfo, cgroup, expected", [
    ("MemTotal: 9000 kB\nMemAvailable: 1000 kB\nSwapFree: 24 kB\n", None, 1024 * 1024),
    ("MemAvailable: 1000 kB\n", None, 1000 * 1024),
    ("MemAvailable: 1000 kB\nSwapFree: 0 kB\n", ("500000", "100000"), 400000),
    ("MemAvailable: 1000 kB\nSwapFree: 0 kB\n", ("max", "100000"), 1000 * 1024),
    ("MemAvailable: 1000 kB\nSwapFree: 0 kB\n", ("1000", "5000"), 0),
    ("MemTotal: 9000 kB\n", None, None),
    (None, None, None),
])
def test_available_memory_reads_meminfo_and_the_cgroup_limit(tmp_path, monkeypatch, meminfo, cgroup, expected):
    from numformer import _platform

    if meminfo is not None:
        (tmp_path / "meminfo").write_text(meminfo)
    if cgroup is not None:
        (tmp_path / "memory.max").write_text(cgroup[0] + "\n")
        (tmp_path / "memory.current").write_text(cgroup[1] + "\n")
    monkeypatch.setattr(_platform, "MEMINFO", str(tmp_path / "meminfo"))
    monkeypatch.setattr(_platform, "CGROUP_MEMORY", str(tmp_path))
    assert _platform.available_memory() == expected


def test_missing_and_unexpected_tensors(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"])
    state = load_file(folder / "model.safetensors")
    state.pop("transformer.ln_f.bias")
    state["transformer.h.0.extra.weight"] = np.zeros(3, np.float32)
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing tensors \['transformer\.ln_f\.bias'\].*unexpected tensors "
                                         r"\['transformer\.h\.0\.extra\.weight'\]"):
        hf.load_pretrained(folder)


def test_unsupported_model_type_names_the_supported_ones(tmp_path):
    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"])
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "bert"}))
    from numformer.interop.hf.families import FAMILIES

    with pytest.raises(ValueError, match=re.escape(f"model_type 'bert' is not supported; numformer imports "
                                                   f"{sorted(FAMILIES)}")):
        hf.load_pretrained(folder)


@pytest.mark.parametrize("key,value,match", [
    ("scale_attn_by_inverse_layer_idx", True, "field scale_attn_by_inverse_layer_idx = True: "),
    ("scale_attn_weights", False, "field scale_attn_weights = False: "),
    ("activation_function", "silu", "field activation_function = 'silu': ")])
def test_unsupported_gpt2_options_are_refused(tmp_path, key, value, match):
    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"], **{key: value})
    with pytest.raises(ValueError, match=match):
        hf.load_pretrained(folder)


# -- the hub -----------------------------------------------------------------------------------------------------
def test_hub_id_goes_through_snapshot_download(tmp_path, monkeypatch):
    import huggingface_hub

    folder, tmodel = make_hf(tmp_path, **SHAPES["default_ff"])
    calls = []

    def fake_snapshot_download(repo_id, allow_patterns=None, local_files_only=False, **kw):
        calls.append((repo_id, local_files_only))
        wanted = ["model.safetensors", "config.json", "model-00001-of-00002.safetensors", "tokenizer_config.json",
                  "generation_config.json", "chat_template.jinja", "additional_chat_templates/tool_use.jinja"]
        assert all(any(fnmatch.fnmatch(name, p) for p in allow_patterns) for name in wanted)   # templates too
        assert not any(fnmatch.fnmatch("pytorch_model.bin", p) for p in allow_patterns)
        if local_files_only:
            raise huggingface_hub.errors.LocalEntryNotFoundError("not in the cache")
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    for source in ("openai-community/gpt2", "hf:gpt2"):
        model = hf.load_pretrained(source)[0]
        idx = np.array([[1, 2, 3]])
        np.testing.assert_allclose(model(idx), tmodel(torch.from_numpy(idx)).logits.detach().numpy(), atol=1e-5)
    assert calls == [("openai-community/gpt2", True), ("openai-community/gpt2", False), ("gpt2", True), ("gpt2", False)]


def test_offline_hub_id_says_what_to_download_and_where(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    import huggingface_hub

    def offline(repo_id, **kw):
        raise huggingface_hub.errors.LocalEntryNotFoundError("offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ValueError) as e:
        hf.load_pretrained("gpt2")[0]
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("there is no folder 'gpt2', and cannot fetch 'gpt2' from the Hugging Face hub")
    assert 'hf download gpt2 --include "*.json" "*.safetensors" "*.jinja" "merges.txt"' in msg
    assert huggingface_hub.constants.HF_HUB_CACHE in msg
    with pytest.raises(ValueError, match="^cannot fetch 'gpt2' from"):        # written as a hub id: no folder meant
        hf.load_pretrained("hf:gpt2")[0]


def test_a_missing_folder_inside_a_folder_and_a_folder_without_a_model_are_named(tmp_path, monkeypatch):
    """runs/nope where runs/ exists is a mistyped folder, not a hub id to fetch; a folder that is neither a run
    folder nor a Hugging Face one says both kinds."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"^there is no folder 'runs/nope' in 'runs' \(a typo\? a Hugging Face hub "
                                         r"id is written hf:runs/nope\)$"):
        hf.load_pretrained("runs/nope")
    with pytest.raises(ValueError, match="has no config.json: it is neither a run folder .* nor a Hugging Face model"):
        hf.load_pretrained("runs/empty")


# -- export --------------------------------------------------------------------------------------------------
def hf_logits(folder, idx):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(torch.from_numpy(idx)).logits.double().numpy()


def test_import_then_export_gives_identical_tensors_and_config(tmp_path):
    from safetensors.numpy import load_file

    for name in ("tied", "untied"):
        folder, _ = make_hf(tmp_path, name, **(SHAPES["n_inner"] if name == "tied" else SHAPES["untied_relu"]))
        save_tokenizer(folder)
        model, tok = hf.load_pretrained(folder)
        out = hf.export_hf(model, tmp_path / f"{name}_out", tok)
        a, b = load_file(folder / "model.safetensors"), load_file(out / "model.safetensors")
        assert sorted(a) == sorted(b)
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k
        src_cfg, out_cfg = (json.loads((d / "config.json").read_text()) for d in (folder, out))
        for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "activation_function",
                  "layer_norm_epsilon", "tie_word_embeddings", "model_type"):
            assert out_cfg[k] == src_cfg[k], k
        assert transformers.AutoTokenizer.from_pretrained(out)("a man")["input_ids"] == tok.encode("a man")


@pytest.mark.parametrize("options", [
    dict(bias=False, activation="gelu_tanh"),                         # nanoGPT's default: zero biases on export
    dict(positional="sinusoidal", activation="relu", tie_weights=False, d_ff=20),
    dict(activation="gelu", layer_norm_eps=1e-6),
    dict(activation="relu2", d_ff=40)])
def test_numformer_model_exports_with_the_same_logits(tmp_path, options):
    model = GPT(VOCAB, 24, n_layers=2, n_heads=2, d_model=16, rng=np.random.default_rng(0), **options)
    out = hf.export_hf(model, tmp_path / "out")
    idx = np.random.default_rng(1).integers(0, VOCAB, (2, 24))
    np.testing.assert_allclose(hf_logits(out, idx), model.eval()(idx), rtol=1e-4, atol=1e-5)
    again = hf.load_pretrained(out)[0]                                # and back: the same model
    np.testing.assert_allclose(again(idx), model(idx), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options,feature", [(dict(norm_first=False), "post-LN"), (dict(norm="rms"), "norm = 'rms'")])
def test_export_refuses_what_gpt2_cannot_express(tmp_path, options, feature):
    model = GPT(VOCAB, 16, n_layers=1, n_heads=2, d_model=8, **options)
    with pytest.raises(ValueError, match=f"GPT-2 cannot express {feature}"):
        hf.export_hf(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("options", [dict(), dict(positional="rope", activation="swiglu", norm="rms", bias=False)])
@pytest.mark.parametrize("model_type", [None, "gpt2", "llama"])
def test_export_of_an_attention_only_gpt_names_feed_forward_false(tmp_path, options, model_type):
    """feed_forward = false: no family has blocks without a feed-forward; the refusal names the option (before:
    "the model has no parameter blocks.0.norm2.weight to export")."""
    model = GPT(VOCAB, 16, n_layers=2, n_heads=2, d_model=8, feed_forward=False, **options)
    with pytest.raises(ValueError, match=r"^no Hugging Face family can express feed_forward = false \(attention-only "
                                         r"blocks\).*; this model cannot be exported$"):
        hf.export_hf(model, tmp_path / "out", model_type=model_type)
    assert not (tmp_path / "out").exists() and hf.checkpoints.export_types(model.config) == []


# -- run folders and the command line --------------------------------------------------------------------------
def cli(*argv):
    from numformer.cli import main
    return main([str(a) for a in argv])


@pytest.fixture
def hf_folder(tmp_path):
    folder, tmodel = make_hf(tmp_path, **SHAPES["n_inner"])
    save_tokenizer(folder)
    (tmp_path / "text.txt").write_text(TEXT * 3)
    return folder, tmodel


def test_numformer_run_exports_to_transformers(tmp_path, hf_folder, capsys):
    folder, tmodel = hf_folder
    run = tmp_path / "run"
    assert cli("import-hf", folder, "--out", run, "--data", tmp_path / "text.txt", "--block-size", 32) == 0
    assert cli("export", run, "--format", "hf", "--out", tmp_path / "exported") == 0
    assert cli("import-hf", folder, "--out", run, "--data", tmp_path / "text.txt") == 2      # import-hf: no --resume
    assert "already holds a run; replace it with --overwrite, or choose another --out" in capsys.readouterr().err
    idx = np.random.default_rng(2).integers(0, VOCAB, (2, 12))
    np.testing.assert_allclose(hf_logits(tmp_path / "exported", idx),
                               tmodel(torch.from_numpy(idx)).logits.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert cli("export", run, "--out", tmp_path / "exported") == 2            # not empty, no --overwrite
    assert "is not empty" in capsys.readouterr().err


def test_a_model_with_more_rows_than_its_tokenizer_has_tokens_imports_and_runs(tmp_path, capsys):
    """Qwen's embedding has 151,936 rows for 151,665 tokens: the run import-hf writes of such a model is used by
    generate, eval and export (they refused its tokenizer.json as "of another vocabulary"), and an id past the
    tokenizer's vocabulary decodes to nothing, as transformers' tokenizer decodes it."""
    folder, tmodel = make_hf(tmp_path, **SHAPES["default_ff"])
    tokens = save_tokenizer(folder, vocab_size=270).get_vocab_size()
    assert tokens < VOCAB
    (tmp_path / "text.txt").write_text(TEXT * 3)
    run = tmp_path / "run"
    assert cli("import-hf", folder, "--out", run, "--data", tmp_path / "text.txt", "--block-size", 32) == 0
    assert cli("generate", run, "--prompt", "It is", "--greedy", "--max-new-tokens", "4") == 0
    assert cli("eval", run) == 0
    assert cli("export", run, "--out", tmp_path / "exported") == 0
    idx = np.random.default_rng(3).integers(0, VOCAB, (1, 10))
    np.testing.assert_allclose(hf_logits(tmp_path / "exported", idx),
                               tmodel(torch.from_numpy(idx)).logits.detach().numpy(), rtol=1e-5, atol=1e-6)
    from numformer import load
    tokenizer = load(run)[1]
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    ids = [5, tokens, VOCAB - 1, 7]
    assert tokenizer.decode(ids) == theirs.decode(ids) == theirs.decode([5, 7])
    with pytest.raises(ValueError, match="id -1 is negative"):
        tokenizer.decode([3, -1])


def test_generate_stops_at_the_end_token_as_transformers_does(tmp_path, capsys):
    """A model whose every next token is <|endoftext|> (the config's eos_token_id): transformers' generate stops
    after it, and so does `numformer generate` (the end token unprinted); --ignore-eos goes on."""
    folder, tmodel = make_hf(tmp_path, **SHAPES["default_ff"])
    save_tokenizer(folder)
    with torch.no_grad():                        # the final hidden state is a constant pointing at token EOS
        tmodel.transformer.wte.weight[EOS] *= 4
        tmodel.transformer.ln_f.weight.zero_()
        tmodel.transformer.ln_f.bias.copy_(tmodel.transformer.wte.weight[EOS])
    tmodel.save_pretrained(folder)
    prompt = torch.tensor([[5, 6, 7]])
    theirs = tmodel.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=EOS)
    assert theirs[0, 3:].tolist() == [EOS]
    capsys.readouterr()
    assert cli("generate", folder, "--prompt", "It is", "--greedy", "--max-new-tokens", "5") == 0
    assert capsys.readouterr().out == "It is\n"
    assert cli("generate", folder, "--prompt", "It is", "--greedy", "--max-new-tokens", "3", "--ignore-eos") == 0
    assert capsys.readouterr().out == "It is" + "<|endoftext|>" * 3 + "\n"


@pytest.mark.parametrize("generation_eos", [299, None])
def test_generate_stops_where_transformers_generate_does_when_the_two_configs_differ(tmp_path, capsys,
                                                                                     generation_eos):
    """config.json's eos_token_id is the first greedy token, generation_config.json names another (or none):
    transformers' generate reads generation_config.json alone and goes on, and so does `numformer generate`
    (before: it stopped at config.json's id, printing nothing)."""
    from numformer.commands.generate import load_generator
    from numformer.data.chat import generation_eos_ids

    folder, tmodel = make_hf(tmp_path, **SHAPES["default_ff"])
    tok = save_tokenizer(folder)
    prompt = tok.encode("It is").ids
    with torch.no_grad():
        first = int(tmodel(torch.tensor([prompt])).logits[0, -1].argmax())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": first}))
    generation = {"eos_token_id": generation_eos} if generation_eos is not None else {}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    new = theirs.generate(torch.tensor([prompt]), max_new_tokens=3, do_sample=False, pad_token_id=EOS)[0, len(prompt):]
    assert new.tolist()[0] == first and len(new) == 3                       # transformers went on
    assert generation_eos_ids(folder, load_generator(folder)[1]) == ([] if generation_eos is None else [299])
    capsys.readouterr()
    assert cli("generate", folder, "--prompt", "It is", "--greedy", "--max-new-tokens", "3") == 0
    assert capsys.readouterr().out == "It is" + tok.decode(new.tolist()) + "\n"


def test_a_tokenizer_larger_than_the_models_vocabulary_is_named_as_the_cause(tmp_path, capsys):
    """A folder whose tokenizer has more tokens than the model embeds: a prompt that encodes to an id beyond the
    vocabulary is one line naming the mismatch and the fix (before: 'prompt holds token ids outside [0, 300)')."""
    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"])
    tok = save_tokenizer(folder, vocab_size=600)
    prompt = "It is a truth universally acknowledged"
    assert max(tok.encode(prompt).ids) >= VOCAB
    capsys.readouterr()
    assert cli("generate", folder, "--prompt", prompt, "--greedy", "--max-new-tokens", "2") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"beyond the model's vocabulary of {VOCAB} ids: {folder}'s tokenizer has " in err
    assert err.endswith("give the folder the model's own tokenizer")


def test_import_of_a_long_context_model_evaluates_on_a_window_of_1024_tokens(tmp_path):
    """The default evaluation window was the model's whole context, longer than the built-in text's validation
    split for a Llama 3.2 (131,072 tokens): its import failed. The model keeps its context."""
    from numformer.commands.import_hf import EVAL_WINDOW
    from numformer.train import load_config_json

    folder, _ = make_hf(tmp_path, n_positions=131072, **SHAPES["default_ff"])
    save_tokenizer(folder)
    assert cli("import-hf", folder, "--out", tmp_path / "run") == 0
    config = load_config_json(tmp_path / "run")
    assert config["data"]["block_size"] == EVAL_WINDOW and config["model"]["block_size"] == 131072
    assert cli("eval", tmp_path / "run") == 0


def test_a_quantized_checkpoint_is_refused_by_its_field(tmp_path):
    """An FP8 checkpoint was called damaged ("download it again"): its weights' dtype is not one numformer reads."""
    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"])
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json: gpt2 config.json field quantization_config = "
                                         r"\{'quant_method': 'fp8'\}: its weights are quantized"):
        hf.load_pretrained(folder)


def test_export_of_a_run_that_is_no_gpt_is_one_line(tmp_path, capsys):
    """A copy-task run (encoder-decoder): one error naming the model type, no traceback, no folder left."""
    sets = ["model.n_layers=1", "model.d_model=16", "model.d_ff=16", "data.length=4", "data.n_val=8",
            "data.n_test=8", "train.max_steps=2", "train.batch_size=4", "train.processes=1", "train.eval_every=2"]
    assert cli("train", "configs/copy.toml", "--out", tmp_path / "run", "--quiet",
               *[a for s in sets for a in ("--set", s)]) == 0
    assert cli("export", tmp_path / "run", "--out", tmp_path / "hf") == 2
    err = capsys.readouterr().err
    assert "holds a transformer model; `numformer export` writes GPT runs" in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists()
    for command, more in (("generate", ()), ("explore", ("--static", tmp_path / "p.html", "--prompt", "x"))):
        assert cli(command, tmp_path / "run", *more) == 2
        assert f"holds a transformer model; `numformer {command}` works on a GPT" in capsys.readouterr().err


def test_char_run_exports_without_a_tokenizer(tmp_path, capsys):
    run = tmp_path / "run"
    (tmp_path / "t.txt").write_text(TEXT)
    assert cli("train", "configs/shakespeare_char.toml", "--out", run, "--quiet", "--set", "train.max_steps=2",
               "--set", "model.n_layers=1", "--set", "model.d_model=16", "--set", f"data.path={tmp_path / 't.txt'}",
               "--set", "data.block_size=8", "--set", "train.processes=1") == 0
    assert cli("export", run, "--out", tmp_path / "hf") == 0
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors"]
    from numformer.train import load_model
    model = load_model(run)
    idx = np.array([[1, 2, 3, 4]])
    np.testing.assert_allclose(hf_logits(tmp_path / "hf", idx), model(idx), rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def llama_like_runs(tmp_path_factory):
    """Two tiny Llama-like runs (RoPE, SwiGLU, RMSNorm, no biases) on the copy task: ``plain``, and ``lora`` with
    adapters on q_proj and v_proj. Llama, Mistral and Qwen2 can each express them; the default is llama."""
    from conftest import tiny_copy_toml
    from numformer.cli import main

    root = tmp_path_factory.mktemp("llama_like")
    toml = tiny_copy_toml(dict(positional="rope", activation="swiglu", norm="rms", bias=False), max_steps=2,
                          batch_size=4, eval_every=2, processes=1)
    (root / "plain.toml").write_text(toml)
    (root / "lora.toml").write_text(toml + '[lora]\nr = 2\ntarget_modules = ["q_proj", "v_proj"]\n')
    for name in ("plain", "lora"):
        assert main(["train", str(root / f"{name}.toml"), "--out", str(root / name), "--quiet"]) == 0
    return root


@pytest.mark.parametrize("model_type", [None, "llama", "mistral", "qwen2"])
def test_export_model_type_writes_that_family(llama_like_runs, tmp_path, run_cli, model_type):
    """``--model-type`` chooses among the families that can express the model (once only Python's
    ``export_hf(..., model_type=...)`` could); without it, the one ``default_export_type`` picks."""
    from numformer.train import load_model

    run, out = llama_like_runs / "plain", tmp_path / "hf"
    assert run_cli("export", run, *(("--model-type", model_type) if model_type else ()), "--out", out)[0] == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == (model_type or "llama")
    model = load_model(run)
    idx = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 6))
    np.testing.assert_allclose(hf_logits(out, idx), model(idx), rtol=1e-4, atol=1e-5)


def test_export_model_type_of_a_lora_run_names_the_base_family(llama_like_runs, tmp_path, run_cli):
    peft = pytest.importorskip("peft")
    from numformer.train import load_model

    out = tmp_path / "adapter"
    assert run_cli("export", llama_like_runs / "lora", "--model-type", "mistral", "--out", out)[0] == 0
    assert json.loads((out / "base" / "config.json").read_text())["model_type"] == "mistral"
    base = transformers.AutoModelForCausalLM.from_pretrained(out / "base").eval()
    pmodel = peft.PeftModel.from_pretrained(base, str(out)).eval()
    model = load_model(llama_like_runs / "lora")
    idx = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 6))
    with torch.no_grad():
        np.testing.assert_allclose(pmodel(torch.from_numpy(idx)).logits.numpy(), model(idx), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model_type,why", [("gpt2", "GPT-2 cannot express norm = 'rms'"),
                                            ("qwen3", "Qwen3 cannot express a model without q/k norms")])
def test_export_refuses_a_model_type_the_model_cannot_be(llama_like_runs, tmp_path, cli_error, model_type, why):
    """One line: the type, what its family lacks, the types this model can be written as; nothing is written
    (a LoRA run's adapter included, which a Qwen3 base would otherwise have left behind)."""
    for run in ("plain", "lora"):
        line = cli_error("export", llama_like_runs / run, "--model-type", model_type, "--out", tmp_path / run)
        assert f"--model-type {model_type}: {why}" in line, line
        can_be = line.split("it can be exported as model_type ")[1].replace(" or ", ", ").split(", ")
        assert {"llama", "mistral", "qwen2"} <= set(can_be) and model_type not in can_be, line  # and any new kin
        assert not (tmp_path / run).exists()


@pytest.mark.parametrize("size", [0, -5, N_POS + 1, 1000])
def test_import_hf_block_size_out_of_range_names_the_option(tmp_path, hf_folder, cli_error, size):
    """--block-size 0 was taken as the default, -5 and 1000 refused in config words ([data] block_size, the
    init_from model): one line naming --block-size, its range and the default; nothing is written."""
    folder, _ = hf_folder
    line = cli_error("import-hf", folder, "--out", tmp_path / "run", f"--block-size={size}")
    assert line == (f"numformer import-hf: error: --block-size {size}: the evaluation window must be from 1 to the "
                    f"model's context of {N_POS} tokens; leave it out for the default ({N_POS})")
    assert not (tmp_path / "run").exists()
    assert cli("import-hf", folder, "--out", tmp_path / "edge", "--block-size", N_POS) == 0    # the context itself


def test_imported_run_works_with_generate_eval_and_analyze(tmp_path, hf_folder, capsys):
    folder, tmodel = hf_folder
    run = tmp_path / "run"
    assert cli("import-hf", folder, "--out", run, "--data", tmp_path / "text.txt", "--block-size", 32) == 0
    capsys.readouterr()
    _, tok = hf.load_pretrained(folder)
    prompt = "It is a truth"
    ids = np.array([tok.encode(prompt)])
    with torch.no_grad():
        ref = tmodel.generate(torch.from_numpy(ids), max_new_tokens=8, do_sample=False, pad_token_id=EOS,
                              eos_token_id=None, attention_mask=torch.ones_like(torch.from_numpy(ids)))
    expected = tok.decode(ref[0].numpy())
    for source in (run, folder):
        assert cli("generate", source, "--prompt", prompt, "--max-new-tokens", 8, "--greedy") == 0
        assert capsys.readouterr().out == expected + "\n"
    assert cli("eval", run, "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert "bits_per_token" in result and np.isfinite(result["loss"])
    assert cli("analyze", run, "--out", tmp_path / "analysis", "--no-ablation", "--no-occlusion",
               "--text", "a single man") == 0
    assert (tmp_path / "analysis" / "report.md").is_file()


def test_generate_accepts_a_hub_id(tmp_path, hf_folder, monkeypatch, capsys):
    import huggingface_hub

    folder, _ = hf_folder
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: str(folder))
    assert cli("generate", "hf:gpt2", "--prompt", "a man", "--max-new-tokens", 5, "--seed", 0) == 0
    assert capsys.readouterr().out.startswith("a man")


def fine_tune_config(init_from, text_path, **model):
    return {"model": {"init_from": str(init_from), **model},
            "data": {"task": "text", "path": str(text_path), "block_size": 16},
            "train": {"max_steps": 8, "batch_size": 4, "lr": 3e-3, "eval_every": 8, "log_every": 1,
                      "checkpoint_every": 8, "processes": 1, "warmup_steps": 0}}


@pytest.mark.parametrize("kind", ["hf_folder", "run_folder"])
def test_fine_tuning_lowers_the_loss_and_the_run_reloads(tmp_path, hf_folder, kind):
    from numformer.train import Trainer, evaluate_loss, load_model, load_task

    folder, _ = hf_folder
    source = folder
    if kind == "run_folder":
        source = tmp_path / "imported"
        assert cli("import-hf", folder, "--out", source) == 0
    trainer = Trainer(fine_tune_config(source, tmp_path / "text.txt", dropout=0.0), tmp_path / "ft", quiet=True)
    assert trainer.task.unit == "token" and trainer.task.tokenizer.eos_id == EOS
    before = evaluate_loss(trainer.model, trainer.task, "val", 8)
    np.testing.assert_allclose(trainer.model.tok_emb.weight.data, hf.load_pretrained(folder)[0].tok_emb.weight.data)
    summary = trainer.train()
    assert summary["best_val_loss"] < before
    model, task = load_model(tmp_path / "ft"), load_task(tmp_path / "ft")
    assert abs(evaluate_loss(model, task, "val", 8) - summary["best_val_loss"]) < 1e-6
    assert json.loads((tmp_path / "ft" / "config.json").read_text())["model"]["init_from"] == str(source)


def test_fine_tuning_keeps_the_architecture(tmp_path, hf_folder):
    from numformer.train import resolve_config

    folder, _ = hf_folder
    with pytest.raises(ValueError, match=r"\[model\] \['n_layers'\] differ from the init_from model"):
        resolve_config(fine_tune_config(folder, tmp_path / "text.txt", n_layers=2))
    cfg = fine_tune_config(folder, tmp_path / "text.txt")
    cfg["data"]["block_size"] = N_POS + 1
    with pytest.raises(ValueError, match=rf"set \[data\] block_size <= {N_POS}"):
        resolve_config(cfg)


# -- batched prompts of different lengths: attention_mask with left padding -------------------------------------
def left_pad(prompts, pad=EOS):
    T = max(len(p) for p in prompts)
    ids = np.full((len(prompts), T), pad, dtype=np.int64)
    mask = np.zeros((len(prompts), T), dtype=np.int64)
    for i, p in enumerate(prompts):
        ids[i, T - len(p):], mask[i, T - len(p):] = p, 1
    return ids, mask


PROMPTS = [[5, 17, 3, 44, 9, 12, 7], [8, 2], [30, 31, 32, 33]]


@pytest.mark.parametrize("use_cache", [True, False])
def test_left_padded_batch_generates_what_each_prompt_generates_alone(tmp_path, use_cache):
    folder, tmodel = make_hf(tmp_path, **SHAPES["n_inner"])
    model = hf.load_pretrained(folder)[0]
    ids, mask = left_pad(PROMPTS)
    batch = model.generate(ids, 12, greedy=True, attention_mask=mask, use_cache=use_cache)
    for row, prompt in zip(batch, PROMPTS):
        alone = model.generate(np.array(prompt), 12, greedy=True, use_cache=use_cache)
        np.testing.assert_array_equal(row[-12:], alone[-12:])
    with torch.no_grad():        # transformers' generate with the same left-padded batch
        ref = tmodel.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=12,
                              do_sample=False, pad_token_id=EOS, eos_token_id=None).numpy()
    np.testing.assert_array_equal(batch, ref)


def test_attention_mask_logits_and_gradients_match_transformers(tmp_path):
    folder, tmodel = make_hf(tmp_path, torch_dtype=torch.float64, **SHAPES["default_ff"])
    tmodel.train()
    for m in tmodel.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    model = hf.load_pretrained(folder, dtype=np.float64)[0].train()
    ids, mask = left_pad(PROMPTS)
    targets = np.where(mask == 1, np.roll(ids, -1, axis=1), -100)
    position_ids = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    t_logits = tmodel(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                      position_ids=torch.from_numpy(position_ids)).logits
    V = t_logits.shape[-1]
    torch.nn.functional.cross_entropy(t_logits.reshape(-1, V), torch.from_numpy(targets).reshape(-1)).backward()
    logits = model(ids, attention_mask=mask)
    loss, cache = ops.cross_entropy_forward(logits, targets)
    model.backward(ops.cross_entropy_backward(cache))
    real = mask.astype(bool)                     # padded queries' outputs are unused (and differ: HF lets them
    assert rel_err(logits[real], t_logits.detach().numpy()[real]) < 1e-9        # attend to padding)
    grads = {n: p.grad for n, p in model.named_parameters()}
    for row in hf.FAMILIES["gpt2"].tensors(model.config):
        g = dict(tmodel.named_parameters())[row.hf[0]].grad.numpy()
        assert rel_err(grads[row.nf].T if row.transpose else grads[row.nf], g) < 1e-9, row.hf[0]


def test_attention_mask_must_be_left_padding(tmp_path):
    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"])
    model = hf.load_pretrained(folder)[0]
    ids, mask = left_pad(PROMPTS)
    with pytest.raises(ValueError, match="left padding"):
        model.generate(ids, 2, greedy=True, attention_mask=mask[:, ::-1])
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, cached \+ new tokens\)"):
        model(ids, attention_mask=mask[:, 1:])


def test_generation_benchmark_part_measures_both_libraries(tmp_path):
    from numformer.bench import hf_generate

    folder, tmodel = make_hf(tmp_path, **SHAPES["default_ff"])
    model = hf.load_pretrained(folder)[0]
    row = hf_generate.measure(model, tmodel, 2, 5, 4, threads=1, repeats=1, modes=("one_thread", "numformer"))
    assert row["same_tokens_fraction"] == 1.0 and row["best_mode"] in ("one_thread", "numformer")
    assert row["ratio"] > 0 and row["transformers_tokens_per_s"] > 0
    row["bandwidth_bound_tokens_per_s"] = 1e6
    result = {"model": {"parameters": 1e5, "n_layers": 2, "d_model": 16, "vocab_size": VOCAB}, "prompt_tokens": 5,
              "new_tokens": 4, "threads": 1, "torch_threads": 1, "torch": "x", "transformers": "y",
              "weight_bytes": 4e5, "bandwidth": {"bytes_per_s": 1e10, "matvec_bytes_per_s": 1e10,
                                                 "copy_bytes_per_s": 5e9}, "rows": [row], "load_average": 1.0}
    assert "| 2 |" in hf_generate.markdown(result, tmp_path)
    bw = hf_generate.memory_bandwidth(mib=4, repeats=1)
    assert bw["bytes_per_s"] > 0


def test_bfloat16_checkpoint_is_read_exactly(tmp_path):
    folder, tmodel = make_hf(tmp_path, torch_dtype=torch.bfloat16, **SHAPES["default_ff"])
    model = hf.load_pretrained(folder)[0]
    ref = dict(tmodel.float().named_parameters())
    np.testing.assert_array_equal(model.blocks[1].ff.linear1.weight.data,
                                  ref["transformer.h.1.mlp.c_fc.weight"].detach().numpy().T)
    np.testing.assert_array_equal(model.tok_emb.weight.data, ref["transformer.wte.weight"].detach().numpy())


def test_corrupt_weights_file(tmp_path):
    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"])
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match="model.safetensors is damaged.*download it again"):
        hf.load_pretrained(folder)


@pytest.mark.parametrize("positional,beyond", [("learned", "raises an IndexError"), ("rope", "keeps every earlier")])
def test_export_warns_once_and_records_the_context(tmp_path, capsys, positional, beyond):
    kw = dict(positional="rope", activation="swiglu", norm="rms") if positional == "rope" else {}
    model = GPT(VOCAB, 16, n_layers=1, n_heads=2, d_model=8, rng=np.random.default_rng(0), **kw)
    out = hf.export_hf(model, tmp_path / "out")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and "past the context of 16 tokens" in err[0], err
    assert beyond in err[0]
    recorded = json.loads((out / "config.json").read_text())["numformer_context"]
    assert recorded["block_size"] == 16 and beyond in recorded["note"]
