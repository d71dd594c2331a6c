"""Byte-level BPE written by hand (numformer.data.tokenizers.ByteLevelBPE) against Hugging Face `tokenizers`.

The references are made here, offline, by `tokenizers` itself: GPT-2-format files (vocab.json + merges.txt),
tokenizer.json files in the styles of GPT-2, Llama 3 (a Split regex, then ByteLevel; ignore_merges; special
tokens beyond the vocabulary) and Qwen2 (NFC, single digits), and BpeTrainer's own training.
"""
from __future__ import annotations

import json
import unicodedata

import pytest

from numformer.data.tokenizers import (END_OF_TEXT, GPT4_PATTERN, ByteLevelBPE, NormalizedBPE, bytes_to_unicode,
                                       tokenizer_from_dict, train_fast, train_reference)
from numformer.data.tokenizers.bpe_train import count_pieces
from numformer.data.tokenizers.byte_level import PreTokenizer, byte_alphabet

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog doesn't mind; it's lazy, isn't it?",
    "I'll say it again: we've seen 1234567 foxes and 89 dogs in 2024!!! Numbers: 3.14159, 2,718.",
    "Ünïcödé: naïve café, Straße, Ελληνικά, русский текст, 日本語のテキスト, 한국어, العربية, हिन्दी.",
    "Emoji 🙂🙃👍🏽 and 👩‍👩‍👧 families; tabs\tand\t\ttabs; newlines\n\n\nand   spaces     galore.",
    "Code: def f(x):\n    return x ** 2  # square\n\nprint(f(12))",
] * 8
TEXTS = [
    "Hello world", " leading space", "trailing spaces   ", "  two  spaces  between ", "\n\nnew\nlines\r\n",
    "don't won't I'm you're we've they'll she'd IT'S", "12345678901234567890 3.14 1,000,000",
    "naïve café Ünïcödé Straße ÆØÅ", "日本語のテキスト 中文 한국어", "Ελληνικά русский", "🙂🙃👍🏽👩‍👩‍👧 emoji!",
    "tabs\tand\t\ttabs", "mixed: x=1; y = [1, 2, 3]  # comment", "", "a", "   ", "\u00a0nbsp\u2003em space",
    "zebra xylophone quokka", "<|endoftext|> inside text <|endoftext|>", "ends with special<|endoftext|>",
]
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")


def hf_trained(pre_tokenizer, vocab_size=600, specials=(END_OF_TEXT,), normalizer=None, ignore_merges=False,
               min_frequency=0, texts=CORPUS):
    """A byte-level BPE tokenizer trained by `tokenizers` (BpeTrainer) on ``texts``."""
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials), min_frequency=min_frequency,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def gpt2_style():
    return hf_trained(pre_tokenizers.ByteLevel(add_prefix_space=False))


def llama3_style():
    """Split regex + ByteLevel without regex, ignore_merges, special tokens added after the vocabulary."""
    tok = hf_trained(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), specials=(), ignore_merges=True)
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"])
    return tok


def qwen2_style():
    tok = hf_trained(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), specials=(), normalizer=normalizers.NFC())
    tok.add_special_tokens([END_OF_TEXT, "<|im_start|>", "<|im_end|>"])
    return tok


def ours(hf_tok) -> ByteLevelBPE:
    return ByteLevelBPE.from_dict(json.loads(hf_tok.to_str()))


def assert_same_ids(hf_tok, tok, texts=TEXTS):
    for text in texts:
        expected = hf_tok.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == expected, text
        assert tok.decode(expected) == hf_tok.decode(expected, skip_special_tokens=False), text


# -- the byte trick and the split ------------------------------------------------------------------------------
def test_bytes_to_unicode_is_gpt2s_map():
    table = bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord("a")] == "a" and table[32] == "Ġ" and table[10] == "Ċ" and table[0] == "Ā"
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert byte_alphabet()[:3] == ["!", '"', "#"] and byte_alphabet()[-1] == chr(256 + 67)


def test_split_patterns():
    gpt2 = PreTokenizer.from_pattern("gpt2")
    assert gpt2.pieces("I'll say  hello world!!! 12345") == ["I", "'ll", " say", " ", " hello", " world", "!!!",
                                                            " 12345"]
    gpt4 = PreTokenizer.from_pattern("gpt4")
    assert gpt4.pieces("I'LL pay 12345\n\nnow") == ["I", "'LL", " pay", " ", "123", "45", "\n\n", "now"]
    assert PreTokenizer.from_pattern(GPT4_PATTERN).pieces("x 1234") == gpt4.pieces("x 1234")
    with pytest.raises(ValueError, match="not a valid regular expression"):
        PreTokenizer.from_pattern("(unclosed")


