"""The chat pipeline's data: conversations and preference pairs built from IMDB's labelled reviews and the
instruction set (``numformer reproduce chat_pipeline``; the recipe is in ``chat_pipeline``'s docstring).

Three kinds of request, each a user turn and the assistant's reply, in numformer's default chat format
(``data.chat.DEFAULT_TEMPLATE``: ``User: ...`` / ``Assistant: ...``):

- classify: ``Is this review positive or negative?`` and the review; the reply is ``positive`` or ``negative``;
- write: ``Write a positive review about a horror film.``; the reply is a review of that label whose topic is
  the one named (``topic_of``);
- an instruction of ``instruction-data.json`` (Alpaca records, LLMs-from-scratch's chapter 7) and its output.

Every reply ends with the tokenizer's end-of-text token ``<|endoftext|>``, which the language model learnt as
the end of a review: a reply stops there (``numformer chat`` and ``generate`` stop at the eos token), where the
plain format alone has no end-of-turn marker that the model could learn to write. A review longer than the room
the context leaves keeps its first ``head`` tokens and its last ones, joined by `` [...] `` (``fit_review``):
a review's verdict is often in its last sentences.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..data.chat import ChatFormat, alpaca_messages
from ..data.chat_tasks import read_records, record_messages
from ..data.text import clean_review

QUESTION = "Is this review positive or negative?"
LABELS = ("negative", "positive")                  # IMDB's label 0 and 1 (data.text_datasets.load_imdb)
REQUEST = "Write a {label} review about {topic}."
END = "<|endoftext|>"
CUT = " [...] "
DEFAULT_TOPIC = "a movie"
MAX_CHARS_PER_TOKEN = 10               # a review with more characters per allowed token is not measured (too long)
# (topic, words that name it): a review's topic is the one whose word comes first in it (``topic_of``).
TOPICS = (("a horror film", ("horror", "zombie", "slasher", "vampire")),
          ("a comedy", ("comedy", "comedies", "sitcom")),
          ("a documentary", ("documentary",)),
          ("a western", ("western",)),
          ("a musical", ("musical",)),
          ("an animated film", ("animated", "animation", "cartoon", "anime")),
          ("a war film", ("war film", "war movie", "world war", "vietnam")),
          ("a science fiction film", ("sci-fi", "science fiction", "space", "alien")),
          ("a thriller", ("thriller", "suspense")),
          ("a romance", ("romance", "romantic", "love story")),
          ("an action film", ("action",)),
          ("a TV series", ("series", "episode", "tv show")),
          ("a drama", ("drama",)))
_TOPIC_WORDS = re.compile(r"\b(" + "|".join(re.escape(w) for _, words in TOPICS for w in words) + r")\b",
                          re.IGNORECASE)
_TOPIC_OF_WORD = {w: topic for topic, words in TOPICS for w in words}


def topic_of(review):
    """What a review is about, for a writing request: the topic (``TOPICS``) whose word appears first in it
    ("horror" -> "a horror film"), else "a movie"."""
    m = _TOPIC_WORDS.search(review)
    return DEFAULT_TOPIC if m is None else _TOPIC_OF_WORD[m.group(1).lower()]


def fit_review(tokenizer, ids, room, head):
    """A review of token ids ``ids`` as text of at most ``room`` tokens: whole, or its first ``head`` tokens and
    as many of its last ones as fit, joined by ``CUT`` (a character split at a cut is dropped)."""
    if len(ids) <= room:
        return tokenizer.decode(list(ids))
    first = tokenizer.decode(list(ids[:head])).replace("\ufffd", "").rstrip()
    tail = room - head - len(tokenizer.encode(CUT))
    while True:                         # re-encoding may merge tokens differently at the joins: measure
        text = first + CUT + tokenizer.decode(list(ids[len(ids) - tail:])).replace("\ufffd", "").lstrip()
        excess = len(tokenizer.encode(text)) - room
        if excess <= 0 or tail <= 1:
            return text
        tail -= excess


def classify_messages(review, label=None):
    """The classification request for ``review`` (and with ``label`` its answer, ending with ``END``)."""
    messages = [{"role": "user", "content": f"{QUESTION}\n\n{review}"}]
    return messages + ([] if label is None else [{"role": "assistant", "content": LABELS[label] + END}])


def write_messages(label, topic, review=None):
    """The request for a review of ``label`` about ``topic`` (and with ``review`` the reply)."""
    messages = [{"role": "user", "content": REQUEST.format(label=LABELS[label], topic=topic)}]
    return messages + ([] if review is None else [{"role": "assistant", "content": review + END}])


def instruction_split(records):
    """(train, test, validation) of the instruction set as LLMs-from-scratch splits it: the first 85% of the
    records, the next 10%, the last 5%, in file order."""
    n_train, n_test = int(len(records) * 0.85), int(len(records) * 0.1)
    return records[:n_train], records[n_train:n_train + n_test], records[n_train + n_test:]


def read_instructions(path):
    """The records of an instruction-data JSON file (a list of Alpaca records, each checked by ``record_messages``:
    a field that is not text is one error naming the file, the record and the field)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"the instruction set {path} is missing: put LLMs-from-scratch's instruction-data.json "
                         f"there (``$NUMFORMER_DATA/instructions/``), set pipeline.instructions to its path, or "
                         f"set pipeline.instruction_records = 0 to fine-tune without it")
    records = read_records(path)
    if not all(isinstance(r, dict) and isinstance(r.get("instruction"), str) for r in records):
        raise ValueError(f"{path} is not a JSON list of Alpaca records {{\"instruction\", \"input\", \"output\"}}")
    for i, record in enumerate(records):
        record_messages(record, path, i)
    return records


