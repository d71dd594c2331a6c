"""Tokenizers: vocabularies from training text only, special ids, unknowns, JSON round trips, padding."""
import json

import numpy as np
import pytest

from numformer.data.tokenizers import (NormalizedBPE, CharTokenizer, WordTokenizer, build_tokenizer, normalize_text,
                                       pad_batch, split_words, tokenizer_from_dict, truncate)

TRAIN = ["The movie was GREAT!<br /><br />Really great.", "A bad movie, a bad plot... don't watch it.",
         "great acting; bad ending"]


def roundtrip(tok):
    return tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))


# ------------------------------------------------------------------------------------------------ char
def test_char_tokenizer_roundtrip_and_unknowns():
    tok = CharTokenizer.from_text("hello world")
    assert tok.chars == sorted(set("hello world")) and tok.vocab_size == 8
    ids = tok.encode("hold")
    assert tok.decode(ids) == "hold"
    with pytest.raises(ValueError, match=r"2 character\(s\) not in the vocabulary.*'!z'"):
        tok.encode("hello z!")
    tok2 = roundtrip(tok)
    assert isinstance(tok2, CharTokenizer) and tok2.encode("world") == tok.encode("world")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([99])



@pytest.mark.parametrize("text", ["hello world", "zé😀a\U0010FFFF\n", "a\ud800b", "x"])
def test_char_tokenizer_arrays_equal_the_plain_encoding(text):
    """from_text and encode_array (vectorized over code points) give sorted(set(text)) and encode's ids."""
    tok = CharTokenizer.from_text(text)
    assert tok.chars == sorted(set(text))
    ids = tok.encode_array(text * 3)
    assert ids.dtype == np.int64 and ids.tolist() == tok.encode(text * 3)
    assert tok.encode_array("").shape == (0,)
    shuffled = CharTokenizer(tok.chars[::-1])                       # a vocabulary not in code-point order
    assert shuffled.encode_array(text).tolist() == shuffled.encode(text)
    for unknown in ("q", "\U0010FFFE", "\x00"):
        if unknown not in text:
            with pytest.raises(ValueError, match=r"1 character\(s\) not in the vocabulary"):
                tok.encode_array(text + unknown)


# ------------------------------------------------------------------------------------------------ word
def test_normalize_and_split():
    assert normalize_text("A<br />B<br>C<BR/>d") == "a b c d"
    assert normalize_text("Keep Case", lowercase=False) == "Keep Case"
    assert split_words("great!! don't... (yes)") == ["great", "!", "!", "don't", ".", ".", ".", "(", "yes", ")"]
    assert split_words("größer, café") == ["größer", ",", "café"]


def test_word_vocab_from_train_only_with_min_freq_and_max_size():
    tok = WordTokenizer.build(TRAIN, min_freq=2)
    assert tok.tokens[:2] == ["<pad>", "<unk>"] and tok.pad_id == 0 and tok.unk_id == 1
    words = set(tok.tokens[2:])
    # counts: great 3, bad 3, movie 2, a 2 ("A", "a"), "." 5 (2 + 3 from "..."), "," 1 ...
    assert {"great", "bad", "movie", "a", "."} <= words
    assert "plot" not in words and "br" not in words and "<br" not in words and "/" not in words
    # order: by count, then alphabetically
    assert tok.tokens[2] == "." and tok.tokens[3:5] == ["bad", "great"]
    capped = WordTokenizer.build(TRAIN, min_freq=1, max_size=5)
    assert capped.tokens == ["<pad>", "<unk>", ".", "bad", "great"]
    with pytest.raises(ValueError, match="no room"):
        WordTokenizer.build(TRAIN, max_size=2)


def test_word_encode_unknowns_specials_and_decode():
    tok = WordTokenizer.build(TRAIN, min_freq=1, bos=True, eos=True, cls_token=True)
    assert tok.tokens[:5] == ["<pad>", "<unk>", "<bos>", "<eos>", "<cls>"]
    ids = tok.encode("Great zebra!", add_bos=True, add_eos=True)
    assert ids[0] == tok.special_id("<bos>") and ids[-1] == tok.special_id("<eos>")
    assert ids[2] == 1                            # "zebra" was never seen in training -> <unk>
    assert tok.decode(ids) == "great <unk> !"
    assert tok.encode("great", add_cls=True)[0] == 4
    plain = WordTokenizer.build(TRAIN)
    with pytest.raises(ValueError, match="no <bos> token"):
        plain.encode("great", add_bos=True)


