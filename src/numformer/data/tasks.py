"""Synthetic algorithmic tasks: copy, reversal, sorting, parity and multi-digit addition.

Every task draws problems from seeded generators. Training batches come from
the trainer's ``rng`` only (so a resumed run sees the same batches); the
evaluation sets are generated once, at construction, from separate seed
streams (``[seed, split, length]``), de-duplicated, and the test set is
disjoint from the validation set. Both are held out from training exactly: a
training problem equal to an evaluation problem is rejected and redrawn (for
small problem spaces each evaluation set takes at most a quarter of the
problems of a length, so training keeps at least half of them).

Lengths. ``length`` is the length trained on and evaluated; ``min_length``
(when > 0 and < length) makes training draw each example's length uniformly
from [min_length, length]; ``test_lengths`` adds evaluation sets at other
lengths (e.g. longer ones, never seen in training), reported per length.

Sequence format (copy, reversal, sorting, addition, and parity with a scratchpad).
A problem is a prompt x and an answer y, over the vocabulary::

    0 <pad>   1 <bos>   2 <eos>   3 <sep>   4 <cls>   5... the task's symbols

- ``model_type = "transformer"`` (encoder-decoder, teacher forcing):
  ``src = x``, ``tgt = <bos> y``, targets ``y <eos>``; padding targets are IGNORE.
- ``model_type = "gpt"`` (decoder-only): the sequence ``x <sep> y <eos>``;
  inputs are all but its last token and targets are the next tokens, IGNORE on
  the prompt, so the loss is on the answer (and its ``<eos>``) only.

Metrics (``evaluate``): ``exact_match`` (the whole answer, ``<eos>`` included, is
right) and ``token_accuracy`` on the evaluation set at ``length``, and
``exact_match@L`` / ``token_accuracy@L`` for each of ``test_lengths``. They
come from ONE teacher-forced forward pass; exact match computed that way is
exactly greedy decoding's exact match (see ``batching.sequence_metrics``).

Which model. Every sequence task defaults to the decoder-only GPT format and
also supports the encoder-decoder Transformer (``model_type = "transformer"``);
the ``model_type`` key must match ``[model] type``. The GPT reads the prompt and
its own previous outputs in one causal attention; the Transformer's
cross-attention lets output step t read input position t (copy) or bit t (a
parity scratchpad), the same place whatever the length, or L - 1 - t (reversal,
at length L).
configs/ picks one per task; docs/experiments.md records the measurements
behind each choice.
"""
from __future__ import annotations

import numpy as np

from .. import decoding
from .base import IGNORE, Batch, Task, pad_sequences, register_task
from .batching import eval_mode, sequence_metrics

SPECIALS = ("<pad>", "<bos>", "<eos>", "<sep>", "<cls>")
PAD_ID, BOS_ID, EOS_ID, SEP_ID, CLS_ID = range(len(SPECIALS))
OFFSET = len(SPECIALS)          # symbol s has token id OFFSET + s
_SALT = 0x5EED                 # separates the evaluation seed streams from anything else seeded with `seed`
_SPLITS = ("val", "test")


def _clear(model):
    if hasattr(model, "clear_cache"):
        model.clear_cache()


def _key(prompt: np.ndarray) -> bytes:
    return np.asarray(prompt, dtype=np.int16).tobytes()


