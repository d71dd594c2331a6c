"""Synthetic tasks: correct answers, held-out evaluation sets, batch layout, metrics, determinism."""
import json

import numpy as np
import pytest

from numformer.data import IGNORE, make_task
from numformer.data.batching import sequence_metrics
from numformer.data.tasks import BOS_ID, CLS_ID, EOS_ID, OFFSET, PAD_ID, SEP_ID

SEQ_TASKS = ["copy", "reversal", "sorting", "addition", "parity"]


def task(name, **kw):
    defaults = {"copy": {"length": 6}, "reversal": {"length": 6}, "sorting": {"length": 6},
                "addition": {"length": 3}, "parity": {"length": 8}}[name]
    return make_task({"task": name, "n_val": 50, "n_test": 50, **defaults, **kw}, seed=3)


def expected_answer(t, prompt):
    """Recompute the answer from the prompt (symbol indices), independently of the task's generator."""
    p = [int(v) for v in prompt]
    if t.name == "copy":
        return p
    if t.name == "reversal":
        return p[::-1]
    if t.name == "sorting":
        return sorted(p)
    if t.name == "parity":
        if t.config["scratchpad"] == "count":       # counts c_1..c_L are symbols 2 + c, then the parity bit
            return [2 + sum(p[:i + 1]) for i in range(len(p))] + [sum(p) % 2]
        return [sum(p[:i + 1]) % 2 for i in range(len(p))]
    if t.name == "addition":
        s = "".join("+" if v == 10 else str(v) for v in p)
        a, b = (int(x) for x in s.split("+"))
        digits = [int(c) for c in str(a + b).zfill(t.length + 1 if t.config["pad_operands"] else 0)]
        return digits[::-1] if t.config["reverse_answer"] else digits
    raise AssertionError(t.name)


def unpack(t, batch):
    """(prompt, answer) symbol lists of each row of a sequence-format batch."""
    rows = []
    if t.model_type == "transformer":
        for src, tgt in zip(batch.inputs["src"], batch.targets):
            p = [v - OFFSET for v in src if v != PAD_ID]
            ans = tgt[tgt != IGNORE]
            assert ans[-1] == EOS_ID
            rows.append((p, [v - OFFSET for v in ans[:-1]]))
    else:
        for idx, tgt in zip(batch.inputs["idx"], batch.targets):
            sep = int(np.flatnonzero(idx == SEP_ID)[0])
            ans = tgt[tgt != IGNORE]
            assert ans[-1] == EOS_ID
            rows.append(([v - OFFSET for v in idx[:sep]], [v - OFFSET for v in ans[:-1]]))
    return rows


# ------------------------------------------------------------------------------------------------ answers
@pytest.mark.parametrize("model_type", ["transformer", "gpt"])
@pytest.mark.parametrize("name, kw", [
    ("copy", {}), ("copy", {"vocab": 3, "min_length": 2}), ("reversal", {"min_length": 1}), ("sorting", {}),
    ("sorting", {"n_values": 5}), ("parity", {}), ("parity", {"scratchpad": "parity", "min_length": 8}),
    ("addition", {}), ("addition", {"reverse_answer": False}),
    ("addition", {"pad_operands": False, "min_length": 1}), ("addition", {"length": 12}),
])
def test_sequence_answers_are_right(name, kw, model_type):
    t = task(name, model_type=model_type, **kw)
    rng = np.random.default_rng(0)
    for batch in [t.train_batch(64, rng), next(t.eval_batches("val", 64)), next(t.eval_batches("test", 64))]:
        for prompt, answer in unpack(t, batch):
            assert answer == expected_answer(t, prompt)
            assert t.min_length <= (len(prompt) if name != "addition" else t.length)


def test_addition_formats_spelled_out():
    t = task("addition", length=3)
    p, a = t.encode_problem(342, 8, 3)
    assert t.decode(p + OFFSET) == "342+008" and t.decode(a + OFFSET) == "0530"      # 350, reversed, 4 digits
    t2 = task("addition", length=3, pad_operands=False, reverse_answer=False)
    p, a = t2.encode_problem(342, 8, 3)
    assert t2.decode(p + OFFSET) == "342+8" and t2.decode(a + OFFSET) == "350"
    assert t.answer_value(t.encode_problem(999, 999, 3)[1]) == 1998


