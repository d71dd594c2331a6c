"""Bad input gets one clear ValueError naming the problem."""
from __future__ import annotations

import numpy as np
import pytest

from numformer import GPT, Transformer, nn


def test_d_model_not_divisible_by_heads():
    with pytest.raises(ValueError, match="d_model=10 must be divisible by n_heads=3"):
        nn.MultiHeadAttention(10, 3)


def test_token_ids_outside_vocabulary():
    m = GPT(10, 8, n_layers=1, n_heads=2, d_model=8)
    with pytest.raises(ValueError, match=r"token ids \[10, 12\] are outside the vocabulary \[0, 10\)"):
        m(np.array([[1, 10, 12]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m(np.array([[-1, 2]]))
    with pytest.raises(ValueError, match="must be integers"):
        m(np.array([[1.0, 2.0]]))


def test_sequence_longer_than_positional_table():
    m = GPT(10, 8, n_layers=1, n_heads=2, d_model=8)
    with pytest.raises(ValueError, match="exceed the positional table of length 8"):
        m(np.zeros((1, 9), dtype=int))
    t = Transformer(10, 10, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=4)
    with pytest.raises(ValueError, match="exceed the positional table of length 4"):
        t(np.zeros((1, 5), dtype=int), np.zeros((1, 2), dtype=int))


def test_mismatched_shapes():
    m = nn.MultiHeadAttention(8, 2)
    x = np.zeros((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match=r"key must have shape \(batch, seq, 8\)"):
        m(x, np.zeros((2, 3, 6), np.float32))
    with pytest.raises(ValueError, match="must share the batch"):
        m(x, np.zeros((3, 3, 8), np.float32))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(batch, 3\)"):
        m(x, key_padding_mask=np.zeros((2, 4), bool))
    with pytest.raises(ValueError, match="attn_mask must have shape"):
        m(x, attn_mask=np.zeros((3, 4), bool))
    with pytest.raises(ValueError, match="Linear expects inputs with last dimension 8"):
        nn.Linear(8, 4)(np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"idx must have shape \(batch, seq\)"):
        GPT(10, 8, n_layers=1, n_heads=2, d_model=8)(np.zeros(3, dtype=int))


def test_empty_sequence():
    t = Transformer(10, 10, d_model=8, n_heads=2, n_layers=1, d_ff=16)
    with pytest.raises(ValueError, match="empty input sequence"):
        t.encode(np.zeros((1, 0), dtype=int))


def test_bad_options():
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        nn.FeedForward(8, 16, activation="swish")
    with pytest.raises(ValueError, match="unknown norm 'group'"):
        nn.make_norm("group", 8)
    with pytest.raises(ValueError, match="unknown positional encoding 'rotary'"):
        nn.make_positional("rotary", 8, 10)
    with pytest.raises(ValueError, match="dropout probability must be in"):
        nn.Dropout(1.5)
