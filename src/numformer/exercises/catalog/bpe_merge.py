"""Exercise ``bpe_merge``: one merge step of byte-pair encoding, the step ``ByteLevelBPE``'s reference trainer
repeats (``data.tokenizers.bpe_train``: ``most_frequent_pair`` and ``merge_pair``)."""
from __future__ import annotations

import numpy as np

from ...data.tokenizers import bpe_train
from ...data.tokenizers.byte_level import byte_alphabet
from ..checker import STANDARD_STEPS, Exercise, Failure, Function, Step, call

# (words, counts) on which the most frequent pair is unique; the counts decide it: counted once per word,
# (1, 2) and (2, 3) tie at 2, weighted (2, 3) has 6
WEIGHTED = ([[1, 2, 3], [2, 3], [1, 2]], [1, 5, 3])
UNIQUE = ([[104, 101, 108, 108, 111], [32, 104, 101], [116, 104, 101], [104, 105]], [2, 3, 4, 1])
# (words, counts, what the tie is)
TIES = (
    ([[5, 3], [2, 9], [2, 4], [7, 1]], [2, 2, 2, 1], "(5, 3), (2, 9) and (2, 4) occur twice each"),
    ([[9, 8, 7], [3, 6]], [1, 1], "every pair occurs once"),
)
# (word, pair, new id, what it tries)
MERGES = (
    ([104, 101, 108, 108, 111], (108, 108), 256, "the pair in the middle"),
    ([116, 104, 101, 32, 116, 104, 101], (116, 104), 300, "the pair twice, at the start"),
    ([1, 2, 3, 1, 2], (1, 2), 7, "the pair at the end"),
    ([1, 2, 3], (3, 1), 9, "a pair the word does not hold"),
)
TEXT = ("the cat sat on the mat; the cat that sat on the hat ate the rat, and that rat ran at the cat. "
        "aaaa bbbbbb aaa abab")
TRAINING_MERGES = 40


def _count(exercise, learner, reference, words, counts, why, case=""):
    """most_frequent_pair on (words, counts) against the reference; ``case`` names an edge case, ``why`` says
    what a failure here usually means."""
    name, where = exercise.names[0], f"edge case '{case}': " if case else ""
    try:
        got = call(name, learner[name], [list(w) for w in words], list(counts))
    except Failure as failure:
        raise Failure(f"{where}{failure}\n({why})") from None
    want = reference[name](words, counts)
    if _as_pair(got) != want:
        raise Failure(f"{where}{name}({words}, counts={counts}) returned {got!r}; the reference returns {want}\n"
                      f"({why})")


def _as_pair(result):
    """The learner's (pair, count) in the reference's form (a pair as a tuple), or the result unchanged."""
    try:
        pair, count = result
        return (None if pair is None else tuple(int(i) for i in pair)), int(count)
    except (TypeError, ValueError):
        return result


def step_types(exercise, learner, reference):
    """(pair, count) with the pair a tuple of two ids, a list from merge_pair, and no argument changed."""
    count_name, merge_name = exercise.names
    words, counts = [list(w) for w in UNIQUE[0]], list(UNIQUE[1])
    result = call(count_name, learner[count_name], words, counts)
    if words != UNIQUE[0] or counts != UNIQUE[1]:
        raise Failure(f"{count_name} changed its arguments words or counts; it only reads them")
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], tuple)
            and len(result[0]) == 2 and all(isinstance(i, (int, np.integer)) for i in (*result[0], result[1]))):
        raise Failure(f"{count_name} must return (pair, count): a tuple of two ids (integers) and an integer; it "
                      f"returned {result!r}")
    word = list(MERGES[0][0])
    merged = call(merge_name, learner[merge_name], word, MERGES[0][1], MERGES[0][2])
    if word != MERGES[0][0]:
        raise Failure(f"{merge_name} changed the word it was given; return a new list")
    if not isinstance(merged, list):
        raise Failure(f"{merge_name} must return a list of ids; it returned a {type(merged).__name__}")


def step_counting(exercise, learner, reference):
    _count(exercise, learner, reference, *WEIGHTED,
           "each occurrence of a pair counts as often as its word occurs: counts[i] times in words[i]")
    _count(exercise, learner, reference, *UNIQUE, "a few words, one pair more frequent than the others")


def step_ties(exercise, learner, reference):
    for words, counts, tie in TIES:
        _count(exercise, learner, reference, words, counts,
               f"{tie}: among the most frequent pairs ByteLevelBPE merges the one with the smallest left id, "
               f"then the smallest right id")


def step_merging(exercise, learner, reference):
    name = exercise.names[1]
    for word, pair, new_id, what in MERGES:
        got = call(name, learner[name], list(word), pair, new_id)
        want = reference[name](word, pair, new_id)
        if list(got) != want:
            raise Failure(f"{name}({word}, {pair}, {new_id}) returned {got}; the reference returns {want} ({what})")


