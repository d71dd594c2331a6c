"""Sampling at the edges: a temperature near 0, infinite and NaN logits (numformer.sampling's "probabilities" and
"infinite logits"), with no RuntimeWarning; and a bad NUMFORMER_NUM_THREADS as the CLI's one error line."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from numformer import _runtime
from numformer.cli import main
from numformer.sampling import next_token_probabilities, sample_next, top_p_filter, warp_logits

from conftest import one_error_line, tiny_text_toml

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")      # an overflow or NaN warning fails a test

TINY = (1e-30, 1e-300, 1e-320, 5e-324)                  # 1e-320 and 5e-324 are subnormal: logits / T overflows
FILTERS = [(None, None), (3, None), (None, 0.5), (3, 0.9)]


def R(seed):
    return np.random.default_rng(seed)


def one_hot(index, n):
    return np.eye(n)[index]


@pytest.mark.parametrize("temperature", TINY)
@pytest.mark.parametrize("top_k,top_p", FILTERS)
def test_a_tiny_temperature_is_greedy(temperature, top_k, top_p):
    logits = R(0).standard_normal((50, 11)) * 3
    argmax = logits.argmax(-1)
    probs = next_token_probabilities(logits, temperature, top_k, top_p)
    np.testing.assert_array_equal(probs, one_hot(argmax, 11))
    for seed in range(5):
        np.testing.assert_array_equal(sample_next(logits, R(seed), temperature, top_k, top_p), argmax)
    # as T -> 0, tied maxima share the probability equally
    tied = next_token_probabilities(np.array([[3.0, 1.0, 3.0, -2.0]]), temperature, top_k, top_p)
    np.testing.assert_array_equal(tied, [[0.5, 0.0, 0.5, 0.0]])


@pytest.mark.parametrize("temperature", (0.3, 1.0, 2.0, 1e-320))
@pytest.mark.parametrize("top_k,top_p", FILTERS)
def test_a_plus_inf_logit_is_certain(temperature, top_k, top_p):
    logits = np.array([1.0, np.inf, 2.0, -np.inf])
    np.testing.assert_array_equal(next_token_probabilities(logits, temperature, top_k, top_p), [0, 1, 0, 0])
    for seed in range(20):
        assert sample_next(logits, seed, temperature, top_k, top_p) == 1
    # several +inf logits share the probability equally, whatever the finite ones
    shared = np.array([[np.inf, 5.0, np.inf, 9.0]] * 20000)
    np.testing.assert_array_equal(next_token_probabilities(shared[:1], temperature, top_k, top_p),
                                  [[0.5, 0, 0.5, 0]])
    draws = sample_next(shared, R(1), temperature, top_k, top_p)
    assert set(np.unique(draws)) == {0, 2} and abs(np.mean(draws == 0) - 0.5) < 0.02


def test_top_p_with_plus_inf_logits_keeps_the_certain_tokens():
    logits = np.array([[np.inf, 5.0, np.inf, 9.0], [1.0, 2.0, np.inf, 3.0]])
    for p in (0.3, 0.9, 0.999):
        np.testing.assert_array_equal(np.isfinite(top_p_filter(logits, p)) | (top_p_filter(logits, p) == np.inf),
                                      [[1, 0, 1, 0], [0, 0, 1, 0]])
        np.testing.assert_array_equal(warp_logits(logits, 1.0, None, p) > -np.inf, [[1, 0, 1, 0], [0, 0, 1, 0]])


@pytest.mark.parametrize("temperature", (0.5, 1.0, 3.0, 1e-300, 1e-320))
def test_minus_inf_logits_are_never_sampled(temperature):
    logits = R(2).standard_normal((20000, 7))
    banned = R(3).random((20000, 7)) < 0.5
    banned[:500, -1] = True                                                 # the last token too (the cdf's end)
    banned[np.arange(20000), R(4).integers(0, 6, 20000)] = False          # one token at least stays possible
    logits[banned] = -np.inf
    logits[:100, 2] = np.inf                                               # with +inf logits elsewhere
    banned[:100, 2] = False
    for top_k, top_p in FILTERS:
        draws = sample_next(logits, R(5), temperature, top_k, top_p)
        assert not banned[np.arange(20000), draws].any()
        assert (next_token_probabilities(logits, temperature, top_k, top_p)[banned] == 0).all()


@pytest.mark.parametrize("temperature", (0, 1e-320, 0.7, 1.0))
def test_nan_logits_are_a_value_error(temperature):
    logits = np.array([[1.0, 2.0, 3.0], [1.0, np.nan, 2.0]])
    with pytest.raises(ValueError, match="NaN"):
        next_token_probabilities(logits, temperature)
    with pytest.raises(ValueError, match="NaN"):
        sample_next(logits, R(0), temperature)
    with pytest.raises(ValueError, match="NaN"):
        sample_next(logits, R(0), 1.0, greedy=True)


def test_ordinary_inputs_keep_their_probabilities():
    """softmax(logits / T) as torch computes it, and softmax of Hugging Face's warped logits with top-k/top-p."""
    torch = pytest.importorskip("torch")
    logits = np.concatenate([R(6).standard_normal((32, 40)) * s for s in (0.1, 1.0, 4.0, 30.0)])
    for temperature in (0.05, 0.7, 1.0, 1.8, 10.0):
        ref = torch.softmax(torch.from_numpy(logits) / temperature, dim=-1).numpy()
        np.testing.assert_allclose(next_token_probabilities(logits, temperature), ref, rtol=1e-12, atol=1e-300)
    lp = pytest.importorskip("transformers.generation.logits_process")
    for temperature, top_k, top_p in itertools.product((0.7, 1.0, 1.8), (None, 5, 20), (None, 0.5, 0.9)):
        procs = [lp.TemperatureLogitsWarper(temperature)] + ([lp.TopKLogitsWarper(top_k)] if top_k else []) \
            + ([lp.TopPLogitsWarper(top_p)] if top_p else [])
        warped = lp.LogitsProcessorList(procs)(None, torch.from_numpy(logits.copy()))
        ref = torch.softmax(warped, dim=-1).numpy()
        ours = next_token_probabilities(logits, temperature, top_k, top_p)
        np.testing.assert_array_equal(ours > 0, ref > 0)
        np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-300)


