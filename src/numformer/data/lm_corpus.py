"""A language model's corpus as documents, tokenized once with byte-level BPE and kept as token files.

A corpus is a sequence of documents (a text file, a review); each split ("train", "val") is a stream of
them. ``bpe_token_files`` makes the split's token files: every document is encoded (its text, where a
written ``<|endoftext|>`` counts as the document separator it stands for and every other special token as
plain text) and followed by the end-of-text token, as nanoGPT's prepare scripts do, and the ids are written
to a token file chunk by chunk, so neither the text nor its ids need to fit in memory.

What is built is kept in numformer's cache (``token_files.token_cache``) under a name made of what it was
made from, so that the next run, ``numformer eval`` or a resumed run reads the token files instead of
encoding the corpus again:

- the tokenizer learnt from the training split, named by the corpus (its files' paths, sizes and SHA-256, in
  order: a file replaced by other text of the same size and modification time, as ``cp -p`` or ``rsync -t``
  leave it, is another corpus), the split and the BPE settings;
- the token files, named by the corpus, the split and the tokenizer's content.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from ..run_files import CHECKPOINT, DATA_FILES, MODEL
from .files import folder_files, iter_text
from .fingerprint import digest as file_digest, note, note_sequence
from .notices import say
from .token_files import read_tokens_dir, token_cache, token_dtype, write_tokens_dir
from .tokenizers import END_OF_TEXT, PATTERNS, ByteLevelBPE, compile_pattern

BPE_FORMAT = 1          # raised when a change of the trainer or of the token files makes old cache entries wrong


@dataclass
class Document:
    """One document of a split: its text as a str or as an iterable of str chunks, and whether the document
    ends here (False for the first part of a document cut by the train/validation split)."""

    text: object
    ends: bool = True


RUN_FOLDER_FILES = (CHECKPOINT, MODEL, DATA_FILES)      # beside a config.json: a numformer run folder


def file_identity(path, members=None) -> list:
    """The data at ``path`` named by their content, for a cache key. A file: [path, size, SHA-256] (a file edited
    or replaced since, whatever its size and modification time, is another corpus). A folder (an extracted
    dataset): [path, number of files, bytes, SHA-256 of each file's path relative to the folder, size and
    SHA-256], of ``members`` (the files of the folder that a task reads) or else of ``files.folder_files`` (every
    file in it, recursively, hidden ones skipped); a file of it edited, added, removed or renamed is another folder,
    whatever the folder's modification time. The files count among a run's data (``fingerprint.note``) whether
    their tokenization is made now or found in the cache; each digest is data_files.json's (hashed once)."""
    resolved = str(Path(path).resolve())
    if not Path(path).is_dir():
        note(path)
        return [resolved, os.stat(path).st_size, file_digest(path)]
    files = sorted((os.path.relpath(f, path), f) for f in (folder_files(path) if members is None else members))
    summary, total = hashlib.sha256(), 0
    for relative, f in files:
        note(f)
        size = os.stat(f).st_size
        summary.update(f"{Path(relative).as_posix()}\0{size}\0{file_digest(f)}\n".encode("utf-8", "surrogateescape"))
        total += size
    return [resolved, len(files), total, summary.hexdigest()]


def corpus_sequence(files: list, given: str) -> list:
    """``files`` (the corpus's files, in the order they are joined; ``given``: the [data] path or paths that named
    them), counted as one sequence of the run's data (``fingerprint.note_sequence``: another order or a copy
    added is other data). A numformer run folder among them (a config.json beside a checkpoint, weights or
    data_files.json) is one ValueError: its files are no text, and a run written into its data folder changes
    the data of the next run, --resume and eval."""
    for f in files:
        p = Path(f)
        if p.name in RUN_FOLDER_FILES and (p.parent / "config.json").is_file():
            raise ValueError(f"[data] path {given}: {p.parent} is a numformer run folder (config.json and "
                             f"{p.name}), not text; move the run folder out of the data folder (and give --out a "
                             f"folder outside it)")
    note_sequence(files)
    return files


class TextFiles:
    """The corpus of ``task = "text"``: its files, each a document, the first ``1 - val_fraction`` of all their
    characters for training and the rest for validation (as the character-level split)."""

    def __init__(self, files, encoding: str, val_fraction: float):
        self.files, self.encoding, self.val_fraction = [str(f) for f in files], encoding, val_fraction
        self._lengths = None

    def identity(self) -> dict:
        return {"files": [file_identity(f) for f in self.files], "encoding": self.encoding,
                "val_fraction": self.val_fraction}

    def lengths(self) -> list[int]:
        """The characters of each file (read once, in chunks)."""
        if self._lengths is None:
            self._lengths = [sum(map(len, iter_text(f, self.encoding))) for f in self.files]
        return self._lengths

    def documents(self, split: str):
        """The split's documents: whole files, and the part of the file that holds the cut."""
        lengths = self.lengths()
        cut = int(sum(lengths) * (1.0 - self.val_fraction))
        start = 0
        for path, n in zip(self.files, lengths):
            lo, hi = (start, min(start + n, cut)) if split == "train" else (max(start, cut), start + n)
            if lo < hi:
                yield Document(self._chars(path, lo - start, hi - start), ends=hi == start + n)
            start += n

    def _chars(self, path, lo, hi):
        """Characters lo..hi of a file, in chunks."""
        pos = 0
        for chunk in iter_text(path, self.encoding):
            a, b = max(lo - pos, 0), min(hi - pos, len(chunk))
            if a < b:
                yield chunk[a:b]
            pos += len(chunk)
            if pos >= hi:
                return


