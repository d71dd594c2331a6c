"""Language models on byte-level BPE: [data] tokenizer = "bpe" for task = "text", token files on disk, bits per
byte, imdb_lm, and the commands (train, --resume, generate, eval, export) on such runs."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from numformer.data import fingerprint, make_task
from numformer.experiments import bpe_lm
from numformer.data.lm_corpus import BPE_FORMAT, file_identity
from numformer.data.text import TextTask
from numformer.data.token_files import (TokenFile, read_tokens_dir, token_cache, token_cache_root, token_dtype,
                                        write_token_file, write_tokens_dir)
from numformer.data.tokenizers import END_OF_TEXT, ByteLevelBPE
from numformer.train import Trainer
from numformer.train.bits_per_byte import ByteCount
from numformer.train.evaluation import mean_loss

from conftest import src_env

WORDS = ("the king and the queen walk to the castle while a fool sings of spring and of winter; "
         "they speak of war, of peace, of bread and wine. ").split()


def corpus(tmp_path, n_words=6000, seed=0, name="a.txt", tail=""):
    rng = np.random.default_rng(seed)
    text = " ".join(rng.choice(WORDS, size=n_words)) + tail
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def tiny_config(data, **train):
    return {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
            "data": {"task": "text", "tokenizer": "bpe", "vocab_size": 300, "block_size": 16, **data},
            "train": {"max_steps": 8, "batch_size": 4, "eval_every": 4, "processes": 1, "log_every": 2, **train}}


# -- the task ---------------------------------------------------------------------------------------------------
def test_bpe_is_learnt_from_the_training_split_and_documents_end_with_end_of_text(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    corpus(folder, name="a.txt")
    corpus(folder, n_words=500, seed=1, name="b.txt", tail=" zqxv" * 300)     # the last file: validation
    task = make_task({"task": "text", "path": str(folder), "tokenizer": "bpe", "vocab_size": 300, "block_size": 16})
    tok = task.tokenizer
    assert isinstance(tok, ByteLevelBPE) and tok.vocab_size == 300 and tok.id_to_token[0] == END_OF_TEXT
    assert not any("zq" in t or "qx" in t for t in tok.vocab), "a merge learnt from the validation text"
    train, val = task.splits["train"], task.splits["val"]
    assert isinstance(train, TokenFile) and train.dtype == np.uint16
    text_a = (folder / "a.txt").read_text()
    assert tok.decode(train[:]).startswith(text_a + END_OF_TEXT)             # a.txt, then its end
    assert tok.decode(val[:]).endswith(" zqxv" + END_OF_TEXT)
    assert train[:].tolist().count(0) == 1 and val[:].tolist().count(0) == 1   # b.txt is cut by the split
    n_bytes = sum(len(p.read_bytes()) for p in (folder / "a.txt", folder / "b.txt"))
    assert task.token_bytes()[np.concatenate([train[:], val[:]])].sum() == n_bytes
    assert task.model_config() == {"vocab_size": 300, "block_size": 16}
    assert "byte-level BPE vocabulary of 300" in task.describe()


def test_token_files_are_cached_and_a_saved_tokenizer_is_reused(tmp_path, monkeypatch):
    path = corpus(tmp_path)
    data = {"task": "text", "path": str(path), "tokenizer": "bpe", "vocab_size": 300, "block_size": 16}
    first = make_task(data)
    monkeypatch.setattr(ByteLevelBPE, "train", lambda *a, **k: pytest.fail("trained again"))
    monkeypatch.setattr(ByteLevelBPE, "encode_chunks", lambda *a, **k: pytest.fail("encoded again"))
    again = make_task(data, tokenizer_state=first.tokenizer_state())
    assert again.splits["train"].path == first.splits["train"].path
    assert again.tokenizer.merges == first.tokenizer.merges
    assert make_task(data).tokenizer.merges == first.tokenizer.merges
    monkeypatch.undo()
    path.write_text(path.read_text() + " and more.")                     # an edited corpus is another corpus
    assert make_task(data).splits["train"].path != first.splits["train"].path


def test_the_token_cache_is_keyed_by_the_corpus_s_content(tmp_path):
    """A corpus replaced by other text of the same size and modification time (cp -p, rsync -t, tar x) is another
    corpus. Before: the cache, keyed by path, size and modification time, served the old text's tokenizer and
    token files, while data_files.json recorded the new file."""
    path = corpus(tmp_path)
    stat = path.stat()
    data = {"task": "text", "path": str(path), "tokenizer": "bpe", "vocab_size": 300, "block_size": 16}
    first = make_task(data)
    other = corpus(tmp_path, seed=7).read_text()[:stat.st_size].ljust(stat.st_size)
    path.write_text(other, encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    again = make_task(data)
    assert again.splits["train"].path != first.splits["train"].path
    assert other.startswith(again.tokenizer.decode(again.splits["train"][:50]))


def test_a_folder_of_token_files_trains(tmp_path):
    tok = ByteLevelBPE.train(corpus(tmp_path).read_text(), 300)
    ids = tok.encode(corpus(tmp_path, seed=3, name="b.txt").read_text())
    folder = tmp_path / "tokens"
    write_tokens_dir(folder, {"train": [ids[:3000]], "val": [ids[3000:]]}, tok.to_dict(), token_dtype(300), {})
    task = make_task({"task": "text", "tokens_dir": str(folder), "block_size": 16})
    assert task.splits["train"][:].tolist() == ids[:3000] and task.tokenizer.merges == tok.merges
    (folder / "meta.json").unlink()                   # as nanoGPT writes them: the dtype from the vocabulary
    assert read_tokens_dir(folder)[0]["val"][:].tolist() == ids[3000:]
    other = ByteLevelBPE.train("something else entirely, " * 50, 280).to_dict()
    with pytest.raises(ValueError, match="not the one this run was trained with"):
        make_task({"task": "text", "tokens_dir": str(folder), "block_size": 16}, tokenizer_state=other)
    with pytest.raises(ValueError, match="has no train.bin"):
        make_task({"task": "text", "tokens_dir": str(tmp_path), "block_size": 16})


def test_a_folder_of_uint32_token_files_and_a_meta_json_that_does_not_match_its_files(tmp_path):
    """Vocabularies past 65,536 tokens take uint32 ids; meta.json's dtype is one of the two, and its token counts
    are the files' (a uint32 file read as uint16 would train on the halves of its ids)."""
    assert token_dtype(1 << 16) == np.uint16 and token_dtype((1 << 16) + 1) == np.uint32
    tok = ByteLevelBPE.train(corpus(tmp_path).read_text(), 300)
    ids = tok.encode(corpus(tmp_path, seed=3, name="b.txt").read_text())
    folder = tmp_path / "tokens"
    write_tokens_dir(folder, {"train": [ids[:3000]], "val": [ids[3000:]]}, tok.to_dict(), np.uint32, {})
    assert (folder / "train.bin").stat().st_size == 4 * 3000
    assert make_task({"task": "text", "tokens_dir": str(folder), "block_size": 16}).splits["train"][:].tolist() \
        == ids[:3000]
    meta = json.loads((folder / "meta.json").read_text())
    for dtype, message in (("uint16", r"train.bin holds 6,000 uint16 ids but .*meta.json says 3000"),
                           ("float32", r"meta.json must be an object whose \"dtype\" is \"uint16\" or \"uint32\" .*not "
                                       r"dtype 'float32'"),
                           ("nonsense", r"not dtype 'nonsense'")):
        (folder / "meta.json").write_text(json.dumps({**meta, "dtype": dtype}))
        with pytest.raises(ValueError, match=message):
            read_tokens_dir(folder)
    (folder / "meta.json").unlink()         # before: read as uint16, every other token 0
    with pytest.raises(ValueError) as e:
        make_task({"task": "text", "tokens_dir": str(folder), "block_size": 16})
    assert str(e.value).startswith(f"{folder / 'train.bin'} holds uint32 ids (every second uint16 of it is 0), but "
                                   f"without a meta.json saying so its tokenizer's vocabulary means uint16; write "
                                   f"{folder / 'meta.json'} with {{\"dtype\": \"uint32\"}}")
    (folder / "meta.json").write_text('{"dtype": "uint32"}')
    assert read_tokens_dir(folder)[0]["val"][:].tolist() == ids[3000:]