# -- the CLI -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A trained character-level GPT (run folder)."""
    from numformer.data.text import read_corpus

    root = tmp_path_factory.mktemp("text")
    (root / "small.txt").write_text(read_corpus("")[:3000])
    (root / "text.toml").write_text(tiny_text_toml(root / "small.txt"))
    assert main(["train", str(root / "text.toml"), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


def test_generate_at_a_tiny_temperature_prints_the_greedy_text(text_run, run_cli):
    common = ("generate", text_run, "--prompt", "The", "--max-new-tokens", 40)
    rc, greedy, err = run_cli(*common, "--greedy")
    assert rc == 0 and len(greedy) > 3, err
    for temperature in ("1e-300", "1e-320"):
        rc, out, err = run_cli(*common, "--temperature", temperature, "--seed", 0)
        assert rc == 0 and "Warning" not in err, err
        assert out == greedy, temperature


@pytest.fixture
def fresh_thread_count(monkeypatch):
    """The thread count read again from NUMFORMER_NUM_THREADS (it is cached after the first read)."""
    monkeypatch.setitem(_runtime._threads, "n", None)
    return monkeypatch


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5"])
def test_a_bad_thread_count_is_a_value_error(fresh_thread_count, value):
    fresh_thread_count.setenv("NUMFORMER_NUM_THREADS", value)
    with pytest.raises(ValueError, match=f"NUMFORMER_NUM_THREADS must be a positive integer, got '{value}'"):
        _runtime.get_num_threads()


def test_a_good_thread_count_is_used(fresh_thread_count):
    fresh_thread_count.setenv("NUMFORMER_NUM_THREADS", "3")
    assert _runtime.get_num_threads() == 3


@pytest.mark.parametrize("value", ["abc", "0", "-1"])
@pytest.mark.parametrize("command", [("generate", "RUN", "--max-new-tokens", 3), ("params", "CONFIG"),
                                     ("bench", "throughput", "--quick", "--out", "OUT")])
def test_a_bad_thread_count_is_the_clis_one_error_line(fresh_thread_count, text_run, run_cli, tmp_path, value,
                                                        command):
    import numformer.bench.runner

    fresh_thread_count.setenv("NUMFORMER_NUM_THREADS", value)
    fresh_thread_count.setattr(numformer.bench.runner, "run_parts", lambda *a, **k: None)   # no benchmark runs
    paths = {"RUN": text_run, "CONFIG": text_run.parent / "text.toml", "OUT": tmp_path / "bench"}
    rc, out, err = run_cli(*[paths.get(a, a) for a in command])
    line = one_error_line(rc, err, command[0])
    assert f"NUMFORMER_NUM_THREADS must be a positive integer, got '{value}'" in line
    assert out == ""