def test_addition_operand_lengths_cover_short_and_long():
    t = task("addition", length=8)
    x = t.operands(np.random.default_rng(0), 20000, 8)
    n_digits = np.array([len(str(v)) for v in x])
    counts = np.bincount(n_digits, minlength=9)[1:]
    assert counts.min() > 0.8 * len(x) / 8 and x.max() < 10 ** 8


def test_parity_scratchpads_spelled_out():
    t = task("parity", model_type="gpt", length=6, min_length=6)
    p = np.array([1, 1, 0, 1, 0, 0])
    _, (ans,) = t.generate(np.random.default_rng(0), 1, 6)
    assert t.symbols() == ["0", "1"] + [f"c{k}" for k in range(7)]
    assert [t.tokens[OFFSET + v] for v in expected_answer(t, p)] == ["c1", "c2", "c2", "c3", "c3", "c3", "1"]
    assert len(ans) == 7 and t.shape(6) == (6, 7)
    x = task("parity", model_type="transformer", scratchpad="parity", length=6, min_length=6)
    assert x.symbols() == ["0", "1"] and x.shape(6) == (6, 6)
    with pytest.raises(ValueError, match="scratchpad"):
        task("parity", model_type="gpt", scratchpad="bits")


def test_parity_classifier_labels_and_layout():
    t = task("parity", length=12, min_length=1)
    assert t.model_type == "classifier"
    b = t.train_batch(200, np.random.default_rng(1))
    ids, y = b.inputs["ids"], b.targets
    assert y.shape == (200,) and (ids[:, 0] == CLS_ID).all()
    for row, label in zip(ids, y):
        bits = row[1:][row[1:] != PAD_ID] - OFFSET
        assert set(bits.tolist()) <= {0, 1} and label == bits.sum() % 2
    lengths = (ids != PAD_ID).sum(axis=1) - 1
    assert lengths.min() < 4 and lengths.max() == 12                       # uniform lengths in [1, 12]
    assert t.model_config() == {"vocab_size": OFFSET + 2, "n_classes": 2, "pad_id": PAD_ID, "max_len": 13}


# ------------------------------------------------------------------------------------------------ held out
def _prompts(t, split, L=None):
    return {bytes(np.asarray(p, np.int16).tobytes()) for p, _ in t.eval_set(split, L)}


@pytest.mark.parametrize("name, kw", [("parity", {"length": 6, "min_length": 4}), ("addition", {"length": 1}),
                                      ("copy", {"length": 3, "vocab": 3}), ("sorting", {"length": 6})])
def test_eval_sets_disjoint_and_held_out_of_training(name, kw):
    t = task(name, **kw)
    val, test = _prompts(t, "val"), _prompts(t, "test")
    assert val and test and not (val & test)
    assert len(val) == len(t.eval_set("val"))                              # no duplicates inside a split
    space = t.space_size(t.length)
    if space < 10 ** 6:
        assert len(val) + len(test) <= space // 2                          # training keeps half the problems
    seen = set()
    rng = np.random.default_rng(0)
    for _ in range(30):
        b = t.train_batch(64, rng)
        rows = unpack(t, b) if t.model_type != "classifier" else [
            ((r[1:][r[1:] != PAD_ID] - OFFSET).tolist(), None) for r in b.inputs["ids"]]
        seen |= {np.asarray(p, np.int16).tobytes() for p, _ in rows}
    assert not (seen & (val | test))
    if space <= 100 and t.min_length == t.length:
        assert len(seen) == space - len(val) - len(test)                   # and it does see all the others


def test_test_lengths_sets_and_separate_seed_streams():
    t = task("copy", length=6, test_lengths=[8, 10, 6])
    assert t.eval_lengths == [6, 8, 10]
    assert {len(p) for p, _ in t.eval_set("test", 10)} == {10}
    other_seed = make_task({"task": "copy", "length": 6, "n_val": 50, "n_test": 50}, seed=4)
    assert not (_prompts(t, "val") & _prompts(other_seed, "val"))
    with pytest.raises(ValueError, match="too few to hold out"):
        task("parity", length=1, min_length=1)