class SyntheticTask(Task):
    """Shared machinery; subclasses define ``symbols``, ``generate``, ``shape`` and ``space_size``."""

    model_type = "gpt"
    model_types = ("gpt", "transformer")
    common_keys = {
        "model_type": "gpt",           # batch format: "gpt" (decoder-only) or "transformer" (encoder-decoder)
        "length": 16,                  # length trained on (the maximum when min_length is set) and evaluated
        "min_length": 0,               # > 0: training lengths uniform in [min_length, length]; 0: always `length`
        "full_length_fraction": 0.0,   # with min_length: this share of each batch has the full `length`
        "test_lengths": [],            # extra evaluation lengths (e.g. longer than any seen in training)
        "n_val": 1000,                 # validation problems per evaluation length
        "n_test": 1000,                # test problems per evaluation length (disjoint from val and from training)
        "eval_batch_size": 250,        # batch size inside evaluate()
    }
    data_keys = common_keys

    def __init__(self, data_config: dict, seed: int = 0, tokenizer_state: dict | None = None):
        super().__init__(data_config, seed, tokenizer_state)
        c = self.config
        if c["model_type"] not in self.model_types:
            raise ValueError(f"task {self.name!r}: model_type = {c['model_type']!r}; choose one of "
                             f"{list(self.model_types)}")
        self.model_type = c["model_type"]           # instance attribute: the format this task produces
        self.length = int(c["length"])
        self.min_length = int(c["min_length"]) or self.length
        if not 1 <= self.min_length <= self.length:
            raise ValueError(f"task {self.name!r}: need 1 <= min_length <= length, got min_length="
                             f"{c['min_length']} and length={self.length}")
        self.full_length_fraction = float(c["full_length_fraction"])
        if not 0.0 <= self.full_length_fraction <= 1.0:
            raise ValueError(f"task {self.name!r}: full_length_fraction must be in [0, 1], got "
                             f"{c['full_length_fraction']}")
        self.test_lengths = [int(L) for L in c["test_lengths"] if int(L) != self.length]
        if any(L < 1 for L in self.test_lengths):
            raise ValueError(f"task {self.name!r}: test_lengths must be positive, got {c['test_lengths']}")
        self.test_lengths = sorted(set(self.test_lengths))
        self.eval_lengths = [self.length] + self.test_lengths
        for L in self.eval_lengths:
            self.check_length(L)
        self.tokens = list(SPECIALS) + list(self.symbols())
        if tokenizer_state is not None and tokenizer_state.get("tokens") != self.tokens:
            raise ValueError(f"the saved vocabulary of task {self.name!r} does not match these [data] settings "
                             f"(saved {len(tokenizer_state.get('tokens') or [])} tokens, now {len(self.tokens)}); "
                             "use the run's own config")
        self._build_eval_sets()

    # -- to define in subclasses ------------------------------------------------------------------
    def symbols(self) -> list[str]:
        raise NotImplementedError

    def generate(self, rng: np.random.Generator, n: int, length: int) -> tuple[list, list]:
        """n problems of the given length: (prompts, answers), lists of 1-D int arrays of symbol indices."""
        raise NotImplementedError

    def shape(self, length: int) -> tuple[int, int]:
        """(longest prompt, longest answer) at this length (answer without ``<eos>``)."""
        return length, length

    def space_size(self, length: int) -> int:
        """Number of distinct problems of this length (a Python int; may be astronomically large)."""
        raise NotImplementedError

    def check_length(self, length: int):
        """Raise a clear ValueError if the task cannot be generated at this length."""

    # -- data ---------------------------------------------------------------------------------------
    def _build_eval_sets(self):
        self._eval: dict[tuple[str, int], list] = {}
        held: set[bytes] = set()
        for si, split in enumerate(_SPLITS):
            wanted = int(self.config["n_val" if split == "val" else "n_test"])
            for L in self.eval_lengths:
                n = min(wanted, self.space_size(L) // 4)
                if n < 1:
                    raise ValueError(f"task {self.name!r}: length {L} has only {self.space_size(L)} distinct "
                                     "problems, too few to hold out evaluation sets; use a longer length")
                rng = np.random.default_rng([int(self.seed) & 0xFFFFFFFF, _SALT, si, L])
                examples = []
                while len(examples) < n:
                    for p, a in zip(*self.generate(rng, n - len(examples), L)):
                        k = _key(p)
                        if k not in held:
                            held.add(k)
                            examples.append((p, a))
                self._eval[split, L] = examples
        self._held_out = held

    def eval_set(self, split: str, length: int | None = None) -> list:
        """The evaluation problems [(prompt, answer), ...] of a split at a length (default: ``length``)."""
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {list(_SPLITS)}, got {split!r}")
        return self._eval[split, self.length if length is None else length]

    def held_out(self, prompt) -> bool:
        """True if this prompt is in an evaluation set (so training never draws it)."""
        return _key(prompt) in self._held_out

    def sample(self, rng: np.random.Generator, n: int, length: int) -> list:
        """n training problems of a length, redrawing any that belongs to an evaluation set."""
        out = []
        for _ in range(10_000):
            out += [(p, a) for p, a in zip(*self.generate(rng, n - len(out), length)) if not self.held_out(p)]
            if len(out) == n:
                return out
        raise RuntimeError(f"task {self.name!r}: cannot draw training problems of length {length} "
                           "outside the evaluation sets")

    def train_batch(self, batch_size: int, rng: np.random.Generator) -> Batch:
        if self.min_length == self.length:
            return self.make_batch(self.sample(rng, batch_size, self.length))
        lengths = rng.integers(self.min_length, self.length + 1, size=batch_size)
        if self.full_length_fraction > 0:
            # mixed lengths teach the rule early; the evaluated length gets a fixed share of every batch
            lengths[:int(round(self.full_length_fraction * batch_size))] = self.length
        examples = []
        for L in np.unique(lengths):
            examples += self.sample(rng, int(np.sum(lengths == L)), int(L))
        return self.make_batch(examples)

    def eval_batches(self, split: str, batch_size: int, length: int | None = None):
        examples = self.eval_set(split, length)
        for i in range(0, len(examples), batch_size):
            yield self.make_batch(examples[i:i + batch_size])

    # -- formatting ---------------------------------------------------------------------------------
    def make_batch(self, examples: list) -> Batch:
        """Token ids and targets for [(prompt, answer), ...] in this task's model format."""
        B = len(examples)
        lengths = np.array([len(p) for p, _ in examples])
        if self.model_type == "gpt":
            seqs = [np.concatenate([p + OFFSET, [SEP_ID], a + OFFSET, [EOS_ID]]) for p, a in examples]
            T = max(len(s) for s in seqs) - 1
            idx = np.full((B, T), PAD_ID, dtype=np.int64)
            tgt = np.full((B, T), IGNORE, dtype=np.int64)
            for b, (s, (p, _)) in enumerate(zip(seqs, examples)):
                idx[b, :len(s) - 1] = s[:-1]
                tgt[b, len(p):len(s) - 1] = s[len(p) + 1:]       # the answer and <eos>; IGNORE on the prompt
            return Batch({"idx": idx}, tgt, extra={"lengths": lengths})
        if self.model_type == "transformer":
            S = max(len(p) for p, _ in examples)
            T = max(len(a) for _, a in examples) + 1
            src = np.full((B, S), PAD_ID, dtype=np.int64)
            tgt_in = np.full((B, T), PAD_ID, dtype=np.int64)
            tgt = np.full((B, T), IGNORE, dtype=np.int64)
            for b, (p, a) in enumerate(examples):
                src[b, :len(p)] = p + OFFSET
                tgt_in[b, 0] = BOS_ID
                tgt_in[b, 1:len(a) + 1] = a + OFFSET
                tgt[b, :len(a)] = a + OFFSET
                tgt[b, len(a)] = EOS_ID
            return Batch({"src": src, "tgt": tgt_in}, tgt, extra={"lengths": lengths})
        raise ValueError(f"task {self.name!r} has no {self.model_type!r} format")

    def model_config(self) -> dict:
        V = len(self.tokens)
        lengths = [self.length] + self.test_lengths
        shapes = [self.shape(L) for L in lengths]
        if self.model_type == "gpt":
            return {"vocab_size": V, "block_size": max(lp + la + 1 for lp, la in shapes)}
        return {"src_vocab_size": V, "tgt_vocab_size": V, "src_pad_id": PAD_ID, "tgt_pad_id": PAD_ID,
                "bos_id": BOS_ID, "eos_id": EOS_ID, "max_len": max(max(lp, la + 1) for lp, la in shapes)}

    # -- metrics ------------------------------------------------------------------------------------
    def _forward(self, model, batch):
        return model(**batch.inputs)

    def evaluate(self, model, split: str) -> dict:
        bs = int(self.config["eval_batch_size"])
        out = {}
        with eval_mode(model):
            for L in self.eval_lengths:
                exact, hits, total = [], 0, 0
                for batch in self.eval_batches(split, bs, L):
                    e, h, t = sequence_metrics(self._forward(model, batch), batch.targets)
                    _clear(model)
                    exact.append(e)
                    hits, total = hits + h, total + t
                suffix = "" if L == self.length else f"@{L}"
                out[f"exact_match{suffix}"] = float(np.concatenate(exact).mean())
                out[f"token_accuracy{suffix}"] = hits / max(total, 1)
        return out

    def greedy_answers(self, model, examples: list, n_steps: int) -> np.ndarray:
        """Greedy decoding of problems of one prompt length: (len(examples), n_steps) token ids.

        The model writes ``n_steps`` tokens after the prompt (GPT: after ``prompt <sep>``, with the
        key/value cache; Transformer: after ``<bos>``, stopping a row at ``<eos>``, whose later
        slots are ``<eos>``), each from its own previous outputs, as at inference.
        """
        prompts = np.stack([np.asarray(p) for p, _ in examples]) + OFFSET
        if self.model_type == "gpt":
            idx = np.concatenate([prompts, np.full((len(prompts), 1), SEP_ID)], axis=1)
            return decoding.generate(model, idx, n_steps, greedy=True)[:, idx.shape[1]:]
        rows = decoding.greedy_decode(model, prompts, n_steps, BOS_ID, EOS_ID)
        return pad_sequences(rows, EOS_ID, n_steps)

    def analysis_example(self, split: str = "test", length: int | None = None) -> tuple[dict, dict]:
        """The first evaluation problem of a split (at ``length``, default the trained length) as a batch of one,
        labelled with its tokens (symbols, ``<sep>``, ``<bos>`` ...), for attention heatmaps."""
        batch = self.make_batch(self.eval_set(split, length)[:1])
        inputs = {k: np.asarray(v)[:1] for k, v in batch.inputs.items()}
        return inputs, {k: [self.tokens[int(t)] for t in v[0]] for k, v in inputs.items()}

    # -- bookkeeping --------------------------------------------------------------------------------
    def tokenizer_state(self) -> dict:
        return {"type": "symbols", "tokens": self.tokens}

    def decode(self, ids) -> str:
        """Token ids as text (symbols joined; ``<pad>`` dropped), for printing examples."""
        toks = [self.tokens[i] for i in np.asarray(ids).reshape(-1).tolist() if i != PAD_ID]
        sep = "" if all(len(t) == 1 for t in self.symbols()) else " "
        return sep.join(toks)

    def describe(self) -> str:
        lengths = (f"length {self.length}" if self.min_length == self.length
                   else f"lengths {self.min_length}..{self.length}")
        extra = f", also evaluated at lengths {self.test_lengths}" if self.test_lengths else ""
        n = {s: len(self._eval[s, self.length]) for s in _SPLITS}
        return (f"{self.name}: {self.summary()}, {lengths}{extra}; {self.model_type} format, vocabulary "
                f"{len(self.tokens)}; {n['val']} val / {n['test']} test problems per length, held out of training")

    def summary(self) -> str:
        return "synthetic"


# ---------------------------------------------------------------------------------------------------------------
@register_task("copy")
class CopyTask(SyntheticTask):
    """Copy: the answer is the prompt, a uniform random sequence over ``vocab`` symbols.

    Model: GPT by default (the answer position i attends to prompt position i,
    a fixed offset of length+1 back); ``model_type = "transformer"`` for the
    encoder-decoder format. Target: 99% exact match at length 128.
    """

    data_keys = {**SyntheticTask.common_keys, "length": 128, "vocab": 10}

    def symbols(self):
        return [str(i) for i in range(self.config["vocab"])]

    def check_length(self, length):
        if self.config["vocab"] < 2:
            raise ValueError(f"task {self.name!r}: vocab must be >= 2, got {self.config['vocab']}")

    def space_size(self, length):
        return int(self.config["vocab"]) ** length

    def answer(self, prompt):
        return prompt.copy()

    def generate(self, rng, n, length):
        P = rng.integers(0, self.config["vocab"], size=(n, length))
        return list(P), [self.answer(p) for p in P]

    def summary(self):
        return f"uniform sequences over {self.config['vocab']} symbols"


@register_task("reversal")
class ReversalTask(CopyTask):
    """Reversal: the answer is the prompt backwards.

    Model: GPT by default: answer position p reads prompt position 2L - p, an
    attention pattern its learned position table represents directly; with
    several lengths (``min_length``) the model must also find where the prompt
    ends, which the ``<sep>`` token marks. ``"transformer"`` is supported. Target:
    99% exact match at length 64.
    """

    data_keys = {**SyntheticTask.common_keys, "length": 64, "vocab": 10}

    def answer(self, prompt):
        return prompt[::-1].copy()


@register_task("sorting")
class SortingTask(SyntheticTask):
    """Sorting: ``length`` numbers drawn uniformly (with repeats) from 0..n_values-1, one token each;
    the answer is them in ascending order.

    Model: GPT by default (like every sequence task here; see the module
    docstring); each answer step is a content lookup (the smallest number not
    yet emitted, counting repeats against the answer so far through causal
    self-attention) rather than a positional one. Target: 99% exact match for
    32 numbers from 0..99.
    """

    data_keys = {**SyntheticTask.common_keys, "length": 32, "n_values": 100}

    def symbols(self):
        return [str(i) for i in range(self.config["n_values"])]

    def check_length(self, length):
        if self.config["n_values"] < 2:
            raise ValueError(f"task {self.name!r}: n_values must be >= 2, got {self.config['n_values']}")

    def space_size(self, length):
        return int(self.config["n_values"]) ** length

    def generate(self, rng, n, length):
        P = rng.integers(0, self.config["n_values"], size=(n, length))
        return list(P), list(np.sort(P, axis=1))

    def summary(self):
        return f"sort numbers from 0..{self.config['n_values'] - 1}"


@register_task("parity")
class ParityTask(SyntheticTask):
    """Parity of a uniform random bit string.

    ``model_type = "classifier"`` (default): an EncoderClassifier reads
    ``<cls> b_1 .. b_L`` and predicts the parity, one bit, so a classifier is
    the natural model. Parity is hard for transformers: with a uniform
    distribution over L-bit strings no subset of fewer than L bits says anything
    about the label, so at a single long length the gradient carries no signal.
    The default ``min_length = 1`` trains on lengths uniform in [1, length]:
    short strings are learnable and the counting mechanism they need is the one
    that long strings need.

    ``model_type = "gpt"`` or ``"transformer"``: a scratchpad, the answer
    written out step by step, so that each step is a local rule:

    - ``scratchpad = "count"`` (default): the running counts of ones
      c_1 .. c_L (tokens ``c0`` .. ``cL``), then the parity bit of c_L. Each step
      is c_i = c_{i-1} + b_i: the previous output plus one retrieved input bit.
      That rule is additive, so retrieving b_i lowers the loss on its own and
      the gradient finds the retrieval; the final bit is a function of one token.
    - ``scratchpad = "parity"``: the running parities s_i = s_{i-1} xor b_i
      (s_L is the parity). Each step is also local, but xor is the problem in
      miniature: neither b_i nor s_{i-1} alone says anything about s_i, so
      nothing rewards retrieving b_i until the xor is already computed.

    Which lengths to train on depends on the model. With ``"gpt"`` use a fixed
    length (``min_length = length``): in one sequence the offset from an output
    step back to its input bit is length + 1 positions, which varies with mixed
    lengths. With ``"transformer"`` step t reads source bit t through the
    cross-attention, the diagonal, the same at every length, so lengths can be
    mixed (``min_length = 1``): short strings give a strong signal early.
    ``full_length_fraction`` gives a share of every batch the full length, since
    with lengths uniform in 1..L few strings are long. (docs/experiments.md has
    the measurements of each variant.)

    Metrics: classifier: ``accuracy`` (and ``accuracy@L``), the predicted
    label. Scratchpad: ``accuracy`` is the parity bit that the model writes
    last when it decodes greedily, every scratchpad step from its own previous
    outputs (as at inference; one decoding pass over the evaluation set), so
    the figure means the same as the classifier's; ``exact_match`` (the whole
    scratchpad and bit right, from one teacher-forced pass, equal to greedy
    decoding's) and ``token_accuracy`` (teacher-forced), each also ``@L``.
    So ``accuracy`` >= ``exact_match``: a right scratchpad ends on the right
    bit, and a wrong one may still end on it by chance.
    """

    model_type = "classifier"
    model_types = ("classifier", "gpt", "transformer")
    data_keys = {**SyntheticTask.common_keys, "model_type": "classifier", "length": 64, "min_length": 1,
                 "scratchpad": "count"}

    def check_length(self, length):
        if self.config["scratchpad"] not in ("count", "parity"):
            raise ValueError(f"task 'parity': scratchpad = {self.config['scratchpad']!r}; choose \"count\" or "
                             "\"parity\"")

    def _counting(self):
        return self.model_type != "classifier" and self.config["scratchpad"] == "count"

    def symbols(self):
        counts = [f"c{k}" for k in range(max(self.eval_lengths) + 1)] if self._counting() else []
        return ["0", "1"] + counts

    def space_size(self, length):
        return 2 ** length

    def shape(self, length):
        return length, length + 1 if self._counting() else length

    def generate(self, rng, n, length):
        P = rng.integers(0, 2, size=(n, length))
        C = np.cumsum(P, axis=1)
        if self._counting():       # c_1 .. c_L as symbols 2 + c, then the parity bit
            return list(P), list(np.concatenate([C + 2, C[:, -1:] % 2], axis=1))
        return list(P), list(C % 2)

    def greedy_accuracy(self, model, split) -> dict:
        """Scratchpad formats: ``accuracy`` (and ``accuracy@L``), the fraction of strings whose parity bit,
        the last answer token, is right when the model writes its whole scratchpad by greedy decoding."""
        bs = int(self.config["eval_batch_size"])
        out = {}
        with eval_mode(model):
            for L in self.eval_lengths:
                examples = self.eval_set(split, L)
                n_steps = len(examples[0][1])
                hits = 0
                for i in range(0, len(examples), bs):
                    chunk = examples[i:i + bs]
                    bits = self.greedy_answers(model, chunk, n_steps)[:, -1]
                    hits += int(np.sum(bits == np.array([a[-1] + OFFSET for _, a in chunk])))
                    _clear(model)
                out["accuracy" if L == self.length else f"accuracy@{L}"] = hits / len(examples)
        return out

    def summary(self):
        if self.model_type == "classifier":
            return "parity of bit strings"
        return f"parity of bit strings with a running-{'count' if self._counting() else 'parity'} scratchpad"

    def make_batch(self, examples):
        if self.model_type != "classifier":
            return super().make_batch(examples)
        B = len(examples)
        lengths = np.array([len(p) for p, _ in examples])
        ids = np.full((B, int(lengths.max()) + 1), PAD_ID, dtype=np.int64)
        ids[:, 0] = CLS_ID
        for b, (p, _) in enumerate(examples):
            ids[b, 1:len(p) + 1] = p + OFFSET
        labels = np.array([a[-1] for _, a in examples], dtype=np.int64)
        return Batch({"ids": ids}, labels, extra={"lengths": lengths})

    def model_config(self):
        if self.model_type != "classifier":
            return super().model_config()
        return {"vocab_size": len(self.tokens), "n_classes": 2, "pad_id": PAD_ID,
                "max_len": max(self.eval_lengths + [self.length]) + 1}

    def evaluate(self, model, split):
        if self.model_type != "classifier":
            return {**self.greedy_accuracy(model, split), **super().evaluate(model, split)}
        bs = int(self.config["eval_batch_size"])
        out = {}
        with eval_mode(model):
            for L in self.eval_lengths:
                hits = total = 0
                for batch in self.eval_batches(split, bs, L):
                    pred = np.asarray(model(**batch.inputs)).argmax(axis=-1)
                    _clear(model)
                    hits += int(np.sum(pred == batch.targets))
                    total += len(batch.targets)
                out["accuracy" if L == self.length else f"accuracy@{L}"] = hits / total
        return out


@register_task("addition")
class AdditionTask(SyntheticTask):
    """Multi-digit addition a + b of two numbers of up to ``length`` digits.

    Each operand's digit count is uniform in 1..length, then the number is
    uniform among numbers with that many digits (so short and long operands
    are equally common). Prompt ``a + b`` (digits, most significant first);
    answer the digits of a + b.

    - ``pad_operands`` (default true): operands are zero-padded to ``length``
      digits and the sum to length+1 digits, so every digit has a fixed place.
    - ``reverse_answer`` (default true): the sum is written least significant
      digit first. This is the well-known trick that makes carries learnable
      (Lee et al. 2023, "Teaching Arithmetic to Small Transformers"): the digit
      s_i = (a_i + b_i + c_i) mod 10 needs the carry c_i from the lower digits,
      which a left-to-right decoder has already produced when it writes the
      answer backwards: c_i is 1 iff a_{i-1} + b_{i-1} >= 10, or = 9 and the
      previous output digit is 0. Written forwards, the first digit would depend
      on a carry chain through every digit below it.

    Model: GPT by default (with padded operands, output digit i reads two
    prompt positions at fixed offsets, plus its previous output); ``"transformer"`` too.
    Target: 99% exact match for up to 8-digit numbers. Lengths up to 18 digits.
    """

    data_keys = {**SyntheticTask.common_keys, "length": 8, "reverse_answer": True, "pad_operands": True}

    def symbols(self):
        return [str(d) for d in range(10)] + ["+"]

    def check_length(self, length):
        if length > 18:
            raise ValueError(f"task {self.name!r}: numbers of up to 18 digits are supported, got {length}")

    def space_size(self, length):
        return 10 ** (2 * length)

    def shape(self, length):
        return 2 * length + 1, length + 1

    def operands(self, rng, n, length):
        """n numbers: digit count uniform in 1..length, then uniform among numbers with that many digits."""
        d = rng.integers(1, length + 1, size=n)
        low = np.where(d == 1, 0, 10 ** (d - 1).astype(np.int64))
        return rng.integers(low, 10 ** d.astype(np.int64))

    @staticmethod
    def digits(x: int, width: int = 0) -> np.ndarray:
        s = str(int(x)).zfill(width)
        return np.frombuffer(s.encode(), dtype=np.uint8).astype(np.int64) - 48

    def encode_problem(self, a: int, b: int, length: int):
        """(prompt, answer) symbol arrays for a + b at this operand length."""
        pad = self.config["pad_operands"]
        w = length if pad else 0
        prompt = np.concatenate([self.digits(a, w), [10], self.digits(b, w)])
        answer = self.digits(a + b, length + 1 if pad else 0)
        return prompt, (answer[::-1].copy() if self.config["reverse_answer"] else answer)

    def decode_problem(self, prompt) -> tuple[int, int]:
        """(a, b) from a prompt of symbol indices."""
        s = "".join("+" if v == 10 else str(int(v)) for v in prompt)
        a, b = s.split("+")
        return int(a), int(b)

    def answer_value(self, answer) -> int:
        """The integer an answer's digits spell (undoing the reversal)."""
        digits = answer[::-1] if self.config["reverse_answer"] else answer
        return int("".join(str(int(v)) for v in digits))

    def generate(self, rng, n, length):
        A, B = self.operands(rng, n, length), self.operands(rng, n, length)
        pairs = [self.encode_problem(a, b, length) for a, b in zip(A.tolist(), B.tolist())]
        return [p for p, _ in pairs], [a for _, a in pairs]

    def summary(self):
        return ("addition" + (", zero-padded operands" if self.config["pad_operands"] else "")
                + (", answer least significant digit first" if self.config["reverse_answer"] else ""))
