"""Supervised fine-tuning on conversations: ``[data] task = "chat"``.

The records of ``path`` (UTF-8, a byte order mark allowed) are conversations, in either of the two formats
people have:

- JSON lines (or a JSON list) of ``{"messages": [{"role": ..., "content": ...}, ...]}``, the format of Hugging
  Face's chat datasets and OpenAI's fine-tuning files; the roles are ``ROLES`` (transformers' "system", "user",
  "assistant", "tool"), the first message is not the assistant's;
- Alpaca-style records ``{"instruction", "input", "output"}`` (such as the instruction data of
  rasbt/LLMs-from-scratch), each read as a user turn (the instruction, then its input after a blank line)
  and the assistant's reply.

A record of another shape (another role, a field that is not text, an empty conversation), without an assistant
message (``train_on = "assistant"``), or refused by the template is one ValueError naming the file, the record
(counted from 0) and the field, never left out in silence.

Each conversation is rendered with the chat template (``chat_template``: a Jinja file, as a Hugging Face model
ships; else numformer's plain default, ``User: ...`` / ``Assistant: ...``) and encoded with the tokenizer of
the model being fine-tuned (the ``[model] init_from`` run or Hugging Face folder), by ``encode_chat``: the loss
is taken on the assistant's tokens only (``train_on = "assistant"``; ``"all"`` takes it everywhere). A
conversation longer than the context (``block_size`` + 1 tokens) is cut at its end; one whose kept part has
no assistant token is left out. Batches pad each conversation to the longest of the batch (targets -100, so
padding takes no loss; the causal mask keeps it from the real tokens). ``val_size`` conversations (at most
half of them), drawn with the seed, are held out for validation.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import ops
from .._limits import bounded_json
from .base import IGNORE, Batch, Task, register_task
from .chat import (DEFAULT_TEMPLATE, ChatFormat, alpaca_messages, compile_chat_template, encode_chat,
                   read_template_file)
from .files import json_lines
from .tokenizers import UnknownCharacters, tokenizer_from_dict


def read_records(path):
    """The records of a JSON list or JSON-lines file (UTF-8, a byte order mark allowed)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"[data] path {str(path)!r} is not a file; give a JSON or JSON-lines file of conversations "
                         f"({{\"messages\": [...]}}), Alpaca records ({{\"instruction\", \"input\", \"output\"}}) or "
                         f"preference pairs ({{\"prompt\", \"chosen\", \"rejected\"}})")
    raw = path.read_bytes()
    try:                            # a byte order mark (Notepad, PowerShell) is read past, as json.loads(bytes) does
        text = raw.decode("utf-8").removeprefix("\ufeff").lstrip()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
    if text.startswith("["):
        records = bounded_json(text, str(path))
    else:
        records = [record for _, record in json_lines(text, path, hint="a record nests a few levels")]
    if not isinstance(records, list):
        raise ValueError(f"{path} holds a JSON {type(records).__name__}; give a list of records or JSON lines")
    return records


def read_conversations(path):
    """The conversations of a JSON / JSON-lines file: each a list of messages (Alpaca records converted)."""
    return [record_messages(r, path, i) for i, r in enumerate(read_records(path))]


# The roles a message may have: transformers' chat convention, which the templates of Hugging Face models
# (Llama 3, Qwen, SmolLM) and numformer's plain format render: "system", "user", "assistant", and "tool" for a
# tool's result, lowercase. A template may still refuse one (Gemma's has no system role): ChatTask names the record.
ROLES = ("system", "user", "assistant", "tool")
# What a role of another convention is called here (ShareGPT's "human" / "gpt", Gemma's template's "model").
ROLE_NAMES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant", "chatgpt": "assistant",
              "ai": "assistant", "developer": "system"}