# ------------------------------------------------------------------------------------------------ batches
@pytest.mark.parametrize("name", SEQ_TASKS)
def test_gpt_batch_layout(name):
    t = task(name, model_type="gpt")
    b = t.train_batch(8, np.random.default_rng(0))
    idx, tgt = b.inputs["idx"], b.targets
    assert idx.shape == tgt.shape and idx.dtype == np.int64
    lp, la = t.shape(t.length)
    for row, trow in zip(idx, tgt):
        sep = int(np.flatnonzero(row == SEP_ID)[0])
        assert (trow[:sep] == IGNORE).all()                                # no loss on the prompt
        n_ans = int((trow != IGNORE).sum())
        assert (trow[sep:sep + n_ans] != IGNORE).all() and (trow[sep + n_ans:] == IGNORE).all()
        assert trow[sep + n_ans - 1] == EOS_ID
        # next-token alignment: each answer target is the following input token
        assert (trow[sep:sep + n_ans - 1] == row[sep + 1:sep + n_ans]).all()
    assert idx.shape[1] <= t.model_config()["block_size"]


@pytest.mark.parametrize("name", SEQ_TASKS)
def test_transformer_batch_layout(name):
    t = task(name, model_type="transformer", min_length=2) if name != "addition" else task(name, model_type="transformer")
    b = t.train_batch(16, np.random.default_rng(0))
    src, tgt_in, tgt = b.inputs["src"], b.inputs["tgt"], b.targets
    assert tgt_in.shape == tgt.shape and (tgt_in[:, 0] == BOS_ID).all()
    for x, yin, y in zip(src, tgt_in, tgt):
        n = int((y != IGNORE).sum())
        assert y[n - 1] == EOS_ID and (y[n:] == IGNORE).all()
        assert (yin[1:n] == y[:n - 1]).all() and (yin[n:] == PAD_ID).all()  # shifted right; pads after
    cfg = t.model_config()
    assert cfg["src_pad_id"] == cfg["tgt_pad_id"] == PAD_ID and cfg["src_vocab_size"] == len(t.tokens)
    assert (cfg["bos_id"], cfg["eos_id"]) == (BOS_ID, EOS_ID)       # kept by the model for generate()
    assert max(src.shape[1], tgt.shape[1]) <= cfg["max_len"]


# ------------------------------------------------------------------------------------------------ determinism
@pytest.mark.parametrize("name", SEQ_TASKS)
def test_batches_depend_only_on_rng(name):
    t1, t2 = task(name, min_length=1), task(name, min_length=1)
    b1 = t1.train_batch(32, np.random.default_rng(7))
    b2 = t2.train_batch(32, np.random.default_rng(7))
    for k in b1.inputs:
        np.testing.assert_array_equal(b1.inputs[k], b2.inputs[k])
    np.testing.assert_array_equal(b1.targets, b2.targets)
    rng = np.random.default_rng(7)
    t1.train_batch(32, rng)
    state = rng.bit_generator.state                                         # resume from a saved rng state
    nxt = t1.train_batch(32, rng)
    rng2 = np.random.default_rng()
    rng2.bit_generator.state = state
    np.testing.assert_array_equal(t2.train_batch(32, rng2).targets, nxt.targets)
    e1 = [b.targets for b in t1.eval_batches("val", 16)]
    e2 = [b.targets for b in t1.eval_batches("val", 16)]
    e3 = [b.targets for b in t2.eval_batches("val", 16)]
    assert all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(e1, e2, e3))


def test_tokenizer_state_roundtrip_and_mismatch():
    t = task("sorting", n_values=20)
    state = json.loads(json.dumps(t.tokenizer_state()))
    again = make_task({"task": "sorting", "length": 6, "n_values": 20, "n_val": 50, "n_test": 50}, 3, state)
    assert again.tokens == t.tokens
    with pytest.raises(ValueError, match="does not match"):
        make_task({"task": "sorting", "length": 6, "n_values": 30, "n_val": 50, "n_test": 50}, 3, state)