def instruction_conversation(record):
    """An instruction record as a conversation whose reply ends with ``END``."""
    user, assistant = alpaca_messages(record)
    return [user, {**assistant, "content": assistant["content"].strip() + END}]


class Reviews:
    """The IMDB reviews of one split, cleaned (``<br />`` as line breaks), their labels, and the token ids of
    those asked for (encoded once, when first needed: the pipeline reads a few thousand of 25,000)."""

    def __init__(self, texts, labels, tokenizer):
        self.texts = [clean_review(t) for t in texts]
        self.labels = np.asarray(labels, dtype=np.int64)
        self.tokenizer = tokenizer
        self._ids = {}

    def __len__(self):
        return len(self.texts)

    def ids(self, i):
        if i not in self._ids:
            self._ids[i] = np.asarray(self.tokenizer.encode(self.texts[i]), dtype=np.int32)
        return self._ids[i]

    def length(self, i):
        return len(self.ids(i))

    def fitted(self, i, room, head):
        return fit_review(self.tokenizer, self.ids(i), room, head)


def review_room(tokenizer, block_size, margin=4):
    """How many tokens of a review fit in a classification conversation of ``block_size`` + 1 tokens (the
    request, the answer and the format's words taken out, with ``margin`` tokens to spare for the merges at
    the joins)."""
    fmt = ChatFormat.default()
    frame = len(fmt.encode(tokenizer, classify_messages("", 1)))
    return block_size + 1 - frame - margin


def write_room(tokenizer, block_size, margin=4):
    """How many tokens a written review may have to fit, with its request, in the context."""
    fmt = ChatFormat.default()
    longest = max((t for t, _ in TOPICS), key=len)
    return block_size + 1 - len(fmt.encode(tokenizer, write_messages(1, longest, ""))) - margin


def sft_conversations(train, picks, room, head, instructions, repeats):
    """The supervised fine-tuning set: a classification request for each review of ``picks["classify"]``, a
    writing request for each of ``picks["write"]`` (about its topic), and the instruction records
    (``repeats`` times), in that order: no shuffling is needed, the trainer draws its batches at random."""
    out = [classify_messages(train.fitted(i, room, head), train.labels[i]) for i in picks["classify"]]
    out += [write_messages(train.labels[i], topic_of(train.texts[i]), train.texts[i].strip())
            for i in picks["write"]]
    out += [instruction_conversation(r) for r in instructions] * repeats
    return [{"messages": m} for m in out]


def preference_pairs(reviews, picks):
    """Pairs for DPO from the reviews ``picks`` ({label: indices}): the reviews of each label sorted by length
    and matched rank by rank with those of the other label, each match giving two pairs, one per request:
    "Write a positive review about <the positive review's topic>" with the positive review chosen and the
    negative one rejected, and the converse. Lengths are matched so that the preference cannot be read off
    the length."""
    neg, pos = (sorted(picks[k], key=reviews.length) for k in (0, 1))
    pairs = []
    for match in zip(neg, pos):
        for k in (0, 1):
            chosen, rejected = match[k], match[1 - k]
            pairs.append({"prompt": write_messages(k, topic_of(reviews.texts[chosen]))[0]["content"],
                          "chosen": reviews.texts[chosen].strip() + END,
                          "rejected": reviews.texts[rejected].strip() + END})
    return pairs


def short_reviews(reviews, limit, rng, need, skip=()):
    """{label: the first ``need`` reviews of that label, in an order drawn with ``rng``, of at most ``limit``
    tokens} (fewer when the split has fewer), leaving out the indices ``skip``. Only reviews of at most
    ``MAX_CHARS_PER_TOKEN * limit`` characters are encoded to be measured."""
    skip, out = set(int(i) for i in skip), {0: [], 1: []}
    for i in rng.permutation(len(reviews)):
        k = int(reviews.labels[i])
        if len(out[k]) < need and int(i) not in skip and len(reviews.texts[i]) <= MAX_CHARS_PER_TOKEN * limit \
                and reviews.length(i) <= limit:
            out[k].append(int(i))
        if len(out[0]) == len(out[1]) == need:
            break
    return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}


def write_jsonl(path, records):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