def encode_documents(tokenizer: ByteLevelBPE, documents: Iterable[Document]):
    """Lists of ids: each document's, and the end-of-text token after each document that ends (a written
    ``<|endoftext|>`` already there is not doubled)."""
    eot = tokenizer.eos_id
    allowed = {tokenizer.id_to_token[eot]} if eot is not None else set()
    for doc in documents:
        last = None
        chunks = tokenizer.encode_chunks([doc.text] if isinstance(doc.text, str) else doc.text, allowed)
        for ids in chunks:
            if ids:
                last = ids[-1]
                yield ids
        if doc.ends and eot is not None and last != eot:
            yield [eot]


def bpe_token_files(source: dict, documents: Callable, vocab_size: int, pattern: str, tokenizer_state=None):
    """(tokenizer, {"train": TokenFile, "val": TokenFile}) of a corpus; ``source`` names the corpus and its
    split (JSON-able), ``documents(split)`` yields its ``Document`` s. The tokenizer is ``tokenizer_state``'s,
    or learnt from the training split (``vocab_size`` tokens, the split ``pattern``, ``<|endoftext|>``)."""
    if tokenizer_state is not None:
        tokenizer = ByteLevelBPE.from_dict(tokenizer_state)
    else:
        tokenizer = _learnt_tokenizer(source, documents, vocab_size, pattern)
    document = tokenizer.to_dict()
    digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()
    folder = token_cache("token files", BPE_FORMAT, source, digest)
    if not (folder / "meta.json").is_file():
        say(f"encoding the corpus into token files ({folder})")
        write_tokens_dir(folder, {split: encode_documents(tokenizer, documents(split)) for split in ("train", "val")},
                         document, token_dtype(tokenizer.vocab_size), source)
    return tokenizer, read_tokens_dir(folder)[0]


def check_pattern(pattern: str) -> None:
    """``[data] pattern``: a name of ``PATTERNS`` or a regular expression. A plain word close to a name
    (``gpt3``, ``gpt-4``, ``GPT2``) is refused: as a regex it would match only itself, so the text would
    not be split into words and the BPE would learn merges across them without a word of warning."""
    if pattern in PATTERNS:
        return
    if re.fullmatch(r"[\w\- .]+", pattern):
        scores = {name: difflib.SequenceMatcher(None, pattern.lower(), name).ratio() for name in PATTERNS}
        best = max(scores.values())
        if best >= 0.6:
            names = " or ".join(f'"{n}"' for n in sorted(PATTERNS) if scores[n] == best)
            raise ValueError(f"[data] pattern = {pattern!r} is not a known split pattern: did you mean {names}? "
                             f"(the names are {', '.join(map(repr, PATTERNS))}; anything else is a regex)")
    try:
        compile_pattern(pattern)
    except ValueError as e:
        raise ValueError(str(e).replace("split pattern ", "[data] pattern = ", 1)) from None


def check_bpe_vocab_size(vocab_size: int) -> None:
    """A byte-level BPE holds the 256 bytes and ``<|endoftext|>``: a smaller ``[data] vocab_size`` is one
    error before any data is read or downloaded."""
    if vocab_size < 257:
        raise ValueError(f"[data] vocab_size = {vocab_size} is too small for a byte-level BPE, which holds the "
                         f"256 bytes and {END_OF_TEXT}: set it to 257 or more (e.g. 4096)")


def _check_pattern_matches(documents, pattern: str, sample_chars: int = 1 << 20) -> None:
    """One error naming ``[data] pattern`` when the regex matches nothing in the start of the training
    split: each document would then be a single piece, and the BPE would learn whole texts as tokens."""
    if pattern in PATTERNS:
        return
    text = _start_of(documents("train"), sample_chars)
    rx = compile_pattern(pattern)
    if text and not any(m.end() > m.start() for m in rx.finditer(text)):
        raise ValueError(f"[data] pattern = {pattern!r} matches nothing in the training text, so it would not "
                         f"split it into words; use \"gpt2\", \"gpt4\" or a regex that matches its words")


def _start_of(documents, n: int) -> str:
    """The first ``n`` characters of a stream of documents (fewer when it is shorter)."""
    out, size = [], 0
    for doc in documents:
        for chunk in [doc.text] if isinstance(doc.text, str) else doc.text:
            out.append(chunk[:n - size])
            size += len(out[-1])
            if size >= n:
                return "".join(out)
    return "".join(out)


def _learnt_tokenizer(source, documents, vocab_size, pattern):
    path = token_cache("tokenizer", BPE_FORMAT, source, vocab_size, pattern) / "tokenizer.json"
    if path.is_file():
        return ByteLevelBPE.from_file(path)
    _check_pattern_matches(documents, pattern)
    say(f"learning a byte-level BPE of {vocab_size:,} tokens from the training split")
    texts = (d.text if isinstance(d.text, str) else d.text for d in documents("train"))
    tokenizer = ByteLevelBPE.train(texts, vocab_size, pattern=pattern, special_tokens=(END_OF_TEXT,))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tokenizer.{os.getpid()}.tmp")
    tokenizer.save(tmp)
    os.replace(tmp, path)
    return tokenizer

