"""The Hugging Face tokenizer.json format of a byte-level BPE tokenizer, read and written.

A tokenizer.json is one JSON object::

    {"version": "1.0", "truncation": null, "padding": null,
     "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": true, ...}],
     "normalizer": null,                       # or NFC, Lowercase, Replace, a Sequence ...
     "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true, ...},
     "post_processor": ..., "decoder": {"type": "ByteLevel", ...},
     "model": {"type": "BPE", "vocab": {"!": 0, ...}, "merges": ["Ġ t", "h e", ...], ...}}

``tokenizers`` refuses unknown top-level keys, so numformer writes exactly these and nothing around them.
Merges are written as "left right" strings, the form every version of ``tokenizers`` reads (a byte-level
token never holds a space: the space is "Ġ"), or as ``[left, right]`` lists when a merge's token does hold
one; both forms are read.
Options of the BPE model or of the pre-tokenizer that ``ByteLevelBPE`` does not implement (dropout, byte
fallback, a continuing-subword prefix, ...) are refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ... import _limits
from .byte_level import PreTokenizer, normalizer_from_hf, normalizer_to_hf, unicode_to_bytes

MAX_FILE_BYTES = 64 << 20            # a tokenizer.json larger than this is not one (Qwen2's is 7 MB)
MAX_ID = 1 << 22                     # ids up to 4M (the largest vocabularies hold about 260k tokens)
_NEUTRAL_MODEL_OPTIONS = {"dropout": (None, 0.0), "continuing_subword_prefix": (None, ""),
                          "end_of_word_suffix": (None, ""), "byte_fallback": (False, None),
                          "fuse_unk": (False, None)}


@dataclass(frozen=True)
class AddedToken:
    """A token matched in the text before any split (tokenizer.json's ``added_tokens``): ``special`` tokens
    (``<|endoftext|>``) are the ones ``allowed_special`` governs and ``decode(skip_special=True)`` drops.
    ``normalized``: False, matched in the raw text; True, matched after the normalizer, in the normalized
    text, as normalized itself (as ``tokenizers`` does; see ``ByteLevelBPE``)."""

    content: str
    id: int
    special: bool = True
    normalized: bool = False

    def to_hf(self) -> dict:
        return {"id": self.id, "content": self.content, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": self.normalized, "special": self.special}


def document(bpe) -> dict:
    """The tokenizer.json document of a ``ByteLevelBPE``."""
    fields = bpe.hf_fields
    spaced = any(" " in t for pair in bpe.merges for t in pair)
    model = {"type": "BPE", "dropout": None, "unk_token": bpe.unk_token, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             **({"ignore_merges": True} if bpe.ignore_merges else {}),
             "vocab": dict(sorted(bpe.vocab.items(), key=lambda kv: kv[1])),
             "merges": [list(m) for m in bpe.merges] if spaced else [f"{a} {b}" for a, b in bpe.merges]}
    byte_level = {"type": "ByteLevel", "add_prefix_space": bpe.pre_tokenizer.byte_level.add_prefix_space,
                  "trim_offsets": True, "use_regex": True}
    return {"version": fields.get("version", "1.0"), "truncation": fields.get("truncation"),
            "padding": fields.get("padding"), "added_tokens": [t.to_hf() for t in bpe.added_tokens],
            "normalizer": normalizer_to_hf(bpe.normalizer), "pre_tokenizer": bpe.pre_tokenizer.to_hf(),
            "post_processor": fields.get("post_processor"), "decoder": fields.get("decoder", byte_level),
            "model": model}


def parse_document(doc) -> dict:
    """The ``ByteLevelBPE`` arguments of a tokenizer.json document; one ValueError naming what is wrong."""
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise ValueError("not a Hugging Face tokenizer.json (no \"model\" object)")
    model = doc["model"]
    if model.get("type", "BPE") != "BPE" or "merges" not in model:
        raise ValueError(f"its model is {model.get('type')!r}, not BPE")
    for key, neutral in _NEUTRAL_MODEL_OPTIONS.items():
        if model.get(key) not in neutral:
            raise ValueError(f"its BPE model sets {key} = {model[key]!r}, which numformer's ByteLevelBPE does not "
                             f"implement")
    decoder = doc.get("decoder")
    if not (isinstance(decoder, dict) and decoder.get("type") == "ByteLevel"):
        kind = decoder.get("type") if isinstance(decoder, dict) else decoder
        raise ValueError(f"its decoder is {kind!r}, not ByteLevel: not a byte-level BPE tokenizer")
    vocab = model["vocab"]
    if not (isinstance(vocab, dict) and all(isinstance(k, str) and type(v) is int and 0 <= v < MAX_ID
                                            for k, v in vocab.items())):
        raise ValueError(f"its vocab is not an object of token: id (an integer in [0, {MAX_ID:,}))")
    missing = [c for c in unicode_to_bytes() if c not in vocab]
    if missing and model.get("unk_token") is None:
        raise ValueError(f"its vocabulary lacks {len(missing)} of the 256 byte characters (e.g. {missing[0]!r}) "
                         f"and has no unk_token: not a byte-level vocabulary")
    return {"vocab": vocab, "merges": [_merge(m) for m in model["merges"]],
            "added_tokens": [_added_token(t) for t in doc.get("added_tokens") or []],
            "pre_tokenizer": PreTokenizer.from_hf(doc.get("pre_tokenizer")),
            "normalizer": normalizer_from_hf(doc.get("normalizer")),
            "ignore_merges": bool(model.get("ignore_merges", False)), "unk_token": model.get("unk_token"),
            "hf_fields": {k: doc.get(k) for k in ("version", "truncation", "padding", "post_processor", "decoder")
                          if k in doc}}


def _merge(m):
    if isinstance(m, str):
        parts = m.split(" ")
        if len(parts) != 2:
            raise ValueError(f"merge {m!r} is not two tokens separated by one space")
        return tuple(parts)
    if isinstance(m, (list, tuple)) and len(m) == 2 and all(isinstance(t, str) for t in m):
        return tuple(m)
    raise ValueError(f"merge {m!r} is neither \"left right\" nor [left, right]")


def _added_token(t) -> AddedToken:
    for key in ("single_word", "lstrip", "rstrip"):
        if t.get(key):
            raise ValueError(f"added token {t.get('content')!r} sets {key} = true, which numformer's ByteLevelBPE "
                             f"does not implement")
    if not isinstance(t.get("content"), str) or not t["content"] or type(t.get("id")) is not int \
            or not 0 <= t["id"] < MAX_ID:
        raise ValueError(f"added token {str(t)[:80]} needs a non-empty content and an id in [0, {MAX_ID:,})")
    return AddedToken(t["content"], t["id"], bool(t.get("special", False)), bool(t.get("normalized", False)))


def read_json_file(path, what="tokenizer file"):
    """A JSON file's object; one ValueError naming the file for a missing, oversized, non-UTF-8, too deeply
    nested or malformed file (``_limits.read_json_file``)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no {what} at {path}")
    return _limits.read_json_file(path, what, max_bytes=MAX_FILE_BYTES)


def read_vocab_merges(vocab_path, merges_path) -> tuple[dict, list]:
    """GPT-2's vocab.json ({token: id}) and merges.txt (a "#version" line, then "left right" per line)."""
    vocab = read_json_file(vocab_path, "vocabulary file")
    if not isinstance(vocab, dict):
        raise ValueError(f"{vocab_path} is not a JSON object of token: id")
    merges = []
    text = Path(merges_path).read_text(encoding="utf-8")
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or (n == 1 and line.startswith("#version")):
            continue
        try:
            merges.append(_merge(line))
        except ValueError as e:
            raise ValueError(f"{merges_path}, line {n}: {e}") from None
    return vocab, merges
