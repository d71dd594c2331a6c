"""Byte-level BPE speed: numformer's tokenizer written in Python against Hugging Face ``tokenizers`` (Rust).

Two corpora: tiny Shakespeare (built in, 1.1 MB) and, when the IMDB tarball is found locally (the data
folder or the cache; nothing is downloaded), its 25,000 training reviews (33 MB). For each:

- **training**: a vocabulary of ``VOCAB`` tokens with GPT-2's split and ``<|endoftext|>``; numformer's fast
  trainer (``train_fast``), its reference (``train_reference``, on the first ``REFERENCE_BYTES`` only, a
  quarter of that with ``--quick``, and at most 1,024 tokens: it recounts every pair after each merge) and
  ``tokenizers``' BpeTrainer, which uses every core. The merges of numformer's trainer and BpeTrainer are
  compared (equal: the tie rule is the same).
- **encoding** the corpus with the trained tokenizer: numformer's ``encode`` with a cold cache (a fresh
  tokenizer, each distinct piece merged once) and a warm one (the same text again), against
  ``tokenizers``' ``encode`` in a loop (one thread) and ``encode_batch`` (every core); the ids are compared.

MB/s = megabytes of UTF-8 text per second of wall time; each encoding figure is the best of ``REPEATS`` runs
(one with ``--quick``), each training timed once. ``--quick``: the first 150 kB of tiny Shakespeare, 512 tokens.
"""
from __future__ import annotations

import json
import os

from ..data.fetch import dataset, find_local
from ..data.text import builtin_corpus_path
from ..data.text_datasets import load_imdb
from ..data.tokenizers import END_OF_TEXT, ByteLevelBPE
from ._measure import best_of

REQUIRES = ("tokenizers", "regex")     # the reference, and numformer's byte-level BPE: refused without them

VOCAB, QUICK_VOCAB = 8192, 512
REFERENCE_BYTES, QUICK_BYTES = 100_000, 150_000     # the reference trainer's text; --quick's corpus
REPEATS = 3


def corpora(quick):
    """{name: list of documents}: tiny Shakespeare, and IMDB's training reviews when found locally."""
    shakespeare = builtin_corpus_path().read_text(encoding="utf-8")
    if quick:
        return {"tiny Shakespeare (first 150 kB)": [shakespeare[:QUICK_BYTES]]}
    out = {"tiny Shakespeare": [shakespeare]}
    found = find_local(dataset("imdb").file("aclImdb_v1.tar.gz"))
    if found is not None:
        out["IMDB training reviews"] = load_imdb(str(found[0]), splits=("train",))["train"].texts
    return out