def test_word_json_roundtrip():
    tok = WordTokenizer.build(TRAIN, min_freq=1, eos=True, lowercase=False)
    tok2 = roundtrip(tok)
    assert isinstance(tok2, WordTokenizer) and tok2.tokens == tok.tokens and tok2.lowercase is False
    for t in TRAIN + ["unseen Words here."]:
        assert tok2.encode(t) == tok.encode(t)


# ------------------------------------------------------------------------------------------------ BPE
def test_bpe_train_encode_decode_roundtrip():
    pytest.importorskip("tokenizers")
    texts = TRAIN * 20 + ["the quick brown fox jumps over the lazy dog"] * 5
    tok = NormalizedBPE.build(texts, vocab_size=300, min_freq=2, bos=True, eos=True)
    assert tok.pad_id == 0 and tok.unk_id == 1 and tok.special_id("<bos>") == 2 and tok.special_id("<eos>") == 3
    assert tok.vocab_size <= 300
    ids = tok.encode("The movie<br />was great", add_bos=True, add_eos=True)
    assert ids[0] == 2 and ids[-1] == 3
    assert tok.decode(ids) == "the movie was great"           # byte-level: lossless up to normalization
    assert tok.decode(tok.encode("Zürich ☃ unseen!")) == "zürich ☃ unseen!"   # no unknown inputs
    tok2 = roundtrip(tok)
    assert isinstance(tok2, NormalizedBPE)
    batch = ["great plot", "a bad dog"]
    assert tok2.encode_batch(batch) == tok.encode_batch(batch) == [tok.encode(t) for t in batch]
    with pytest.raises(ValueError, match="no <cls> token"):
        tok.encode("x", add_cls=True)


def test_bpe_vocab_from_training_text_only():
    pytest.importorskip("tokenizers")
    tok = NormalizedBPE.build(["aaaa bbbb"] * 50, vocab_size=400, min_freq=2)
    vocab = tok.bpe.vocab
    assert any("aaaa" in t for t in vocab) and not any("zzzz" in t for t in vocab)


def test_bpe_special_tokens_written_in_a_review_are_ordinary_text():
    """A review that writes "<pad>" must not get the padding id (the classifier would mask it out): no special
    token is matched in raw text, as WordTokenizer never matches one either; encode's flags add them."""
    pytest.importorskip("tokenizers")
    tok = NormalizedBPE.build(TRAIN * 20, vocab_size=300, min_freq=2, bos=True, eos=True, cls_token=True)
    specials = set(tok.special_ids.values())
    assert specials == {0, 1, 2, 3, 4}
    text = "A <pad> movie, <PAD>!<br />Plot: <unk><bos> great <eos><cls>"
    for t in (tok, roundtrip(tok)):
        ids = t.encode(text)
        assert not specials & set(ids), ids
        assert t.decode(ids) == normalize_text(text).strip()             # round trips, as any other text
        assert t.encode(text, add_bos=True, add_eos=True, add_cls=True) == [2, 4] + ids + [3]


def test_build_tokenizer_rejects_unknown_kind():
    with pytest.raises(ValueError, match="choose \"word\" or \"bpe\""):
        build_tokenizer("sentencepiece", TRAIN, 100, 1)
    with pytest.raises(ValueError, match="unknown tokenizer type"):
        tokenizer_from_dict({"type": "nope"})


# ------------------------------------------------------------------------------------------------ padding
def test_truncate_and_pad_batch_masks():
    assert truncate([1, 2, 3, 4], 2) == [1, 2] and truncate([1, 2, 3, 4], 2, keep="tail") == [3, 4]
    assert truncate([1, 2], 5) == [1, 2]
    ids, mask = pad_batch([[5, 6, 7], [8], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert mask.tolist() == [[False, False, False], [False, True, True], [True, True, True]]
    ids, mask = pad_batch([[5, 6, 7, 9], [8]], pad_id=0, max_len=2)
    assert ids.shape == (2, 2) and mask.tolist() == [[False, False], [False, True]]
    with pytest.raises(ValueError, match="does not fit"):
        pad_batch([[1, 2, 3]], length=2)


def test_padding_receives_no_attention():
    """A classifier's output for a padded sequence equals the unpadded one (mask derived from pad_id)."""
    from numformer.models import EncoderClassifier

    model = EncoderClassifier(vocab_size=20, n_classes=3, d_model=16, n_heads=2, n_layers=2, dropout=0.0,
                              pad_id=0, rng=np.random.default_rng(0), dtype=np.float64)
    seqs = [[4, 5, 6], [7, 8, 9, 10, 11]]
    ids, _ = pad_batch(seqs, pad_id=0)
    batched = model(ids)
    for i, s in enumerate(seqs):
        np.testing.assert_allclose(batched[i], model(np.array([s]))[0], atol=1e-12)