def test_bad_keys_are_rejected():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \[.lenght.\] in \[data\]"):
        make_task({"task": "copy", "lenght": 5})
    with pytest.raises(ValueError, match="model_type"):
        make_task({"task": "copy", "model_type": "classifier"})
    with pytest.raises(ValueError, match="min_length <= length"):
        make_task({"task": "copy", "length": 4, "min_length": 5})


# ------------------------------------------------------------------------------------------------ metrics
class TableModel:
    """A 'model' that answers from a table of targets, with chosen answer tokens made wrong."""

    def __init__(self, task, split, wrong=()):
        self.table = {}
        for L in task.eval_lengths:
            for batch in task.eval_batches(split, 7, L):
                key_arr = batch.inputs.get("idx", batch.inputs.get("src"))
                for i in range(len(batch.targets)):
                    self.table[key_arr[i].tobytes()] = batch.targets[i]
        self.wrong = set(wrong)
        self.V = len(task.tokens)
        self.training = True

    def __call__(self, idx=None, src=None, tgt=None, ids=None):
        x = idx if idx is not None else src
        out = np.zeros(x.shape[:1] + (idx if idx is not None else tgt).shape[1:] + (self.V,))
        for i, row in enumerate(x):
            t = self.table[row.tobytes()].copy()
            n = 0
            for j in range(len(t)):
                if t[j] != IGNORE:
                    if (row.tobytes(), n) in self.wrong:
                        t[j] = (t[j] + 1) % self.V
                    n += 1
                    out[i, j, t[j]] = 1.0
        return out

    def eval(self):
        self.training = False

    def train(self, mode=True):
        self.training = mode


@pytest.mark.parametrize("model_type", ["gpt", "transformer"])
def test_evaluate_exact_match_and_token_accuracy(model_type):
    t = task("reversal", model_type=model_type, test_lengths=[9])
    perfect = TableModel(t, "val")
    assert t.evaluate(perfect, "val") == {"exact_match": 1.0, "token_accuracy": 1.0,
                                          "exact_match@9": 1.0, "token_accuracy@9": 1.0}
    assert perfect.training is True                                          # mode restored
    first = next(t.eval_batches("val", 7))
    key0 = first.inputs.get("idx", first.inputs.get("src"))[0].tobytes()
    key1 = first.inputs.get("idx", first.inputs.get("src"))[1].tobytes()
    model = TableModel(t, "val", wrong=[(key0, 0), (key0, 3), (key1, 6)])     # 6 is the <eos> slot
    m = t.evaluate(model, "val")
    n = len(t.eval_set("val"))
    assert m["exact_match"] == pytest.approx(1 - 2 / n)
    assert m["token_accuracy"] == pytest.approx(1 - 3 / (n * 7))
    assert m["exact_match@9"] == 1.0


def test_sequence_metrics_ignores_non_answer_positions():
    targets = np.array([[IGNORE, 3, 4], [IGNORE, 3, IGNORE]])
    logits = np.zeros((2, 3, 5))
    logits[0, 0, 1] = logits[0, 1, 3] = logits[0, 2, 4] = 1      # row 0: right on the answer
    logits[1, 0, 2] = logits[1, 1, 1] = logits[1, 2, 0] = 1      # row 1: wrong at position 1
    exact, hits, total = sequence_metrics(logits, targets)
    assert exact.tolist() == [True, False] and (hits, total) == (2, 3)


class NoisyCopyModel:
    """A hand-set causal model for the copy task: it predicts the right next token, except that it
    writes (right - 1) when the token it was just fed is 2 and the right one is 3, so its mistakes
    depend on the prefix it sees: teacher-forced and greedy prefixes differ after a mistake."""

    def __init__(self, V, L, kind):
        self.V, self.L, self.kind = V, L, kind

    def _logit(self, prev, right):
        out = np.zeros(self.V)
        tok = right - 1 if (prev == OFFSET + 2 and right == OFFSET + 3) else right
        out[tok] = 1.0
        return out

    def __call__(self, idx=None, src=None, tgt=None):
        L = self.L
        if self.kind == "gpt":
            out = np.zeros(idx.shape + (self.V,))
            for b, row in enumerate(idx):
                for t in range(L, idx.shape[1]):                   # t = L is <sep>; predict x[t - L] or <eos>
                    right = row[t - L] if t < 2 * L else EOS_ID
                    out[b, t] = self._logit(row[t], right)
            return out
        out = np.zeros(tgt.shape + (self.V,))
        for b in range(tgt.shape[0]):
            for t in range(tgt.shape[1]):
                right = src[b, t] if t < L else EOS_ID
                out[b, t] = self._logit(tgt[b, t], right)
        return out


