"""The char-level text task and the built-in tiny Shakespeare corpus."""
from __future__ import annotations

import numpy as np
import pytest

from numformer.data import make_task
from numformer.data.text import read_corpus


@pytest.fixture(scope="module")
def shakespeare():
    return make_task({"task": "text", "block_size": 64})


def test_builtin_corpus_and_nanogpt_split(shakespeare):
    assert len(read_corpus()) == 1_115_394
    assert shakespeare.tokenizer.vocab_size == 65
    assert len(shakespeare.splits["train"]) == 1_003_854       # int(n * 0.9), as nanoGPT
    assert len(shakespeare.splits["val"]) == 111_540
    assert shakespeare.model_config() == {"vocab_size": 65, "block_size": 64}
    assert shakespeare.tokenizer.decode(shakespeare.splits["train"][:14]) == "First Citizen:"


def test_train_batches_are_shifted_windows(shakespeare):
    b = shakespeare.train_batch(5, np.random.default_rng(0))
    x, y = b.inputs["idx"], b.targets
    assert x.shape == y.shape == (5, 64)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    b2 = shakespeare.train_batch(5, np.random.default_rng(0))
    np.testing.assert_array_equal(b2.inputs["idx"], x)          # drawn only from the generator given


def test_eval_batches_cover_the_validation_text(shakespeare):
    batches = list(shakespeare.eval_batches("val", 100))
    n = sum(b.targets.shape[0] for b in batches)
    assert n == (111_540 - 1) // 64
    joined = np.concatenate([b.inputs["idx"].reshape(-1) for b in batches])
    np.testing.assert_array_equal(joined, shakespeare.splits["val"][:n * 64])
    assert [b.inputs["idx"].shape for b in shakespeare.eval_batches("val", 100)] == [x.inputs["idx"].shape
                                                                                   for x in batches]


def test_saved_vocabulary_is_reused(tmp_path, shakespeare):
    text = tmp_path / "t.txt"
    text.write_text("abcabcabd" * 50)
    task = make_task({"task": "text", "path": str(text), "block_size": 8},
                     tokenizer_state=shakespeare.tokenizer_state())
    assert task.tokenizer.vocab_size == 65


def test_text_task_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        make_task({"task": "text", "path": str(tmp_path / "missing.txt")})
    small = tmp_path / "s.txt"
    small.write_text("hello world")
    with pytest.raises(ValueError, match="not more than block_size"):
        make_task({"task": "text", "path": str(small), "block_size": 64})
    bad = tmp_path / "b.txt"
    bad.write_bytes(b"\xff\xfe\x00abc" * 100)
    with pytest.raises(ValueError, match="not valid utf-8"):
        make_task({"task": "text", "path": str(bad), "block_size": 4})