def test_language_model_tokenizer_choices(tmp_path):
    path = corpus(tmp_path)
    with pytest.raises(ValueError, match="\"char\" \\(characters\\) or \"bpe\""):
        make_task({"task": "text", "path": str(path), "tokenizer": "word"})
    with pytest.raises(ValueError, match="not a valid regular expression"):
        make_task({"task": "text", "path": str(path), "tokenizer": "bpe", "pattern": "(oops"})
    assert TextTask.sizes_from_config({"tokenizer": "bpe", "vocab_size": 512}) == {"vocab_size": 512,
                                                                                  "block_size": 64}


@pytest.mark.parametrize("pattern, suggestion", [("gpt3", '"gpt2" or "gpt4"'), ("gpt-4", '"gpt4"'),
                                                  ("GPT2", '"gpt2"')])
def test_a_misspelt_pattern_name_is_refused_with_the_names(tmp_path, pattern, suggestion):
    path = corpus(tmp_path, n_words=50)
    with pytest.raises(ValueError, match=rf"\[data\] pattern = '{pattern}' is not a known split pattern: "
                                         rf"did you mean {suggestion}\?"):
        make_task({"task": "text", "path": str(path), "tokenizer": "bpe", "pattern": pattern})


def test_a_regex_that_matches_nothing_in_the_text_is_refused_and_one_that_does_is_used(tmp_path):
    path = corpus(tmp_path, n_words=300)
    with pytest.raises(ValueError, match=r"\[data\] pattern = 'zebra' matches nothing in the training text"):
        make_task({"task": "text", "path": str(path), "tokenizer": "bpe", "vocab_size": 280, "pattern": "zebra"})
    task = make_task({"task": "text", "path": str(path), "tokenizer": "bpe", "vocab_size": 280,
                      "pattern": r" ?[a-z]+|[^a-z]"})
    assert task.tokenizer.vocab_size == 280 and "Ġthe" in task.tokenizer.vocab


