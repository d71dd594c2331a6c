"""Learning byte-level BPE merges: the algorithm in plain sight (``train_reference``) and its fast path
(``train_fast``), which give the same merges.

The algorithm (Sennrich et al. 2016, on bytes as in GPT-2):

1. split the training text into pieces with the regex and count how often each distinct piece occurs
   (``count_pieces``); write each piece as its bytes. The vocabulary starts as the 256 byte characters.
2. count every pair of adjacent tokens inside the pieces, each piece weighted by its count;
3. merge the most frequent pair into a new token everywhere (left to right, so "a a a" becomes "aa a");
4. repeat 2-3 until the vocabulary has ``vocab_size`` tokens, or no pair occurs ``min_frequency`` times.

Ties are broken by the ids of the pair: among the most frequent pairs, the one with the smallest left id,
then the smallest right id, is merged, where the 256 bytes come first in code point order of their byte
characters (the order of ``byte_alphabet``, GPT-2's vocabulary order) and every merged token's id is the
next free one. This is the rule of ``tokenizers``' BpeTrainer, so both learn the same merges from the
same pieces (checked in the tests). A merge whose token already exists (merging "a"+"bc" after "ab"+"c")
reuses that token's id, as BpeTrainer does.

``train_reference`` recounts every pair after every merge, as the description says: simple and slow. Its
step is two functions, ``most_frequent_pair`` (2) and ``merge_pair`` (3): the exercise ``numformer exercises
start bpe_merge`` has a learner write them.
``train_fast`` keeps the pair counts up to date instead (a merge changes only the pairs around the places
where it applies), remembers which pieces hold each pair, and finds the most frequent pair with a heap whose
stale entries are refreshed when they reach the top.
"""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from typing import Iterable

from .byte_level import PreTokenizer, byte_alphabet, hold_back, to_byte_chars
from .hf_json import AddedToken

TRAINERS = ("fast", "reference")


# -- counting pieces -----------------------------------------------------------------------------------------
def count_pieces(pre: PreTokenizer, texts) -> Counter:
    """{piece written with byte characters: count} over ``texts``: one text (a str), or an iterable of
    documents, each a str or an iterable of str chunks (a long document read part by part)."""
    counts = Counter()
    for doc in ([texts] if isinstance(texts, str) else texts):
        if isinstance(doc, str):
            counts.update(pre.pieces(doc))
            continue
        carry = ""
        for chunk in doc:
            pieces, carry = hold_back(pre.pieces(carry + chunk))
            counts.update(pieces)
        counts.update(pre.pieces(carry))
    out = Counter()
    for piece, n in counts.items():
        out[to_byte_chars(piece)] += n
    return out


def _new_token(tokens, index, pair):
    """The id of the token ``pair`` makes: an existing one with the same text, or a new one at the end."""
    text = tokens[pair[0]] + tokens[pair[1]]
    if text not in index:
        index[text] = len(tokens)
        tokens.append(text)
    return index[text]


# -- one merge step: the most frequent pair, and its merge ------------------------------------------------------
def most_frequent_pair(words, counts):
    """(pair, count): the most frequent pair of adjacent ids in ``words`` and its count; (None, 0) when no
    word has two ids.

    words: a list of id sequences; counts: how often each occurs (one int per word). Every adjacent pair of
    every word counts, overlapping ones too ((a, a) twice in [a, a, a]), times its word's count. Ties go to
    the smallest left id, then the smallest right id (BpeTrainer's rule)."""
    totals = Counter()
    for word, n in zip(words, counts):
        for pair in zip(word, word[1:]):
            totals[pair] += n
    if not totals:
        return None, 0
    best = max(totals, key=lambda p: (totals[p], -p[0], -p[1]))
    return best, totals[best]