def greedy(model, kind, prompt_ids, n_steps):
    if kind == "gpt":
        seq = list(prompt_ids) + [SEP_ID]
        start = len(seq)
        for _ in range(n_steps):
            seq.append(int(model(idx=np.array([seq]))[0, -1].argmax()))
            if seq[-1] == EOS_ID:
                break
        return seq[start:]
    out = [BOS_ID]
    for _ in range(n_steps):
        out.append(int(model(src=np.array([prompt_ids]), tgt=np.array([out]))[0, -1].argmax()))
        if out[-1] == EOS_ID:
            break
    return out[1:]


@pytest.mark.parametrize("kind", ["gpt", "transformer"])
def test_teacher_forced_exact_match_equals_greedy_decoding(kind):
    L = 6
    t = task("copy", length=L, vocab=4, model_type=kind, n_val=200)
    model = NoisyCopyModel(len(t.tokens), L, kind)
    teacher = []
    for batch in t.eval_batches("val", 50):
        teacher += sequence_metrics(model(**batch.inputs), batch.targets)[0].tolist()
    greedy_em = []
    for prompt, answer in t.eval_set("val"):
        out = greedy(model, kind, (prompt + OFFSET).tolist(), L + 1)
        greedy_em.append(out == (answer + OFFSET).tolist() + [EOS_ID])
    assert teacher == greedy_em
    assert 0.2 < np.mean(teacher) < 0.9                          # both right and wrong answers occur
    assert t.evaluate(model, "val")["exact_match"] == pytest.approx(np.mean(greedy_em))


def test_teacher_forced_exact_match_equals_greedy_on_a_trained_tiny_model():
    """The same equivalence on a real GPT after a few Adam steps on copy (partially right answers)."""
    from numformer import ops
    from numformer.models import GPT

    t = task("copy", length=4, vocab=3, model_type="gpt", n_val=60)
    model = GPT(rng=np.random.default_rng(0), n_layers=1, n_heads=2, d_model=16, dtype=np.float64,
                **t.model_config())
    params = list(model.parameters())
    m = [np.zeros_like(p.data) for p in params]
    v = [np.zeros_like(p.data) for p in params]
    rng = np.random.default_rng(0)
    for step in range(1, 101):
        b = t.train_batch(32, rng)
        model.zero_grad()
        _, cache = ops.cross_entropy_forward(model(**b.inputs), b.targets)
        model.backward(ops.cross_entropy_backward(cache))
        for p, mi, vi in zip(params, m, v):
            g = p.grad
            mi[...] = 0.9 * mi + 0.1 * g
            vi[...] = 0.999 * vi + 0.001 * g * g
            p.data -= 1e-2 * (mi / (1 - 0.9 ** step)) / (np.sqrt(vi / (1 - 0.999 ** step)) + 1e-8)
    model.eval()
    teacher = []
    for batch in t.eval_batches("val", 20):
        teacher += sequence_metrics(model(**batch.inputs), batch.targets)[0].tolist()
    greedy_em = [greedy(model, "gpt", (p + OFFSET).tolist(), 5) == (a + OFFSET).tolist() + [EOS_ID]
                 for p, a in t.eval_set("val")]
    assert teacher == greedy_em
    assert 0 < np.mean(teacher) < 1