def _kind(value):
    """What a JSON value is, for an error: "null", "the number 5", "a JSON list", "a JSON string"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    return "a JSON " + {dict: "object", list: "list", str: "string"}.get(type(value), type(value).__name__)


def text_field(record, key, where, optional=False):
    """``record[key]``, a string; "" for an ``optional`` key that is missing or null; else one ValueError naming
    ``where`` (the file and record) and the field."""
    value = record.get(key)
    if optional and value is None:
        return ""
    if key not in record:
        raise ValueError(f"{where} has no \"{key}\"; give it as a string")
    if not isinstance(value, str):
        raise ValueError(f"{where}: \"{key}\" is {_kind(value)}, not a string; write it as text, in quotes")
    return value


def _check_role(role, at):
    """One ValueError naming ``at`` for a role not in ``ROLES``, with the role it likely means."""
    if role in ROLES:
        return
    likely = ROLE_NAMES.get(role.lower(), role.lower())
    if role.lower() in ROLES:
        hint = f"roles are lowercase: \"{role.lower()}\""
    elif role.lower() in ("human", "gpt"):
        hint = f"\"{role}\" is ShareGPT's \"{likely}\""
    else:
        hint = f"\"{role}\" likely means \"{likely}\"" if likely in ROLES else "rename it"
    roles = ", ".join(f'"{r}"' for r in ROLES[:-1])
    raise ValueError(f"{at}: role \"{role}\" is not a chat role ({hint}); the roles are {roles} "
                     f"and \"{ROLES[-1]}\"")


def check_messages(messages, where, field="messages"):
    """``messages`` (the list ``field`` of the record at ``where``), checked to be a conversation the templates
    render: a non-empty list of ``{"role": one of ROLES, "content": text}`` that does not start with the
    assistant's turn (its span is found by rendering the messages before it, and there are none); else one
    ValueError naming the file, the record and the message."""
    if not isinstance(messages, list):
        raise ValueError(f"{where}: \"{field}\" is {_kind(messages)}, not a list of messages "
                         f"{{\"role\": ..., \"content\": ...}}")
    if not messages:
        raise ValueError(f"{where}: \"{field}\" is an empty list; give the conversation's messages "
                         f"{{\"role\": \"user\", \"content\": ...}}, ..., or drop the record")
    for k, message in enumerate(messages):
        at = f"{where}, {field}[{k}]"
        if not isinstance(message, dict):
            raise ValueError(f"{at} is {_kind(message)}, not a message {{\"role\": ..., \"content\": ...}}")
        _check_role(text_field(message, "role", at), at)
        text_field(message, "content", at)
    if messages[0]["role"] == "assistant":
        raise ValueError(f"{where} starts with the assistant's message; a conversation starts with the user's "
                         f"message (a system message may come first): add the user's turn before it, or drop it")
    return messages


def record_messages(record, path="data", i=0):
    """One record as a conversation (``check_messages``; an Alpaca record's fields checked to be text, "input"
    optional); one ValueError naming the file, the record and the field when it is neither format."""
    where = f"{path}: record {i}"
    if not isinstance(record, dict):
        raise ValueError(f"{where} is {_kind(record)}, not an object {{\"messages\": [...]}} or "
                         f"{{\"instruction\", \"input\", \"output\"}}")
    if "messages" in record:
        return check_messages(record["messages"], where)
    if "instruction" in record or "output" in record:
        return alpaca_messages({"instruction": text_field(record, "instruction", where),
                                "input": text_field(record, "input", where, optional=True),
                                "output": text_field(record, "output", where)})
    raise ValueError(f"{where} is neither {{\"messages\": [{{\"role\", \"content\"}}, ...]}} nor an Alpaca "
                     f"record {{\"instruction\", \"input\", \"output\"}}")


def chat_format(template_path):
    """The ChatFormat of a Jinja template file (compiled: an error of the template is one ValueError naming the
    file), or numformer's default format for ""."""
    if not template_path:
        return ChatFormat.default()
    path = Path(template_path)
    if not path.is_file():
        raise ValueError(f"[data] chat_template {template_path!r} is not a file; give a Jinja template (a model "
                         f"folder's chat_template.jinja) or leave it out for numformer's plain format")
    template = read_template_file(path, "[data] chat_template")
    try:                            # jinja2 missing or a syntax error: said once, not as a record's fault
        if template != DEFAULT_TEMPLATE:
            compile_chat_template(template)
    except ValueError as e:
        raise ValueError(f"[data] chat_template {template_path}: {e}") from None
    return ChatFormat(template)


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
        self.examples, self.dropped = self._encode(self._read(c["path"]))
        order = np.random.default_rng(seed).permutation(len(self.examples))
        n_val = min(c["val_size"], len(self.examples) // 2)
        self.splits = {"val": order[:n_val], "train": order[n_val:]}
        self.pad_id = self.tokenizer.eos_id if getattr(self.tokenizer, "eos_id", None) is not None else 0

    def _read(self, path):
        return read_conversations(path)

    def _example(self, messages):
        """(ids, labels) of a conversation cut to the context, as int32 arrays (a list of Python ints takes
        nine times the memory), or None when no label is left in it; a ValueError for a conversation without an
        assistant message when the loss is on the assistant's tokens (nothing to learn from it)."""
        if self.config["train_on"] == "assistant" and all(m["role"] != "assistant" for m in messages):
            raise ValueError("the conversation has no assistant message, so no token takes the loss (train_on = "
                             "\"assistant\"); add the assistant's reply, or set [data] train_on = \"all\"")
        n = self.config["block_size"] + 1
        ids, labels = encode_chat(self, messages, self.config["train_on"])
        ids, labels = np.asarray(ids[:n], dtype=np.int32), np.asarray(labels[:n], dtype=np.int32)
        return None if len(ids) < 2 or np.all(labels[1:] == IGNORE) else (ids, labels)

    def _encode(self, conversations):
        path = self.config["path"]
        if not conversations:
            raise ValueError(f"task {self.name!r}: {path} holds no records; give a JSON or JSON-lines file of "
                             f"conversations ({{\"messages\": [...]}}) or Alpaca records")
        examples = []
        for i, record in enumerate(conversations):
            try:
                examples.append(self._example(record))
            except UnknownCharacters as e:      # the base model's tokenizer is fixed: the data must change
                raise ValueError(f"task {self.name!r}: record {i} of {path} has {len(e.characters)} character(s) "
                                 f"that the base model's tokenizer ({e.vocab_size} characters) lacks: "
                                 f"{''.join(e.characters)[:50]!r}; remove them from the data, or fine-tune a "
                                 f"base model whose tokenizer has them") from None
            except ValueError as e:             # the template refused it, or it has nothing to learn from
                raise ValueError(f"task {self.name!r}: record {i} of {path}: {e}") from None
        keep = [e for e in examples if e is not None]
        if not keep:
            raise ValueError(f"task {self.name!r}: none of the {len(conversations)} records of {self.config['path']} "
                             f"has an assistant token within block_size = {self.config['block_size']}")
        return keep, len(examples) - len(keep)

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
        """The base model's tokenizer with the chat template this run learns, which ``numformer chat`` and
        ``export`` then use: [data] chat_template's text as chat_template.jinja, or none for numformer's plain
        format (a template the base model came with is dropped: the run learns the plain one)."""
        state = dict(self.tokenizer.to_dict())
        files = {name: content for name, content in getattr(self.tokenizer, "files", {}).items()
                 if not name.endswith(".jinja")}
        config = files.get("tokenizer_config.json")
        if isinstance(config, dict) and "chat_template" in config:
            files["tokenizer_config.json"] = {k: v for k, v in config.items() if k != "chat_template"}
        if self.config["chat_template"]:
            files["chat_template.jinja"] = self.chat_format.template
        state.pop("files", None)
        return {**state, "files": files} if files else state

    def describe(self):
        labelled = sum(int(np.sum(labels[1:] != IGNORE)) for _, labels in self.examples)
        total = sum(len(ids) - 1 for ids, _ in self.examples)
        return (f"chat: {len(self.examples):,} conversations of {self.config['path']} ({len(self.splits['train']):,} "
                f"train, {len(self.splits['val']):,} val; {self.dropped} without an assistant token in the context "
                f"left out), loss on {labelled:,} of {total:,} target tokens (train_on = "
                f"{self.config['train_on']!r})")


def preference_record(record, path="data", i=0):
    """(prompt messages, chosen reply, rejected reply) of a preference record: ``{"prompt", "chosen",
    "rejected"}`` (the prompt a text or a list of messages, ``check_messages``) or an Alpaca record with
    ``chosen`` / ``rejected``; one ValueError naming the file, the record and the field of the wrong shape."""
    where = f"{path}: record {i}"
    if not (isinstance(record, dict) and "chosen" in record and "rejected" in record):
        raise ValueError(f"{where} is not a preference pair {{\"prompt\", \"chosen\", \"rejected\"}} (or an "
                         f"Alpaca record with \"chosen\" and \"rejected\")")
    chosen, rejected = text_field(record, "chosen", where), text_field(record, "rejected", where)
    prompt = record.get("prompt")
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}], chosen, rejected
    if isinstance(prompt, list):
        return check_messages(prompt, where, "prompt"), chosen, rejected
    if prompt is not None:
        raise ValueError(f"{where}: \"prompt\" is {_kind(prompt)}, not a string or a list of messages")
    if "instruction" not in record:
        raise ValueError(f"{where} has no \"prompt\" (or \"instruction\"); give the prompt the replies answer")
    instruction = text_field(record, "instruction", where)
    user = alpaca_messages({"instruction": instruction, "input": text_field(record, "input", where, optional=True),
                            "output": ""})[:1]
    return user, chosen, rejected