# -- the same ids as tokenizers --------------------------------------------------------------------------------
def test_gpt2_format_files_give_the_same_ids(tmp_path):
    """vocab.json + merges.txt (GPT-2's original files), read by both libraries."""
    gpt2_style().model.save(str(tmp_path))
    hf = Tokenizer(models.BPE.from_file(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([END_OF_TEXT])
    tok = ByteLevelBPE.from_vocab_merges(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert tok.eos_id == tok.vocab[END_OF_TEXT]
    assert_same_ids(hf, tok)


@pytest.mark.parametrize("make", [gpt2_style, llama3_style, qwen2_style], ids=["gpt2", "llama3", "qwen2"])
def test_tokenizer_json_made_by_tokenizers_gives_the_same_ids(make, tmp_path):
    hf = make()
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = ByteLevelBPE.from_file(tmp_path / "tokenizer.json")
    assert tok.vocab_size == hf.get_vocab_size(with_added_tokens=True)
    assert_same_ids(hf, tok, TEXTS + [t.replace("<|endoftext|>", "<|eot_id|><|im_end|>") for t in TEXTS])
    assert tok.decode(tok.encode(TEXTS[-2])) == (unicodedata.normalize("NFC", TEXTS[-2]) if make is qwen2_style
                                                 else TEXTS[-2])


def test_special_tokens_allowed_or_refused_as_text():
    tok = ours(gpt2_style())
    eot = tok.vocab[END_OF_TEXT]
    text = "a<|endoftext|>b"
    assert tok.encode(text) == tok.encode("a") + [eot] + tok.encode("b")              # "all", as tokenizers
    assert eot not in tok.encode(text, allowed_special="none")                         # plain text
    assert tok.decode(tok.encode(text, allowed_special="none")) == text
    assert tok.encode(text, allowed_special={END_OF_TEXT}) == tok.encode(text)
    with pytest.raises(ValueError, match="holds the special token '<\\|endoftext\\|>'"):
        tok.encode(text, allowed_special="none_raise")
    with pytest.raises(ValueError, match="not special tokens of this tokenizer"):
        tok.encode(text, allowed_special={"<|nope|>"})
    assert tok.decode([eot], skip_special=True) == ""


# Added tokens of each kind: tokenizers matches one with normalized=true in the normalized text (its content
# normalized too) and one with normalized=false in the raw text, before the normalizer.
ADDED_TEXTS = ["Hello <EXTRA> <extra> world", "<Raw> <raw> <RAW>", "<SPEC><spec><RAWSPEC><rawspec>", "x<EXTRA",
               "<ex-tra> <EX-TRA> <Ex--tra>", "<EXTRA>hi<Raw>yo<extra>", "x<ab>y <AB>", "hi <Raw>", "<Raw><Raw>"]


TOKENIZERS_VERSION = tuple(int(part) for part in tokenizers.__version__.split(".")[:2])


def with_added_tokens(normalizer):
    """A GPT-2-style tokenizer with ``normalizer`` and added tokens normalized or not, special or not."""
    tok = hf_trained(pre_tokenizers.ByteLevel(add_prefix_space=False), normalizer=normalizer)
    tok.add_tokens([tokenizers.AddedToken("<EXTRA>", normalized=True, special=False),
                    tokenizers.AddedToken("<Raw>", normalized=False, special=False),
                    tokenizers.AddedToken("<ab>", normalized=True, special=False),
                    tokenizers.AddedToken("b>", normalized=False, special=False)])      # overlaps "<ab>"
    tok.add_special_tokens([tokenizers.AddedToken("<SPEC>", normalized=True, special=True),
                            tokenizers.AddedToken("<RAWSPEC>", normalized=False, special=True)])
    return tok


@pytest.mark.parametrize("normalizer", [
    None, normalizers.Lowercase(), normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()]),
    normalizers.Sequence([normalizers.Replace("-", ""), normalizers.Lowercase()]),
    normalizers.Sequence([normalizers.Prepend("_"), normalizers.Lowercase()])],
    ids=["none", "lowercase", "nfc-lowercase", "replace-lowercase", "prepend-lowercase"])
def test_added_tokens_are_matched_in_the_raw_or_the_normalized_text_as_tokenizers_does(normalizer):
    hf = with_added_tokens(normalizer)
    tok = ours(hf)
    for text in ADDED_TEXTS + TEXTS:
        expected = hf.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == expected, text
        if TOKENIZERS_VERSION >= (0, 23):        # before, tokenizers decoded a normalized one as its content
            assert tok.decode(expected) == hf.decode(expected, skip_special_tokens=False), text
    hf.encode_special_tokens = True                # tokenizers' way of encoding special tokens as text
    for text in ADDED_TEXTS:
        assert tok.encode(text, allowed_special="none") == hf.encode(text, add_special_tokens=False).ids, text


def test_a_text_in_chunks_matches_normalized_added_tokens_across_the_cuts():
    hf = with_added_tokens(normalizers.Lowercase())
    tok = ours(hf)
    text = "Say <EXTRA> twice: <extra>, and <SPEC> once"
    expected = hf.encode(text, add_special_tokens=False).ids
    for cut in range(len(text) + 1):
        assert sum(tok.encode_chunks([text[:cut], text[cut:]]), []) == expected, cut


def test_saved_tokenizer_json_is_read_by_tokenizers_and_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    for pattern in ("gpt2", "gpt4"):
        tok = ByteLevelBPE.train(CORPUS, 500, pattern=pattern)
        path = tok.save(tmp_path / f"{pattern}.json")
        doc = json.loads(path.read_text(encoding="utf-8"))
        assert set(doc) == {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
                            "post_processor", "decoder", "model"}          # a plain document, no wrapper keys
        hf = Tokenizer.from_file(str(path))
        fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
        for text in TEXTS:
            ids = tok.encode(text)
            assert hf.encode(text, add_special_tokens=False).ids == ids, (pattern, text)
            assert fast(text, add_special_tokens=False)["input_ids"] == ids, (pattern, text)
            assert hf.decode(ids, skip_special_tokens=False) == text
        assert ByteLevelBPE.from_file(path).to_dict() == doc


# -- training --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_training_learns_bpe_trainers_merges_and_vocabulary(pattern):
    """Ties are broken by the smallest (left id, right id), as BpeTrainer: same merges, same ids."""
    pre = (pre_tokenizers.ByteLevel(add_prefix_space=False) if pattern == "gpt2" else pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT4_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    for vocab_size, min_frequency in ((300, 0), (900, 0), (700, 3)):
        hf = json.loads(hf_trained(pre, vocab_size, min_frequency=min_frequency).to_str())["model"]
        tok = ByteLevelBPE.train(CORPUS, vocab_size, pattern=pattern, min_frequency=min_frequency)
        assert [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in hf["merges"]] == tok.merges
        assert hf["vocab"] == tok.vocab


def test_reference_and_fast_trainers_learn_the_same_merges():
    texts = CORPUS + ["aaaa aaa aa a abababab", "xyxyxyxy " * 5, "\n\n\n  \t\t"]
    for vocab_size, min_frequency in ((300, 0), (800, 2), (2000, 0)):
        fast = ByteLevelBPE.train(texts, vocab_size, min_frequency=min_frequency, trainer="fast")
        reference = ByteLevelBPE.train(texts, vocab_size, min_frequency=min_frequency, trainer="reference")
        assert fast.merges == reference.merges and fast.vocab == reference.vocab
    assert fast.vocab_size < 2000                     # the corpus ran out of pairs before 2000 tokens


def test_trainer_internals_on_a_hand_made_example():
    """'a a a' merges left to right; ties go to the smallest ids; min_frequency stops training."""
    tokens = ["a", "b", "c", "d"]
    words = {(0, 0, 0): 1, (2, 3): 1, (0, 1): 1}          # "aaa" (the pair "a a" twice), "cd", "ab"
    for learn in (train_reference, train_fast):
        t = list(tokens)
        # "a a" first (2); then "aa a", "ab", "cd" once each: the smallest ids first
        assert learn(dict(words), t, 8) == [(0, 0), (0, 1), (2, 3), (4, 0)] and t[4:] == ["aa", "ab", "cd", "aaa"]
        assert learn(dict(words), list(tokens), 8, min_frequency=2) == [(0, 0)]
    counts = count_pieces(PreTokenizer.from_pattern("gpt2"), ["the cat", ["the c", "at"]])
    assert counts == {"the": 2, "Ġcat": 2}


def test_training_needs_room_and_knows_its_trainers():
    with pytest.raises(ValueError, match="leaves no room"):
        ByteLevelBPE.train("abc", 256)
    with pytest.raises(ValueError, match="choose one of"):
        ByteLevelBPE.train("abc", 300, trainer="magic")


# -- round trips and long texts --------------------------------------------------------------------------------
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

TRAINED = {p: ByteLevelBPE.train(CORPUS, 700, pattern=p) for p in ("gpt2", "gpt4")}
# Scripts whose letters, digits and spaces every Unicode version classifies alike (tokenizers' Oniguruma may
# be older than the regex package's tables; docs: numformer.data.tokenizers.byte_level).
ALPHABET = "".join(sorted(set("".join(CORPUS) + "".join(TEXTS) + "ßÆØÅąčęłńśźżΑβγδεжзий٠١٢३४५¼½\u2028\u3000")))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.text(), st.sampled_from(["gpt2", "gpt4"]))
def test_decode_encode_round_trips_any_text(text, pattern):
    tok = TRAINED[pattern]
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text, allowed_special="none")) == text


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.text(alphabet=ALPHABET, max_size=80))
def test_random_text_gets_the_ids_of_tokenizers(text):
    tok = TRAINED["gpt4"]
    hf = Tokenizer.from_str(tok.to_hf_json())
    assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.text(alphabet=ALPHABET + "<|>endoftx", max_size=120), st.lists(st.integers(0, 120), max_size=6),
       st.sampled_from(["gpt2", "gpt4"]))