def bpe_config(tmp_path, path, vocab_size, data="", train=""):
    """tmp_path/c.toml: a one-layer GPT trained 2 steps on ``path`` with a BPE of ``vocab_size`` tokens, the
    lines ``data`` and ``train`` added to [data] and [train]."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\nn_layers = 1\nn_heads = 2\nd_model = 16\n[data]\ntask = "text"\n'
                   f'path = "{path.as_posix()}"\ntokenizer = "bpe"\nvocab_size = {vocab_size}\n{data}'
                   f'[train]\nmax_steps = 2\nbatch_size = 4\nprocesses = 1\n{train}', encoding="utf-8")
    return cfg


def test_quiet_train_prints_nothing_while_learning_a_bpe(tmp_path, run_cli):
    path = corpus(tmp_path, n_words=400, seed=7)
    cfg = bpe_config(tmp_path, path, 280, "block_size = 16\n", "eval_every = 2\n")
    rc, out, err = run_cli("train", cfg, "--out", tmp_path / "run", "--quiet")
    assert rc == 0 and out == "" and err == "", err


def test_a_bpe_vocab_size_too_small_is_refused_before_anything_is_learnt(tmp_path, run_cli):
    path = corpus(tmp_path, n_words=50, seed=8)
    cfg = bpe_config(tmp_path, path, 10)
    rc, _, err = run_cli("train", cfg, "--out", tmp_path / "run")
    assert rc == 2 and err.splitlines() == ["numformer train: error: [data] vocab_size = 10 is too small for a "
                                            "byte-level BPE, which holds the 256 bytes and <|endoftext|>: set it "
                                            "to 257 or more (e.g. 4096)"], err


def test_a_vocab_size_written_for_the_char_tokenizer_is_refused_before_anything_is_read(tmp_path, run_cli):
    """[data] vocab_size is the size of a BPE: written with tokenizer = "char" (the default) it was ignored
    without a word. A char run's config.json, which holds the default vocab_size, still resumes and evaluates."""
    path = corpus(tmp_path, n_words=400, seed=8)
    cfg = bpe_config(tmp_path, path, 500)
    cfg.write_text(cfg.read_text(encoding="utf-8").replace('tokenizer = "bpe"\n', ""), encoding="utf-8")
    rc, _, err = run_cli("train", cfg, "--out", tmp_path / "run")
    assert rc == 2 and err.splitlines() == ['numformer train: error: [data] vocab_size = 500 is only used by '
                                            'tokenizer = "bpe" (the char tokenizer\'s vocabulary is the '
                                            'corpus\'s characters); remove it or set tokenizer = "bpe"'], err
    assert not (tmp_path / "run").exists()
    rc, _, err = run_cli("params", bpe_config(tmp_path, path, 300), "--set", "data.tokenizer=char")
    assert rc == 2 and "[data] vocab_size = 300 is only used by tokenizer = \"bpe\"" in err, err
    cfg = bpe_config(tmp_path, path, 500, 'pattern = "gpt4"\n')
    cfg.write_text(cfg.read_text(encoding="utf-8").replace('tokenizer = "bpe"\nvocab_size = 500\n', ""),
                   encoding="utf-8")
    rc, _, err = run_cli("train", cfg, "--out", tmp_path / "run")
    assert rc == 2 and '[data] pattern = "gpt4" is only used by tokenizer = "bpe"' in err, err
    cfg = bpe_config(tmp_path, path, 500)
    cfg.write_text(cfg.read_text(encoding="utf-8").replace('tokenizer = "bpe"\nvocab_size = 500\n', ""),
                   encoding="utf-8")
    assert run_cli("train", cfg, "--out", tmp_path / "run", "--quiet")[0] == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text(encoding="utf-8"))["data"]["vocab_size"] == 4096
    assert run_cli("train", "--resume", "--out", tmp_path / "run", "--set", "train.max_steps=3", "--quiet")[0] == 0
    assert run_cli("eval", tmp_path / "run")[0] == 0