def _hf_trained(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def measure(name, texts, vocab_size, quick, log):
    megabytes = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    row = {"corpus": name, "documents": len(texts), "megabytes": megabytes, "vocab_size": vocab_size}
    seconds, ours = best_of(lambda: ByteLevelBPE.train(texts, vocab_size))
    row["train_numformer_s"] = seconds
    head = "".join(texts)[:REFERENCE_BYTES // (4 if quick else 1)]
    seconds, _ = best_of(lambda: ByteLevelBPE.train(head, min(vocab_size, 1024), trainer="reference"))
    row["train_reference_s"], row["reference_megabytes"] = seconds, len(head.encode("utf-8")) / 1e6
    seconds, hf = best_of(lambda: _hf_trained(texts, vocab_size))
    row["train_tokenizers_s"] = seconds
    merges = json.loads(hf.to_str())["model"]["merges"]
    row["same_merges"] = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges] == ours.merges
    repeats = 1 if quick else REPEATS
    fresh = [ByteLevelBPE.from_dict(ours.to_dict()) for _ in range(repeats)]     # each with an empty cache
    row["encode_cold_s"], ids = best_of(lambda: fresh.pop().encode_batch(texts), repeats)
    row["encode_warm_s"], _ = best_of(lambda: ours.encode_batch(texts), repeats + 1)   # the first run fills it
    row["encode_tokenizers_loop_s"], hf_ids = best_of(
        lambda: [e.ids for e in map(lambda t: hf.encode(t, add_special_tokens=False), texts)], repeats)
    row["encode_tokenizers_batch_s"], _ = best_of(lambda: hf.encode_batch(texts, add_special_tokens=False), repeats)
    row["same_ids"] = ids == hf_ids if row["same_merges"] else None
    row["tokens"] = sum(map(len, ids))
    if log:
        log(f"  {name}: training {row['train_numformer_s']:.2f} s (tokenizers {row['train_tokenizers_s']:.2f} s), "
            f"encoding {megabytes / row['encode_cold_s']:.2f} MB/s (tokenizers, one thread: "
            f"{megabytes / row['encode_tokenizers_loop_s']:.2f} MB/s)")
    return row


def run(quick=False, log=print):
    import tokenizers   # the reference: a test and benchmark dependency

    vocab = QUICK_VOCAB if quick else VOCAB
    load = [_load_average()]
    rows = [measure(name, texts, vocab, quick, log) for name, texts in corpora(quick).items()]
    load.append(_load_average())
    return {"rows": rows, "tokenizers": tokenizers.__version__,
            "reference_bytes": REFERENCE_BYTES // (4 if quick else 1),
            "repeats": 1 if quick else REPEATS, "load_average": load}


def _load_average():
    """The machine's 1-minute load average (None where the platform has none): how busy the cores were."""
    try:
        return round(os.getloadavg()[0], 1)
    except (AttributeError, OSError):
        return None


def markdown(result, fig_dir):
    lines = ["## tokenizer: byte-level BPE, numformer (Python) against Hugging Face tokenizers (Rust)", "",
             f"Training a vocabulary with GPT-2's split and `<|endoftext|>`, then encoding the corpus with it "
             f"(`numformer.bench.tokenizer`; tokenizers {result['tokenizers']}, whose BpeTrainer and "
             f"`encode_batch` use every core). MB/s: megabytes of UTF-8 text per second; ratio: numformer's "
             f"speed over tokenizers'.", "",
             "| corpus | MB | vocabulary | train: numformer s | tokenizers s | ratio | same merges | "
             "encode: numformer MB/s (cold / warm cache) | tokenizers MB/s (1 thread / batch) | ratio (cold / "
             "1 thread) | same ids |", "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in result["rows"]:
        mb = r["megabytes"]
        cold, warm = mb / r["encode_cold_s"], mb / r["encode_warm_s"]
        loop, batch = mb / r["encode_tokenizers_loop_s"], mb / r["encode_tokenizers_batch_s"]
        lines.append(f"| {r['corpus']} | {mb:.1f} | {r['vocab_size']:,} | {r['train_numformer_s']:.2f} | "
                     f"{r['train_tokenizers_s']:.2f} | {r['train_tokenizers_s'] / r['train_numformer_s']:.2f}x | "
                     f"{'yes' if r['same_merges'] else 'no'} | {cold:.2f} / {warm:.2f} | {loop:.2f} / {batch:.2f} | "
                     f"{cold / loop:.2f}x | {'yes' if r['same_ids'] else 'no'} |")
    load = result.get("load_average") or []
    if any(x is not None for x in load):
        lines += ["", f"Load average of the machine (1 minute) at the start and the end: "
                      f"{' and '.join(str(x) for x in load)} (its cores are in the line below): the ratios compare "
                      f"the two libraries under the same load; on a busier machine than its cores the absolute "
                      f"speeds are lower than on a quiet one."]
    ref = result["rows"][0]
    lines += ["", f"The reference trainer (`train_reference`: every pair recounted after each merge) takes "
                  f"{ref['train_reference_s']:.1f} s for {min(ref['vocab_size'], 1024):,} tokens from the first "
                  f"{ref['reference_megabytes'] * 1000:.0f} kB of {ref['corpus']}; the fast trainer learns the same "
                  f"merges (tests/test_bpe.py)."]
    return "\n".join(lines)