def _train_tiny_parity(kind, steps=40):
    """A 1-layer model after a few Adam steps on the count scratchpad (length 6): partly right."""
    from numformer import ops
    from numformer.models import build_model

    t = task("parity", model_type=kind, length=6, min_length=6, n_val=16)
    cfg = {"type": kind, **t.model_config(), "n_layers": 1, "n_heads": 2, "d_model": 16}
    if kind == "transformer":
        cfg.update(d_ff=32, dropout=0.0)
    model = build_model(cfg, rng=np.random.default_rng(0), dtype=np.float64)
    params = list(model.parameters())
    m = [np.zeros_like(p.data) for p in params]
    v = [np.zeros_like(p.data) for p in params]
    rng = np.random.default_rng(0)
    for step in range(1, steps + 1):
        b = t.train_batch(32, rng)
        model.zero_grad()
        _, cache = ops.cross_entropy_forward(model(**b.inputs), b.targets)
        model.backward(ops.cross_entropy_backward(cache))
        for p, mi, vi in zip(params, m, v):
            mi[...] = 0.9 * mi + 0.1 * p.grad
            vi[...] = 0.999 * vi + 0.001 * p.grad ** 2
            p.data -= 1e-2 * (mi / (1 - 0.9 ** step)) / (np.sqrt(vi / (1 - 0.999 ** step)) + 1e-8)
    return t, model.eval()


@pytest.mark.parametrize("kind", ["gpt", "transformer"])
def test_parity_scratchpad_accuracy_is_greedy_decodings_final_bit(kind):
    """``accuracy`` of the scratchpad formats: the bit the model writes last when it decodes its whole
    scratchpad itself, checked against a plain greedy loop (no cache) on a partly trained model."""
    t, model = _train_tiny_parity(kind)
    m = t.evaluate(model, "val")
    manual = []
    for prompt, answer in t.eval_set("val"):
        out = greedy(model, kind, (prompt + OFFSET).tolist(), len(answer) + 1)
        manual.append(len(out) >= len(answer) and out[len(answer) - 1] == answer[-1] + OFFSET)
    assert m["accuracy"] == pytest.approx(np.mean(manual))
    assert 0 < m["accuracy"] < 1 and m["accuracy"] >= m["exact_match"]      # right scratchpad => right bit
    if kind == "transformer":   # built from the task's model_config: generate() knows bos/eos (the seed's call)
        for prompt, answer in t.eval_set("val")[:4]:
            out = greedy(model, kind, (prompt + OFFSET).tolist(), len(answer) + 1)
            out = out[:out.index(EOS_ID)] if EOS_ID in out else out
            assert model.generate(prompt + OFFSET, len(answer) + 1, 0) == out


@pytest.mark.parametrize("name, kw, first", [
    ("copy", {"model_type": "gpt"}, None), ("reversal", {"model_type": "transformer"}, None),
    ("addition", {}, None), ("parity", {}, "<cls>"), ("parity", {"model_type": "gpt", "min_length": 8}, None)])
def test_analysis_example_is_a_test_problem_with_token_labels(name, kw, first):
    t = task(name, **kw)
    inputs, labels = t.analysis_example("test")
    batch = t.make_batch(t.eval_set("test")[:1])
    assert set(inputs) == set(labels) == set(batch.inputs)
    for k, ids in inputs.items():
        np.testing.assert_array_equal(ids, batch.inputs[k][:1])
        assert labels[k] == [t.tokens[i] for i in ids[0]]
    if "idx" in labels:
        assert "<sep>" in labels["idx"] and labels["idx"].index("<sep>") == len(t.eval_set("test")[0][0])
    if "tgt" in labels:
        assert labels["tgt"][0] == "<bos>"
    if first:
        assert labels["ids"][0] == first
    if name == "addition":
        assert "+" in labels["idx"]


def test_full_length_fraction_puts_a_share_of_each_batch_at_the_full_length():
    rng = np.random.default_rng(0)
    mixed = task("copy", length=8, min_length=1, model_type="transformer", full_length_fraction=0.5)
    src = mixed.train_batch(40, rng).inputs["src"]
    lengths = (src != PAD_ID).sum(axis=1)
    assert np.sum(lengths == 8) >= 20 and lengths.min() < 8
    plain = task("copy", length=8, min_length=1, model_type="transformer")
    assert np.mean([(plain.train_batch(40, rng).inputs["src"] != PAD_ID).sum(axis=1).mean() for _ in range(5)]) < 6
    with pytest.raises(ValueError, match="full_length_fraction"):
        task("copy", length=8, min_length=1, full_length_fraction=1.5)