def test_a_vocab_size_is_refused_where_the_user_wrote_it_for_characters_not_in_a_run_s_config_json():
    from numformer.config import resolve_config

    model = {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16}
    with pytest.raises(ValueError, match="vocab_size = 4095 is only used by"):
        resolve_config({"model": model, "data": {"task": "text", "vocab_size": 4095}}, sizes_only=True)
    resolve_config({"model": model, "data": {"task": "text", "vocab_size": 4096}}, sizes_only=True)   # default
    bpe = {"task": "text", "tokenizer": "bpe", "vocab_size": 512}
    assert resolve_config({"model": model, "data": bpe}, sizes_only=True)[0]["model"]["vocab_size"] == 512
    resolved = resolve_config({"model": model, "data": {"task": "text"}}, sizes_only=True)[0]
    assert resolved["data"]["vocab_size"] == 4096                                   # the default, as config.json
    assert resolve_config(resolved, build_task=False)[0] == resolved                # holds it: read back as it is


def test_files_are_read_in_chunks_with_the_checks_of_a_whole_read(tmp_path):
    import gzip

    from numformer.data.files import iter_text, read_text

    text = "\ufeffFirst line, é and 🙂\n" + "a longer line of words " * 40 + "\n\nend"
    plain, packed = tmp_path / "t.txt", tmp_path / "t.txt.gz"
    plain.write_text(text, encoding="utf-8")
    packed.write_bytes(gzip.compress(text.encode("utf-8")))
    for path in (plain, packed):
        for block in (1, 5, 64, 1 << 20):
            chunks = list(iter_text(path, block_bytes=block))
            assert "".join(chunks) == read_text(path) == text[1:]
            if block >= 64:             # lines shorter than 16 blocks: chunks end at line breaks
                assert all(c.endswith("\n") for c in chunks[:-1])
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\nfine\n\xff here")
    with pytest.raises(ValueError) as whole:
        read_text(bad)
    with pytest.raises(ValueError) as chunked:
        list(iter_text(bad, block_bytes=3))
    assert str(whole.value) == str(chunked.value) and "byte offset 8 (line 3)" in str(chunked.value)