def step_edge_cases(exercise, learner, reference):
    count_name, merge_name = exercise.names
    _count(exercise, learner, reference, [[3, 3, 3, 3], [1, 2], [1, 2]], [1, 1, 1],
           "(a, a) occurs three times in [a, a, a, a]: every adjacent pair counts, overlapping ones too",
           "overlapping pairs")
    for word, want_text in (([7, 7, 7], "left to right, [a, a, a] becomes [new, a]"),
                            ([7, 7, 7, 7], "[a, a, a, a] becomes [new, new]")):
        got = call(merge_name, learner[merge_name], list(word), (7, 7), 10)
        want = reference[merge_name](word, (7, 7), 10)
        if list(got) != want:
            raise Failure(f"edge case 'a run of one id': {merge_name}({word}, (7, 7), 10) returned {got}; the "
                          f"reference returns {want} ({want_text})")
    _count(exercise, learner, reference, [[5], [], [6]], [3, 1, 2],
           "words of one id or none hold no pair; (None, 0) says so", "no pairs")
    _count(exercise, learner, reference, [[5], [2, 2], [6, 1]], [4, 1, 1], "a word of one id holds no pair",
           "short words")


def step_training(exercise, learner, reference):
    """Train merges with the learner's step in train_reference's loop; they must be ByteLevelBPE's."""
    count_name, merge_name = exercise.names
    pieces = bpe_train.pieces_of([TEXT])
    words = {tuple(byte_alphabet().index(c) for c in piece): n for piece, n in pieces.items()}
    size = 256 + TRAINING_MERGES
    tokens = byte_alphabet()
    theirs = bpe_train.train_reference(words, list(tokens), size)
    yours = bpe_train.train_reference(
        words, list(tokens), size,
        pair_of=lambda w, c: _as_pair(call(count_name, learner[count_name], w, c)),
        merge=lambda w, p, i: list(call(merge_name, learner[merge_name], w, p, i)))
    for n, (a, b) in enumerate(zip(yours, theirs), 1):
        if a != b:
            raise Failure(f"training {TRAINING_MERGES} merges on a paragraph ({len(TEXT)} bytes, GPT-2's split) "
                          f"with your two functions: merge {n} is {a}, ByteLevelBPE's is {b} (the merges before "
                          f"it agree)")
    if len(yours) != len(theirs):
        raise Failure(f"training on a paragraph with your two functions gave {len(yours)} merges; ByteLevelBPE "
                      f"learns {len(theirs)} (the first {min(len(yours), len(theirs))} agree)")


EXERCISE = Exercise(
    name="bpe_merge",
    summary="one BPE merge step: the most frequent pair, merged",
    functions=(
        Function("most_frequent_pair", """\
The most frequent pair of adjacent ids, and its count: returns (pair, count),
pair a tuple (left id, right id); (None, 0) when no word has two ids. The ids and
the count are integers (Python's or NumPy's).

words: a list of words, each a list of token ids (ints); counts: how often each
word occurs in the training text (one int per word). Every adjacent pair of every
word counts, overlapping ones too ((a, a) twice in [a, a, a]), times its word's
count. Ties: the pair with the smallest left id, then the smallest right id
(ByteLevelBPE's rule, the one of Hugging Face tokenizers' BpeTrainer).""",
                 todos=("count every adjacent pair, times its word's count", "no pair at all: (None, 0)",
                        "the most frequent pair, ties by the smallest ids; return (pair, count)"),
                 positional=2),         # the grader passes every argument by position
        Function("merge_pair", """\
``word`` (a list of ids) with every occurrence of ``pair`` replaced by the one id
``new_id``, scanning left to right: [a, a, a] with the pair (a, a) becomes
[new_id, a]. Returns a new list; ``word`` is left unchanged.""",
                 todos=("walk the word left to right; where the pair starts, append new_id and skip both ids",
                        "return the new list"),
                 positional=3),
    ),
    reference=bpe_train,
    in_model=False,
    page="tutorials/bpe-by-hand.md#count-the-pairs-merge-the-most-frequent-repeat",
    hints=(
        "Count with a dict (or collections.Counter) keyed by the pair tuple; zip(word, word[1:]) gives every "
        "adjacent pair, overlapping ones included.",
        "A word that occurs counts[i] times adds counts[i] to each of its pairs, not 1.",
        "max(stats, key=stats.get) breaks ties by whichever pair was counted first. Make the key say the whole "
        "rule: a larger count first, then a smaller left id, then a smaller right id.",
        "Merging: a while loop with an index i; when word[i], word[i + 1] is the pair, append new_id and move "
        "i by 2, else append word[i] and move by 1. A for loop cannot skip the second id of a merged pair.",
    ),
    steps=(STANDARD_STEPS[0],
           Step("types, and no argument changed", step_types),
           Step("counting pairs", step_counting),
           Step("ties, as ByteLevelBPE breaks them", step_ties),
           Step("merging a pair", step_merging),
           Step("edge cases", step_edge_cases),
           Step("training: the merges of ByteLevelBPE", step_training)),
)
