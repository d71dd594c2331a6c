"""Tokenizers: characters, words, symbols, and byte-level BPE written by hand.

All share one small interface (``base.Tokenizer``)::

    tok.encode(text) -> list[int]          tok.decode(ids) -> str
    tok.encode_batch(texts)                tok.vocab_size
    tok.to_dict() -> JSON-able dict        tokenizer_from_dict(d) -> the same tokenizer

One BPE. ``ByteLevelBPE`` is numformer's byte-level BPE, the algorithm of GPT-2, Llama 3 and Qwen2 written
out (``bpe``, ``bpe_train``, ``byte_level``), read and written as a Hugging Face tokenizer.json
(``hf_json``). It is used in two ways:

- language models (``[data] task = "text"``, ``tokenizer = "bpe"``) use it as it is: ``decode(encode(x))
  == x`` for every text, and the run folder's tokenizer.json is the plain Hugging Face document;
- classifiers and translators use it through ``NormalizedBPE``: the same tokenizer on normalized text
  (lowercased, ``<br />`` removed, as their word tokenizer), with numformer's special ids first
  (``<pad>`` = 0, ``<unk>`` = 1, ...), a prefix space, and a ``decode`` that drops the special tokens and
  strips the spaces around the text.

``PretrainedTokenizer`` wraps Hugging Face ``tokenizers``: ``numformer.interop.hf`` loads every pretrained
model's tokenizer with it (GPT-2's byte-level BPE as well as tokenizers of other kinds); ``tokenizers`` is
otherwise only the tests' reference.
"""
from .base import (BOS, CLS, EOS, OPTIONAL_SPECIALS, PAD, UNK, SpecialsTokenizer, Tokenizer, normalize_text,
                   special_tokens, split_words, token_labels)
from .bpe import ByteLevelBPE
from .bpe_train import count_pieces, merge_pair, most_frequent_pair, train_fast, train_reference
from .byte_level import (END_OF_TEXT, GPT2_PATTERN, GPT4_PATTERN, PATTERNS, PreTokenizer, bytes_to_unicode,
                         compile_pattern, to_byte_chars)
from .hf_json import AddedToken
from .normalized_bpe import NormalizedBPE
from .padding import pad_batch, truncate
from .pretrained import PretrainedTokenizer
from .registry import (TOKENIZER_TYPES, build_tokenizer, is_hf_document, restore_saved_tokenizer,
                       tokenizer_from_dict)
from .simple import CharTokenizer, SymbolTokenizer, UnknownCharacters, WordTokenizer

__all__ = ["BOS", "CLS", "EOS", "OPTIONAL_SPECIALS", "PAD", "UNK", "END_OF_TEXT", "GPT2_PATTERN", "GPT4_PATTERN",
           "PATTERNS", "AddedToken", "ByteLevelBPE", "CharTokenizer", "NormalizedBPE", "PreTokenizer",
           "PretrainedTokenizer", "SpecialsTokenizer", "SymbolTokenizer", "TOKENIZER_TYPES", "Tokenizer",
           "UnknownCharacters", "WordTokenizer", "build_tokenizer", "bytes_to_unicode", "compile_pattern", "count_pieces", "is_hf_document",
           "normalize_text", "pad_batch", "restore_saved_tokenizer", "special_tokens", "split_words", "to_byte_chars",
           "token_labels",
           "tokenizer_from_dict", "train_fast", "train_reference", "truncate",
           "merge_pair", "most_frequent_pair"]