# -- bits per byte ---------------------------------------------------------------------------------------------
def test_bits_per_byte_counts_the_texts_bytes_and_leaves_out_special_tokens(tmp_path):
    from numformer.models import GPT

    path = corpus(tmp_path, tail=" é😀")
    for tokenizer in ("char", "bpe"):
        task = make_task({"task": "text", "path": str(path), "tokenizer": tokenizer, "vocab_size": 300,
                          "block_size": 16})
        model = GPT(vocab_size=task.tokenizer.vocab_size, block_size=16, n_layers=1, n_heads=2, d_model=16,
                    rng=np.random.default_rng(0), dtype=np.float64)
        count = ByteCount(task.token_bytes())
        loss, n = mean_loss(model, task.eval_batches("val", 8), count)
        nats = n_bytes = 0.0
        for batch in task.eval_batches("val", 8):
            logits = model(**batch.inputs)
            logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            nll = -np.take_along_axis(logp, batch.targets[..., None], -1)[..., 0]
            b = task.token_bytes()[batch.targets]
            nats, n_bytes = nats + nll[b > 0].sum(), n_bytes + b.sum()
        assert count.bpb == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-9)
        if tokenizer == "char" and n_bytes == n:                # ASCII validation text: bits per character
            assert count.bpb == pytest.approx(loss / math.log(2), rel=1e-9)


# -- runs and commands -------------------------------------------------------------------------------------------
def weights(run):
    from safetensors.numpy import load_file
    return load_file(str(run / "checkpoint.safetensors"))


def test_a_bpe_text_run_trains_resumes_bit_exact_generates_evaluates_and_exports(tmp_path, run_cli):
    path = corpus(tmp_path)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    config = tiny_config({"path": str(path)})
    summary = Trainer(config, straight, quiet=True).train()
    assert summary["best_val_bpb"] > 0
    Trainer(config, resumed, quiet=True).train(stop_after=4)
    Trainer(None, resumed, resume=True, quiet=True).train()
    a, b = weights(straight), weights(resumed)
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
    document = json.loads((straight / "tokenizer.json").read_text(encoding="utf-8"))
    assert "model" in document and "type" not in document                 # the plain Hugging Face document
    evals = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert any("val_bpb" in r or "val_bpb_estimate" in r for r in evals)

    rc, out, _ = run_cli("generate", straight, "--prompt", "the king", "--max-new-tokens", "12", "--seed", "0")
    assert rc == 0 and out.startswith("the king")
    rc, out, _ = run_cli("eval", straight, "--json")
    result = json.loads(out)
    assert rc == 0 and result["bits_per_byte"] == pytest.approx(summary["best_val_bpb"], rel=1e-6)

    transformers = pytest.importorskip("transformers")
    rc, _, _ = run_cli("export", straight, "--out", tmp_path / "hf")
    assert rc == 0
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    tok = ByteLevelBPE.from_dict(document)
    text = "the queen sings of spring, 12 times! <|endoftext|> é"
    assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text)
    assert hf.eos_token == END_OF_TEXT


RSS_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    from numformer.train import Trainer
    folder, run, cap_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
    config = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
              "data": {"task": "text", "tokens_dir": folder, "block_size": 32},
              "train": {"max_steps": 40, "batch_size": 16, "eval_every": 20, "eval_batches": 2, "processes": 1}}
    trainer = Trainer(config, run, quiet=True)
    def data_kb():
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmData")).split()[1])
    capped = True
    try:         # the memory cap: the process may allocate at most cap_mb more (file-backed maps do not count)
        limit = (data_kb() + cap_mb * 1024) * 1024
        resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.getrlimit(resource.RLIMIT_DATA)[1]))
    except (OSError, ValueError, StopIteration):
        capped = False
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    trainer.train()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"before_kb": before, "after_kb": after, "capped": capped}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and RLIMIT_DATA (Linux)")
def test_a_token_file_larger_than_the_memory_cap_trains_with_bounded_memory(tmp_path):
    """A 192 MB training token file, a memory cap of 48 MB on the training process: training reads windows
    from the file, and the peak resident memory grows by less than the cap."""
    tok = ByteLevelBPE.train(" ".join(WORDS) * 20, 300)
    folder, n = tmp_path / "tokens", 96 << 20                  # 96 M uint16 ids = 192 MB
    rng = np.random.default_rng(0)
    blocks = (rng.integers(0, 300, size=1 << 22) for _ in range(n >> 22))
    write_tokens_dir(folder, {"train": blocks, "val": [rng.integers(0, 300, size=4096).tolist()]}, tok.to_dict(),
                     np.uint16, {})
    assert (folder / "train.bin").stat().st_size == 2 * n
    cap_mb = 48
    done = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(folder), str(tmp_path / "run"), str(cap_mb)],
                          capture_output=True, text=True, env=src_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rss = json.loads(done.stdout.strip().splitlines()[-1])
    assert rss["after_kb"] - rss["before_kb"] < cap_mb * 1024, rss
    assert rss["capped"] or sys.platform != "linux"