def test_a_text_encoded_in_chunks_gets_the_ids_of_the_whole_text(text, cuts, pattern):
    tok = TRAINED[pattern]
    cuts = sorted(set(min(c, len(text)) for c in cuts))
    chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    for allowed in ("all", "none"):
        assert sum(tok.encode_chunks(chunks, allowed), []) == tok.encode(text, allowed)
    assert count_pieces(tok.pre_tokenizer, [chunks]) == count_pieces(tok.pre_tokenizer, text)


# -- files numformer does not implement, and old run folders ----------------------------------------------------
def test_what_cannot_be_implemented_is_refused_by_name():
    doc = json.loads(gpt2_style().to_str())
    for change, message in (
            (lambda d: d["model"].update(dropout=0.1), "dropout = 0.1"),
            (lambda d: d["model"].update(byte_fallback=True), "byte_fallback"),
            (lambda d: d.update(decoder={"type": "Metaspace"}), "not ByteLevel"),
            (lambda d: d.update(pre_tokenizer={"type": "Metaspace"}), "not a byte-level BPE tokenizer"),
            (lambda d: d["added_tokens"][0].update(lstrip=True), "lstrip"),
            (lambda d: d["model"].update(type="WordPiece"), "not BPE"),
            (lambda d: d["model"]["merges"].append("Ġ zz"), "not in the vocabulary"),
            (lambda d: d.pop("model"), "not a Hugging Face tokenizer.json")):
        damaged = json.loads(json.dumps(doc))
        change(damaged)
        with pytest.raises(ValueError, match=message):
            ByteLevelBPE.from_dict(damaged)


def test_a_classifier_run_saved_by_the_tokenizers_wrapper_keeps_its_ids():
    """Run folders written before numformer's own BPE hold {"type": "bpe", "hf_json": ...} made by tokenizers."""
    from numformer.data.tokenizers import normalize_text, special_tokens
    specials = special_tokens(False, False, True)
    hf = hf_trained(pre_tokenizers.ByteLevel(add_prefix_space=True), 500, specials, min_frequency=2,
                    texts=[normalize_text(t) for t in CORPUS])
    old = {"type": "bpe", "lowercase": True, "hf_json": hf.to_str()}
    tok = tokenizer_from_dict(old)
    assert isinstance(tok, NormalizedBPE) and tok.special_id("<cls>") == 2
    for text in TEXTS:
        assert tok.encode(text) == hf.encode(normalize_text(text), add_special_tokens=False).ids
    new = NormalizedBPE.build(CORPUS, 500, min_freq=2, cls_token=True)
    assert new.bpe.merges == tok.bpe.merges                  # numformer's trainer learns what tokenizers learnt