@register_task("preference")
class PreferenceTask(ChatTask):
    """Preference pairs for DPO (``[train] objective = "dpo"``): each record a prompt with a chosen and a
    rejected reply, encoded as two conversations whose labels are the reply's tokens. A batch of N pairs is
    2N rows, the chosen replies first; ``Batch.extra["reference"]`` holds the reference model's log-probability
    of each row (``set_reference``: computed once, before training, by the trainer)."""

    data_keys = {k: v for k, v in ChatTask.data_keys.items() if k != "train_on"}

    def __init__(self, data_config, seed=0, tokenizer_state=None):
        super().__init__({**data_config, "train_on": "assistant"}, seed, tokenizer_state)
        self.reference = None                   # (n_pairs, 2) log π_ref(chosen), log π_ref(rejected)

    def _read(self, path):
        return [preference_record(r, path, i) for i, r in enumerate(read_records(path))]

    def _example(self, pair):
        """((chosen ids, labels), (rejected ids, labels)) of a pair, or None when either loses its reply."""
        prompt, chosen, rejected = pair
        both = [super(PreferenceTask, self)._example(prompt + [{"role": "assistant", "content": reply}])
                for reply in (chosen, rejected)]
        return None if None in both else tuple(both)

    def train_batch(self, batch_size, rng):
        rows = self.splits["train"][rng.integers(0, len(self.splits["train"]), batch_size)]
        return self.pair_batch(rows)

    def eval_batches(self, split, batch_size):
        rows = self.splits.get(split, np.zeros(0, dtype=np.int64))
        for start in range(0, len(rows), max(1, batch_size // 2)):
            yield self.pair_batch(rows[start:start + max(1, batch_size // 2)])

    def pair_batch(self, rows):
        """The 2N-row batch of the pairs ``rows``: chosen replies, then rejected ones."""
        batch = pad_examples([self.examples[i][0] for i in rows] + [self.examples[i][1] for i in rows], self.pad_id)
        if self.reference is not None:
            batch.extra["reference"] = np.concatenate([self.reference[rows, 0], self.reference[rows, 1]])
        batch.extra["rows"] = np.asarray(rows)
        return batch

    def set_reference(self, reference):
        self.reference = np.asarray(reference, dtype=np.float64)

    def evaluate(self, model, split):
        """The implicit reward's figures on a split: the share of pairs whose policy-minus-reference log-ratio
        prefers the chosen reply (``reward_accuracy``, what DPO's implicit reward gets right) and the mean
        log-ratio margin (β times it is the reward margin)."""
        if self.reference is None or not len(self.splits.get(split, ())):
            return {}
        policy = sequence_logprobs(model, self, self.splits[split])
        margin = (policy[:, 0] - self.reference[self.splits[split], 0]) - \
                 (policy[:, 1] - self.reference[self.splits[split], 1])
        return {"reward_accuracy": float(np.mean(margin > 0)), "logratio_margin": float(np.mean(margin))}

    def describe(self):
        n_train, n_val = len(self.splits["train"]), len(self.splits["val"])
        return (f"preference pairs of {self.config['path']}: {len(self.examples):,} kept ({n_train:,} train, "
                f"{n_val:,} val; {self.dropped} without a reply token in the context left out)")


def sequence_logprobs(model, task, rows, batch_pairs=8):
    """(len(rows), 2) log-probabilities of the chosen and rejected replies of the pairs ``rows`` under
    ``model`` (eval mode, restored after): Σ over the reply's tokens of log softmax(logits)[token]."""
    training = model.training
    model.eval()
    out = np.zeros((len(rows), 2))
    for start in range(0, len(rows), batch_pairs):
        part = rows[start:start + batch_pairs]
        batch = task.pair_batch(part)
        logp, _ = ops.sequence_logprob_forward(model(**batch.inputs).astype(np.float64), batch.targets)
        out[start:start + len(part)] = np.stack([logp[:len(part)], logp[len(part):]], axis=1)
        model.clear_cache()
    model.train(training)
    return out