def test_write_token_file_in_batches(tmp_path, monkeypatch):
    import numformer.data.token_files as token_files
    monkeypatch.setattr(token_files, "WRITE_BATCH", 5)
    n = write_token_file(tmp_path / "t.bin", ([i, i + 1, i + 2] for i in range(0, 30, 3)), np.uint16)
    f = TokenFile(tmp_path / "t.bin", np.uint16)
    assert n == len(f) == 30 and f[:].tolist() == list(range(30)) and f[np.array([[1, 2], [28, 29]])].shape == (2, 2)
    with pytest.raises(ValueError, match="does not fit a uint16"):
        write_token_file(tmp_path / "u.bin", [[70000]], np.uint16)
    (tmp_path / "odd.bin").write_bytes(b"abc")
    with pytest.raises(ValueError, match="not a whole number of uint16 ids"):
        TokenFile(tmp_path / "odd.bin", np.uint16)


# -- IMDB --------------------------------------------------------------------------------------------------------
def fake_imdb(root, n=60):
    """An aclImdb folder: train/pos, train/neg, train/unsup, and test reviews that must never be read (one of
    them is not UTF-8, so reading it would fail)."""
    rng = np.random.default_rng(0)
    for split, folder, rating in (("train", "pos", 8), ("train", "neg", 2), ("train", "unsup", 0),
                                  ("test", "pos", 9), ("test", "neg", 1)):
        d = root / "aclImdb" / split / folder
        d.mkdir(parents=True)
        for i in range(n):
            words = " ".join(rng.choice(WORDS, size=40))
            text = f"{'TESTONLY ' if split == 'test' else ''}{words}<br /><br />{folder} review {i}."
            (d / f"{i}_{rating}.txt").write_text(text, encoding="utf-8")
    (root / "aclImdb" / "test" / "neg" / "999_1.txt").write_bytes(b"\xff\xfe broken")
    return root / "aclImdb"


def test_imdb_lm_trains_on_training_reviews_and_never_reads_the_test_reviews(tmp_path):
    path = fake_imdb(tmp_path)
    data = {"task": "imdb_lm", "path": str(path), "vocab_size": 320, "block_size": 16, "val_size": 20}
    task = make_task(data, seed=3)
    text = task.tokenizer.decode(task.splits["train"][:])
    val = task.tokenizer.decode(task.splits["val"][:])
    assert "TESTONLY" not in text + val and "TEST" not in "".join(task.tokenizer.vocab)
    assert "unsup review" in text and "<br" not in text and "\n\n" in text     # line breaks, not HTML
    assert val.count(END_OF_TEXT) == 20 and text.count(END_OF_TEXT) == 180 - 20
    assert not set(val.split(END_OF_TEXT)[:-1]) & set(text.split(END_OF_TEXT))
    without = make_task({**data, "unlabelled": False}, seed=3)
    assert "unsup review" not in without.tokenizer.decode(without.splits["train"][:])
    with pytest.raises(ValueError, match="byte-level BPE"):
        make_task({**data, "tokenizer": "char"})


def edit_in_place(path, text):
    """Write ``text`` (of the file's size) into ``path``, keeping the modification times of the file and of the
    folders above it up to its grandparent (as an edit inside an extracted dataset leaves its folder)."""
    stats = {p: p.stat() for p in (path, path.parent, path.parent.parent)}
    assert len(text.encode()) == stats[path].st_size
    path.write_text(text, encoding="utf-8")
    for p, st in stats.items():
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert all(p.stat().st_mtime_ns == st.st_mtime_ns and p.stat().st_size == st.st_size for p, st in stats.items())


