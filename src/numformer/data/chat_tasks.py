"""Supervised fine-tuning on conversations: ``[data] task = "chat"``.

The records of ``path`` are conversations, in either of the two formats people have:

- JSON lines (or a JSON list) of ``{"messages": [{"role": ..., "content": ...}, ...]}``, the format of Hugging
  Face's chat datasets and OpenAI's fine-tuning files;
- Alpaca-style records ``{"instruction", "input", "output"}`` (``../shared/data/instructions/``), each read as
  a user turn (the instruction, then its input after a blank line) and the assistant's reply.

Each conversation is rendered with the chat template (``chat_template``: a Jinja file, as a Hugging Face model
ships; else numformer's plain default, ``User: ...`` / ``Assistant: ...``) and encoded with the tokenizer of
the model being fine-tuned (the ``[model] init_from`` run or Hugging Face folder), by ``encode_chat``: the loss
is taken on the assistant's tokens only (``train_on = "assistant"``; ``"all"`` takes it everywhere). A
conversation longer than the context (``block_size`` + 1 tokens) is cut at its end; one whose kept part has
no assistant token is left out. Batches pad each conversation to the longest of the batch (targets -100, so
padding takes no loss; the causal mask keeps it from the real tokens). ``val_size`` conversations, drawn with
the seed, are held out for validation.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._limits import bounded_json
from .base import IGNORE, Batch, Task, register_task
from .chat import ChatFormat, alpaca_messages, encode_chat
from .tokenizers import tokenizer_from_dict


def read_conversations(path):
    """The conversations of a JSON / JSON-lines file: each a list of messages (Alpaca records converted)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"[data] path {str(path)!r} is not a file; give a JSON or JSON-lines file of conversations "
                         f"({{\"messages\": [...]}}) or Alpaca records ({{\"instruction\", \"input\", \"output\"}})")
    raw = path.read_bytes()
    text = raw.decode("utf-8").lstrip()
    records = bounded_json(raw, str(path)) if text.startswith("[") else \
        [json.loads(line) for line in text.splitlines() if line.strip()]
    return [record_messages(r, path, i) for i, r in enumerate(records)]


def record_messages(record, path="data", i=0):
    """One record as a conversation; ValueError naming the record when it is neither format."""
    if isinstance(record, dict) and isinstance(record.get("messages"), list):
        messages = record["messages"]
        if all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
               for m in messages):
            return messages
    if isinstance(record, dict) and isinstance(record.get("instruction"), str) and isinstance(record.get("output"),
                                                                                                 str):
        return alpaca_messages(record)
    raise ValueError(f"{path}: record {i} is neither {{\"messages\": [{{\"role\", \"content\"}}, ...]}} nor an Alpaca "
                     f"record {{\"instruction\", \"input\", \"output\"}}")


def chat_format(template_path):
    """The ChatFormat of a Jinja template file, or numformer's default format for ""."""
    if not template_path:
        return ChatFormat.default()
    path = Path(template_path)
    if not path.is_file():
        raise ValueError(f"[data] chat_template {template_path!r} is not a file; give a Jinja template (a model "
                         f"folder's chat_template.jinja) or leave it out for numformer's plain format")
    return ChatFormat(path.read_text(encoding="utf-8"))


def pad_examples(examples, pad_id):
    """A GPT batch of (ids, labels) examples: inputs ids[:-1], targets labels[1:], right-padded to the longest
    (inputs with ``pad_id``, targets with -100)."""
    T = max(len(ids) for ids, _ in examples) - 1
    X = np.full((len(examples), T), pad_id, dtype=np.int64)
    Y = np.full((len(examples), T), IGNORE, dtype=np.int64)
    for row, (ids, labels) in enumerate(examples):
        X[row, :len(ids) - 1] = ids[:-1]
        Y[row, :len(labels) - 1] = labels[1:]
    return Batch({"idx": X}, Y, n_tokens=sum(len(ids) - 1 for ids, _ in examples))


@register_task("chat")
class ChatTask(Task):
    """Conversations for supervised fine-tuning (see the module docstring)."""

    model_type = "gpt"
    data_keys = {
        "path": "",                 # a JSON / JSON-lines file of conversations or Alpaca records
        "chat_template": "",        # a Jinja chat template file ("": numformer's plain User:/Assistant: format)
        "train_on": "assistant",    # "assistant": the loss on the assistant's tokens only; "all": on every token
        "block_size": 256,          # the context: longer conversations are cut to block_size + 1 tokens
        "val_size": 50,             # conversations held out for validation (drawn with the seed)
    }

    def __init__(self, data_config, seed=0, tokenizer_state=None):
        super().__init__(data_config, seed, tokenizer_state)
        c = self.config
        if c["train_on"] not in ("assistant", "all"):
            raise ValueError(f"[data] train_on = {c['train_on']!r} should be \"assistant\" or \"all\"")
        if tokenizer_state is None:
            raise ValueError("task \"chat\" fine-tunes a pretrained model with its own tokenizer: set [model] "
                             "init_from to a run folder or a Hugging Face model")
        if not c["path"]:
            raise ValueError("task \"chat\": set [data] path to a JSON or JSON-lines file of conversations")
        self.tokenizer = tokenizer_from_dict(tokenizer_state)
        self.chat_format = chat_format(c["chat_template"])
        conversations = read_conversations(c["path"])
        self.examples, self.dropped = self._encode(conversations)
        order = np.random.default_rng(seed).permutation(len(self.examples))
        n_val = min(c["val_size"], len(self.examples) // 2)
        self.splits = {"val": order[:n_val], "train": order[n_val:]}
        self.pad_id = self.tokenizer.eos_id if getattr(self.tokenizer, "eos_id", None) is not None else 0

    def _encode(self, conversations):
        keep, dropped, n = [], 0, self.config["block_size"] + 1
        for messages in conversations:
            ids, labels = encode_chat(self, messages, self.config["train_on"])
            ids, labels = ids[:n], labels[:n]
            if len(ids) < 2 or all(t == IGNORE for t in labels[1:]):
                dropped += 1
                continue
            keep.append((ids, labels))
        if not keep:
            raise ValueError(f"task \"chat\": none of the {len(conversations)} conversations of {self.config['path']} "
                             f"has an assistant token within block_size = {self.config['block_size']}")
        return keep, dropped

    def model_config(self):
        return {"vocab_size": self.tokenizer.vocab_size, "block_size": self.config["block_size"]}

    def train_batch(self, batch_size, rng):
        rows = self.splits["train"][rng.integers(0, len(self.splits["train"]), batch_size)]
        return pad_examples([self.examples[i] for i in rows], self.pad_id)

    def eval_batches(self, split, batch_size):
        rows = self.splits.get(split, np.zeros(0, dtype=np.int64))
        for start in range(0, len(rows), batch_size):
            yield pad_examples([self.examples[i] for i in rows[start:start + batch_size]], self.pad_id)

    def eval_size(self, split):
        return len(self.splits.get(split, ()))

    def tokenizer_state(self):
        return self.tokenizer.to_dict()

    def describe(self):
        labelled = sum(sum(t != IGNORE for t in labels[1:]) for _, labels in self.examples)
        total = sum(len(ids) - 1 for ids, _ in self.examples)
        return (f"chat: {len(self.examples):,} conversations of {self.config['path']} ({len(self.splits['train']):,} "
                f"train, {len(self.splits['val']):,} val; {self.dropped} without an assistant token in the context "
                f"left out), loss on {labelled:,} of {total:,} target tokens (train_on = "
                f"{self.config['train_on']!r})")