def merge_pair(word, pair, new_id) -> list:
    """``word`` (a list of ids) with every occurrence of ``pair`` replaced by ``new_id``, left to right (so
    [a, a, a] with the pair (a, a) becomes [new_id, a]); a new list, ``word`` unchanged."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


# -- the reference -------------------------------------------------------------------------------------------
def train_reference(words: dict, tokens: list, size: int, min_frequency: int = 0, *, pair_of=most_frequent_pair,
                    merge=merge_pair) -> list:
    """Merges ([(left id, right id), ...] in order) learnt from ``words`` ({tuple of ids: count}); ``tokens``
    (id -> text) grows to at most ``size`` entries; merging stops earlier when the most frequent pair occurs
    fewer than max(1, ``min_frequency``) times. ``pair_of`` and ``merge`` are the two halves of a step (the
    grader of ``numformer exercises check bpe_merge`` passes a learner's)."""
    index = {t: i for i, t in enumerate(tokens)}
    counts, words = list(words.values()), [list(w) for w in words]
    merges = []
    while len(tokens) < size:
        best, n = pair_of(words, counts)
        if best is None or n < max(1, min_frequency):
            break
        new_id = _new_token(tokens, index, best)
        merges.append(best)
        words = [merge(word, best, new_id) for word in words]
    return merges


# -- the fast path -------------------------------------------------------------------------------------------
def train_fast(words: dict, tokens: list, size: int, min_frequency: int = 0) -> list:
    """``train_reference`` with pair counts kept up to date: the same merges."""
    index = {t: i for i, t in enumerate(tokens)}
    symbols = [list(w) for w in words]
    weight = list(words.values())
    pair_counts, where = defaultdict(int), defaultdict(set)
    for i, word in enumerate(symbols):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += weight[i]
            where[pair].add(i)
    heap = [(-n, a, b) for (a, b), n in pair_counts.items()]   # a max-heap of counts; ties: smallest ids
    heapq.heapify(heap)
    merges = []
    while len(tokens) < size and heap:
        stale, a, b = heapq.heappop(heap)
        pair, count = (a, b), pair_counts.get((a, b), 0)
        if -stale != count:            # the count went down since this entry was pushed: push it again
            if count > 0:
                heapq.heappush(heap, (-count, a, b))
            continue
        if count < max(1, min_frequency):
            break
        new_id = _new_token(tokens, index, pair)
        merges.append(pair)
        grown = set()
        for i in where.pop(pair):
            for p, change in _merge_with_changes(symbols, i, pair, new_id):
                pair_counts[p] += change * weight[i]
                if change > 0:
                    where[p].add(i)
                    grown.add(p)
        del pair_counts[pair]
        for p in grown:                # new pairs hold the new token: each enters the heap once
            heapq.heappush(heap, (-pair_counts[p], *p))
    return merges


def _merge_with_changes(symbols, i, pair, new_id):
    """Merge ``pair`` in word ``i`` in place; return the changes of the pair counts around each merge
    [((left, right), +1 or -1), ...] (the merged pair itself excepted)."""
    word, out, changes, k = symbols[i], [], [], 0
    while k < len(word):
        if k + 1 < len(word) and word[k] == pair[0] and word[k + 1] == pair[1]:
            if out:
                changes += [((out[-1], pair[0]), -1), ((out[-1], new_id), 1)]
            if k + 2 < len(word):
                changes += [((pair[1], word[k + 2]), -1), ((new_id, word[k + 2]), 1)]
            out.append(new_id)
            k += 2
        else:
            out.append(word[k])
            k += 1
    symbols[i] = out
    return changes


# -- a tokenizer ------------------------------------------------------------------------------------------------
def train_bpe(cls, texts, vocab_size: int, pattern="gpt2", special_tokens=(), min_frequency: int = 0,
              trainer: str = "fast", add_prefix_space: bool = False):
    """A ``cls`` (``ByteLevelBPE``) learnt from ``texts`` (see ``count_pieces``).

    Ids: the special tokens first (0, 1, ...), then the 256 bytes, then the merged tokens in the order they
    were learnt, as ``tokenizers``' BpeTrainer numbers them (so the special tokens are in the vocabulary too,
    and a merge that spells one reuses its id). ``vocab_size`` counts all three; training stops
    earlier when no pair occurs ``min_frequency`` times (at least once).
    """
    specials = list(dict.fromkeys(special_tokens))
    if trainer not in TRAINERS:
        raise ValueError(f"trainer = {trainer!r}; choose one of {list(TRAINERS)}")
    if vocab_size < 256 + len(specials):
        raise ValueError(f"vocab_size = {vocab_size} leaves no room: a byte-level vocabulary holds the 256 bytes "
                         f"and the {len(specials)} special token(s) at least")
    pre = PreTokenizer.from_pattern(pattern, add_prefix_space)
    tokens = list(dict.fromkeys(specials + byte_alphabet()))    # id -> text, as BpeTrainer numbers them
    char_id = {t: i for i, t in enumerate(tokens)}
    words = {tuple(char_id[c] for c in piece): n for piece, n in count_pieces(pre, texts).items()}
    learn = train_fast if trainer == "fast" else train_reference
    merges = learn(words, tokens, vocab_size, min_frequency)
    added = [AddedToken(s, i, special=True) for i, s in enumerate(specials)]
    return cls({t: i for i, t in enumerate(tokens)}, [(tokens[a], tokens[b]) for a, b in merges], added, pre)


def pieces_of(texts: Iterable[str], pattern="gpt2") -> Counter:
    """The counted pieces of ``texts`` under ``pattern`` (for looking at what the trainer sees)."""
    return count_pieces(PreTokenizer.from_pattern(pattern), texts)