def test_a_folder_s_identity_is_its_files_contents(tmp_path):
    """A file of a folder edited in place (same size, every modification time kept) is another folder; a hidden
    file is none of its data (the loaders skip them)."""
    folder = tmp_path / "data"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("first file\n", encoding="utf-8")
    (folder / "sub" / "b.txt").write_text("second file\n", encoding="utf-8")
    (folder / ".DS_Store").write_bytes(b"\0\1")
    before = file_identity(folder)
    edit_in_place(folder / "sub" / "b.txt", "SECOND FILE\n")
    after = file_identity(folder)
    assert after != before and after[0] == str(folder.resolve())
    (folder / ".DS_Store").write_bytes(b"\0\1\2\3")
    assert file_identity(folder) == after


def test_an_imdb_folder_edited_in_place_is_other_data_for_the_token_cache(tmp_path):
    """A training review edited in place (same size, the folders' modification times kept) is another corpus:
    new token files of the new text, not the cached ones of the old."""
    path = fake_imdb(tmp_path, n=40)
    data = {"task": "imdb_lm", "path": str(path), "vocab_size": 300, "block_size": 16, "val_size": 10,
            "unlabelled": False}
    first = make_task(data, seed=3)
    review = path / "train" / "pos" / "0_8.txt"
    edit_in_place(review, "zqxv " * (review.stat().st_size // 5) + " " * (review.stat().st_size % 5))
    again = make_task(data, seed=3)
    assert again.splits["train"].path != first.splits["train"].path
    text = "".join(again.tokenizer.decode(again.splits[s][:]) for s in ("train", "val"))
    assert "zqxv zqxv" in text


def test_a_cache_entry_named_by_a_folder_s_modification_time_is_not_read(tmp_path):
    """The cache entries of a folder named by its path, size and modification time (as numformer named them
    before) are no longer looked up: the task learns its tokenizer anew rather than read them."""
    path = fake_imdb(tmp_path, n=40)
    data = {"task": "imdb_lm", "path": str(path), "vocab_size": 300, "block_size": 16, "val_size": 10,
            "unlabelled": False}
    st = path.stat()
    source = {"task": "imdb_lm", "data": [str(path.resolve()), st.st_size, st.st_mtime_ns], "seed": 3,
              "val_size": 10, "unlabelled": False}
    stale = token_cache("tokenizer", BPE_FORMAT, source, 300, "gpt2") / "tokenizer.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("not the tokenizer of these reviews", encoding="utf-8")
    task = make_task(data, seed=3)
    assert task.tokenizer.vocab_size == 300 and task.splits["train"].path.parent != stale.parent


def test_an_imdb_folder_s_training_reviews_are_the_run_s_data_whether_tokenized_now_or_cached(tmp_path):
    """data_files.json records the training reviews the token files were made from, the same when the cache
    serves them; never the test reviews, which the task does not read."""
    path = fake_imdb(tmp_path, n=40)
    data = {"task": "imdb_lm", "path": str(path), "vocab_size": 300, "block_size": 16, "val_size": 10}
    (path / "train" / "unsup" / "._0_0.txt").write_bytes(b"\0")         # hidden: skipped by the loader
    documents = []
    for _ in ("made", "cached"):
        with fingerprint.reading() as read:
            make_task(data, seed=3)
        documents.append(fingerprint.fingerprint(read, excluded=[token_cache_root()]))
    assert documents[0] == documents[1]
    folders = {e["path"] for e in documents[0]["folders"]} | {os.path.dirname(e["path"]) for e in documents[0]["files"]}
    assert folders == {str((path / "train" / name).resolve()) for name in ("neg", "pos", "unsup")}


# -- the experiments and the benchmark (quick versions) -----------------------------------------------------------
def test_quick_reproduce_imdb_lm(tmp_path, capsys):
    from numformer.cli import main

    path = fake_imdb(tmp_path)
    results, runs = tmp_path / "results", tmp_path / "runs"
    assert main(["reproduce", "imdb_lm", "--quick", "--results", str(results), "--runs", str(runs), "--quiet",
                 "--set", f"data.path={path}", "--set", "data.val_size=20"]) == 0
    record = json.loads((results / "imdb_lm.json").read_text())
    assert record["figures"]["val_bpb"] > 0 and record["figures"]["steps"] > 0
    assert set(record["samples"]) == {"This movie", "I have to say that", "The acting was"}
    page = (results / "imdb_lm.md").read_text()
    assert "Bits per byte" in page and "(quick run)" in page and (results / "figures" / "imdb_lm_loss.png").is_file()
    run = (runs / "imdb_lm").as_posix()                  # the page's commands name the run where it is
    assert f"`numformer eval {run}`" in page and f"`numformer generate {run} --prompt" in page
    assert "[imdb_lm](imdb_lm.md)" in (results / "README.md").read_text()


def test_quick_reproduce_characters_against_bpe(tmp_path, capsys):
    from numformer.cli import main

    results, runs = tmp_path / "results", tmp_path / "runs"
    assert main(["reproduce", "shakespeare_tokenizers", "--quick", "--results", str(results), "--runs", str(runs),
                 "--quiet"]) == 0
    record = json.loads((results / "shakespeare_tokenizers.json").read_text())
    rows = {r["tokenizer"]: r for r in record["rows"]}
    assert set(rows) == {"characters", "BPE 300"}
    assert rows["characters"]["val_bytes"] == rows["BPE 300"]["val_bytes"] == 111_540      # the same text
    assert rows["characters"]["bytes_per_token"] == 1.0 and rows["BPE 300"]["bytes_per_token"] > 1.2
    assert "| characters | 0 | 65 |" in (results / "shakespeare_tokenizers.md").read_text()
    for row in rows.values():       # a loaded machine may leave the 3-second budget no step: no figure assumed
        assert row["epochs"] == row["tokens_seen"] / row["train_tokens"]
        assert row["lowest_val_bpb_estimate"] == bpe_lm.epochs_and_lowest_estimate(row)["lowest_val_bpb_estimate"]


def test_a_rows_epochs_and_lowest_estimate_come_from_its_metrics(tmp_path):
    """The passes over the training tokens, and the lowest periodic validation estimate with its step (a run
    over-fitting after it); a run without estimates has none."""
    lines = [{"step": 10, "train_loss": 3.0}, {"step": 500, "val_bpb_estimate": 2.4},
             {"step": 1000, "val_bpb_estimate": 2.2}, {"step": 1500, "val_bpb_estimate": 2.3}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    figures = {"run_dir": str(tmp_path), "tokens_seen": 3000, "train_tokens": 1200}
    assert bpe_lm.epochs_and_lowest_estimate(figures) == {"epochs": 2.5, "lowest_val_bpb_estimate": 2.2,
                                                          "lowest_estimate_step": 1000}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(lines[0]) + "\n")
    assert bpe_lm.epochs_and_lowest_estimate(figures)["lowest_val_bpb_estimate"] is None
    assert bpe_lm.epochs_and_lowest_estimate({**figures, "run_dir": str(tmp_path / "gone")})["epochs"] == 2.5


def test_tokenizer_benchmark_quick(tmp_path):
    from numformer.bench.runner import run_parts

    done = run_parts(["tokenizer"], quick=True, out_dir=tmp_path, log=lambda *a: None)["tokenizer"]
    row = done["rows"][0]
    assert row["same_merges"] and row["same_ids"] and row["train_numformer_s"] > 0
    assert "## tokenizer" in (tmp_path / "bench.md").read_text()


def test_the_comparison_page_of_runs_without_a_time_budget():
    """`reproduce shakespeare_tokenizers --set train.budget_minutes=0` counts steps: its page says so (it
    crashed formatting a budget of None after every run had trained)."""
    row = {"tokenizer": "characters", "seed": 0, "vocab_size": 65, "parameters": 1000, "steps": 300,
           "tokens_per_s": 1e4, "bytes_per_token": 1.0, "epochs": 1.0, "val_loss": 1.5, "val_bpb": 2.1,
           "val_bytes": 111_540}
    record = {"name": "shakespeare_tokenizers", "description": "d", "command": "c", "date": "today", "commit": "x",
              "machine": {"cores": 2, "cpu": "cpu"}, "budget_minutes": None, "rows": [row], "best": "characters",
              "figures": {"best_val_bpb": 2.1, "char_val_bpb": 2.1}}
    assert "with its tokenizer for its step count" in bpe_lm.comparison_markdown(record)
    assert "with its tokenizer for 10 minutes of wall time" in bpe_lm.comparison_markdown({**record,
                                                                                          "budget_minutes": 10})
