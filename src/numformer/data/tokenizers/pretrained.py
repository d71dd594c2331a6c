"""``PretrainedTokenizer``: a Hugging Face ``tokenizers`` tokenizer, for pretrained models (``numformer.interop.hf``
loads every model folder's tokenizer.json, or GPT-2's vocab.json + merges.txt, with it, byte-level BPE or not).
Needs ``tokenizers``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import numpy as np

from ..._install import require
from ..._limits import MAX_JSON_BYTES, bounded_json
from .base import BOS, EOS, Tokenizer, word_piece_label
from .bpe import ByteLevelBPE


# The files of a Hugging Face model folder beside its weights and tokenizer that say how the model is used:
# its special tokens and chat template (tokenizer_config.json, special_tokens_map.json, chat_template.jinja,
# additional_chat_templates/NAME.jinja) and its generation settings (generation_config.json).
SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json", "chat_template.jinja")
TEMPLATES_DIR = "additional_chat_templates"


def is_side_file(name):
    """Whether ``name`` (a path in a model folder, / between folders) is a side file's: one of ``SIDE_FILES``,
    or an additional chat template ``additional_chat_templates/NAME.jinja`` (NAME an identifier, - allowed)."""
    folder, _, file = name.rpartition("/")
    return name in SIDE_FILES or (folder == TEMPLATES_DIR and file.endswith(".jinja") and
                                  file.removesuffix(".jinja").replace("-", "_").isidentifier())


def check_side_files(files):
    """``files`` if it is a {name: JSON object or text} of side files' names (``is_side_file``), else a
    TypeError: the names become paths when ``export`` writes them, so an edited tokenizer.json must not name a
    file elsewhere."""
    if not isinstance(files, dict) or not all(isinstance(k, str) and is_side_file(k) and isinstance(v, (dict, str))
                                              for k, v in files.items()):
        raise TypeError(f"files is not an object of a Hugging Face model's side files ({', '.join(SIDE_FILES)}, "
                        f"{TEMPLATES_DIR}/NAME.jinja) and their JSON objects or texts")
    return files


def side_files(folder):
    """The ``SIDE_FILES`` of a Hugging Face model folder that it has, and its additional chat templates:
    {name: JSON object, or the text of a .jinja file}; one ValueError naming a file that is not valid."""
    folder, files = Path(folder), {}
    names = list(SIDE_FILES) + [f"{TEMPLATES_DIR}/{p.name}" for p in sorted((folder / TEMPLATES_DIR).glob("*.jinja"))]
    for name in names:
        path = folder / name
        if not path.is_file():
            continue
        if name.endswith(".jinja"):
            data = path.read_bytes()
            if len(data) > MAX_JSON_BYTES:
                raise ValueError(f"{path} is {len(data):,} bytes, more than numformer reads "
                                 f"({MAX_JSON_BYTES:,}); it is no chat template: restore it")
            try:                                # as transformers reads it: bad bytes are an error, not replaced
                files[name] = data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); restore it, or give a "
                                 f"template with --chat-template FILE") from None
            continue
        data = bounded_json(path.read_bytes(), str(path))
        if not isinstance(data, dict):
            raise ValueError(f"{path} is a JSON {type(data).__name__}, not an object; restore it")
        files[name] = data
    return files


def _hf():
    require(("tokenizers",), "this tokenizer (Hugging Face `tokenizers`)")
    import tokenizers
    return tokenizers


class PretrainedTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer (``hf_tokenizer``) used exactly as its model was trained with
    it (``numformer.interop.hf``): its own normalizer and pre-tokenizer, no special ids of numformer's own;
    ``encode`` adds no special tokens (``add_special_tokens=False``; ``encode_prompt`` adds them, as
    transformers does to a prompt). For byte-level BPE (GPT-2's)
    ``decode`` keeps every space, so ``decode(encode(text)) == text``; other kinds of tokenizer may not
    give the text back (a word-level one joins its tokens with spaces).

    ``eos_id`` / ``bos_id``: the model's end / start token ids (GPT-2: 50256, ``<|endoftext|>``), or None;
    ``special_id("<eos>")`` / ``special_id("<bos>")`` give them too. ``eos_ids``: every id of the model's
    ``eos_token_id`` (Llama 3 Instruct lists three). ``files``: the model folder's files beside the tokenizer
    that say how the model is used (``SIDE_FILES``: tokenizer_config.json's special tokens and chat template,
    generation_config.json ...; JSON objects, or text for a .jinja template), carried through the run folders
    made from the model (its tokenizer.json) to ``numformer chat`` and ``export``.
    """

    _build_hint = " (the model's config.json names no such id)"

    def __init__(self, hf_tokenizer, eos_id=None, bos_id=None, eos_ids=None, files=None):
        self.hf = hf_tokenizer
        self.eos_id, self.bos_id = eos_id, bos_id
        self.eos_ids = [eos_id] if eos_ids is None and eos_id is not None else list(eos_ids or [])
        self.files = dict(files or {})
        self.special_ids = {t: i for t, i in ((EOS, eos_id), (BOS, bos_id)) if i is not None}

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt as transformers' ``tokenizer(text)`` encodes it: with the special tokens of the tokenizer's
        post-processor (Llama's and Gemma's BOS; GPT-2's and Qwen's add none), which the model saw in training
        before every text."""
        return self.hf.encode(text, add_special_tokens=True).ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids, skip_special: bool = False) -> str:
        """The text of ``ids``. An id past the vocabulary (a padded embedding's row, such as Qwen's 151,665 …
        151,935) has no token and decodes to nothing, as in transformers; a negative id is a ValueError."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1).tolist()
        if any(i < 0 for i in ids):
            raise ValueError(f"id {min(ids)} is negative: token ids start at 0")
        return self.hf.decode([i for i in ids if i < self.vocab_size], skip_special_tokens=skip_special)

    def token_bytes(self) -> np.ndarray | None:
        """UTF-8 bytes per id when the tokenizer is byte-level BPE (GPT-2's); else None (no bits per byte)."""
        if not hasattr(self, "_token_bytes"):
            try:
                table = ByteLevelBPE.from_dict(json.loads(self.hf.to_str())).token_bytes()
                self._token_bytes = np.pad(table, (0, max(0, self.vocab_size - len(table))))
            except (ValueError, KeyError, TypeError, AttributeError):
                self._token_bytes = None
        return self._token_bytes

    def piece_label(self, i: int) -> str:
        piece = self.hf.id_to_token(i) or "?"
        return word_piece_label(piece, self.hf.decode([i], skip_special_tokens=False))

    def to_hf_json(self) -> str:
        """The tokenizer.json document (``numformer export`` writes it)."""
        return self.hf.to_str()

    def token(self, i: int) -> str:
        return self.hf.id_to_token(i)

    def to_dict(self) -> dict:
        state = {"type": "hf", "hf_json": self.hf.to_str(), "eos_id": self.eos_id, "bos_id": self.bos_id}
        if self.eos_ids != ([] if self.eos_id is None else [self.eos_id]):     # more ids than eos_id
            state["eos_ids"] = self.eos_ids
        if self.files:
            state["files"] = self.files
        return state

    @classmethod
    def from_dict(cls, d: dict) -> "PretrainedTokenizer":
        hf_json, files, eos_ids = d["hf_json"], d.get("files", {}), d.get("eos_ids")
        if not isinstance(hf_json, str):
            raise TypeError(f"hf_json is a {type(hf_json).__name__}, not a string")
        check_side_files(files)
        if eos_ids is not None and not (isinstance(eos_ids, list) and all(type(i) is int for i in eos_ids)):
            raise TypeError("eos_ids is not a list of token ids")
        try:
            tokenizer = _hf().Tokenizer.from_str(hf_json)
        except Exception as e:   # noqa: BLE001 -- the tokenizers library raises a bare Exception for bad JSON
            raise ValueError(f"hf_json is not a Hugging Face tokenizer ({' '.join(str(e).split())})") from None
        return cls(tokenizer, d.get("eos_id"), d.get("bos_id"), eos_ids, files)
