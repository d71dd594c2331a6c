"""Shared helpers: gradient checks of modules and conversion to and from torch; data kept off the network."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess

# Under pytest-xdist (``-n 2``) the workers share the cores: each computes on one thread (numformer's
# kernels, OpenBLAS, PyTorch's OpenMP), as two threads each would oversubscribe the cores (OpenBLAS's and
# PyTorch's waiting threads spin). Results do not depend on the threads (tests/test_kernels.py splits the
# work across 2-4 threads explicitly). Set before NumPy loads OpenBLAS; processes the tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _variable in ("NUMFORMER_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")

import numpy as np  # noqa: E402
import pytest

from numformer.gradcheck import check_gradients

GRAD_TOL = 1e-6          # finite differences, float64 (relative error)
F64_TOL = 1e-8           # parity with torch, float64
F32_TOL = 1e-4           # parity with torch, float32


@pytest.fixture(autouse=True, scope="session")
def _no_downloads(tmp_path_factory):
    """Tests never reach the internet nor the user's cache: datasets come from NUMFORMER_DATA (or a path),
    the cache is a fresh folder, and any download goes to a closed port on 127.0.0.1 (and fails at once)."""
    saved = {k: os.environ.get(k) for k in ("NUMFORMER_CACHE", "NUMFORMER_DATA_MIRROR")}
    os.environ["NUMFORMER_CACHE"] = str(tmp_path_factory.mktemp("numformer_cache"))
    os.environ.setdefault("NUMFORMER_DATA_MIRROR", "http://127.0.0.1:9")
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_as_at_a_terminal():
    """Ctrl-C (SIGINT) at its default in the test processes, as at a terminal, so that the tests' own SIGINT
    and the numformer processes they start and interrupt behave as a user's would. A test run started in the
    background of a script (``make test &``) inherits SIGINT ignored (bash ignores it for ``&`` jobs); Python
    keeps an ignored SIGINT ignored, and so would every process started from here, where Ctrl-C would then
    do nothing."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def module_gradcheck(module, inputs, call, backward_inputs=None, eps=1e-6):
    """Finite-difference check of a module's input and parameter gradients (module must be float64).

    inputs: {name: float64 array}; call(**inputs) runs forward; backward_inputs
    maps module.backward's return value to {name: gradient} for the inputs.
    Returns {name: relative error} for inputs and parameters.
    """
    params = dict(module.named_parameters())
    arrays = {**inputs, **{f"param:{n}": p.data for n, p in params.items()}}

    def forward():
        return call(**inputs)

    def backward(dout):
        module.zero_grad()
        call(**inputs)
        grads = module.backward(dout)
        out = {} if backward_inputs is None else backward_inputs(grads)
        for n, p in params.items():
            out[f"param:{n}"] = np.zeros_like(p.data) if p.grad is None else p.grad
        return out

    return check_gradients(forward, backward, arrays, eps=eps)


def assert_gradcheck(errors, tol=GRAD_TOL):
    bad = {k: v for k, v in errors.items() if not v < tol}
    assert not bad, f"gradient check failed (relative error >= {tol}): {bad}"


def assert_close(a, b, tol, what=""):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    err = np.max(np.abs(a - b) / (1.0 + np.abs(b))) if a.size else 0.0
    assert err < tol, f"{what}: max error {err:.3e} >= {tol}"


@pytest.fixture
def run_cli(capsys):
    """Run ``numformer ARGS...`` in this process; returns (exit code, stdout, stderr)."""
    from numformer.cli import main

    def run(*args):
        capsys.readouterr()
        rc = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def ctrl_c_during_step(trainer, monkeypatch, step):
    """Send this process SIGINT (Ctrl-C) while ``trainer`` takes step ``step``: the run stops after it."""
    import os
    import signal

    real = trainer._train_step

    def step_then_interrupt():
        out = real()
        if trainer.step == step - 1:
            os.kill(os.getpid(), signal.SIGINT)
        return out
    monkeypatch.setattr(trainer, "_train_step", step_then_interrupt)


def freeze(proc):
    """Stop the child process ``proc`` (a Popen) with SIGSTOP and return once it has stopped. ``kill`` only
    queues the signal: a process running on another core goes on for a moment and may write a file
    meanwhile. Returns False if it had exited instead (its returncode is then set)."""
    os.kill(proc.pid, signal.SIGSTOP)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        return True
    proc.returncode = os.waitstatus_to_exitcode(status)
    return False


def one_error_line(rc, err, command):
    """The CLI's promise for an expected failure: exit code 2, no traceback and exactly one line
    ``numformer COMMAND: error: ...`` on stderr; returns that line."""
    lines = [line for line in err.splitlines() if line.startswith(f"numformer {command}: error: ")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, f"exit code {rc}, stderr:\n{err}"
    return lines[0]


@pytest.fixture
def cli_error(run_cli):
    """Run a numformer command that must fail; returns its one error line (see ``one_error_line``)."""

    def run(*args):
        rc, _, err = run_cli(*args)
        return one_error_line(rc, err, str(args[0]))

    return run


def _toml_section(name, values):
    def value(v):
        return ("true" if v else "false") if isinstance(v, bool) else f'"{v}"' if isinstance(v, str) else repr(v)
    return [f"[{name}]", *(f"{k} = {value(v)}" for k, v in values.items())]


def _tiny_gpt_toml(data, model, train):
    gpt = {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16, **(model or {})}
    return "\n".join(["", *_toml_section("model", gpt), *_toml_section("data", data),
                      *_toml_section("train", train), ""])


def tiny_copy_toml(model=None, **train):
    """The TOML text of a 1-layer GPT (d_model 16, 2 heads) on the copy task of length 4 (16 validation and
    16 test problems), with ``model`` added to [model] and ``train`` as [train]: the small runs of the CLI tests."""
    return _tiny_gpt_toml({"task": "copy", "length": 4, "n_val": 16, "n_test": 16}, model, train)


def tiny_text_toml(path="small.txt", **train):
    """The same small GPT on a text file (``path``, character level, blocks of 16); [train] is ``train`` over
    4 steps of batch 4, evaluated every 2, one process."""
    train = {"max_steps": 4, "batch_size": 4, "eval_every": 2, "processes": 1, **train}
    return _tiny_gpt_toml({"task": "text", "path": str(path), "block_size": 16}, None, train)


def hf_bpe_folder(folder, text, vocab_size=300):
    """A Hugging Face folder at ``folder``: a one-layer GPT-2 (``export_hf``) and a byte-level BPE tokenizer.json
    that the ``tokenizers`` library trained on ``text`` (the tests' reference of a downloaded checkpoint)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from numformer.interop.hf import export_hf
    from numformer.models import GPT

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    export_hf(GPT(vocab_size=tok.get_vocab_size(), block_size=32, d_model=16, n_heads=2, n_layers=1,
                  rng=np.random.default_rng(0)), folder)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def set_commit(monkeypatch, value):
    """Make ``value`` the git commit numformer records in a run's summary and an experiment's record, and
    compares before reusing a run (the same in every module that asks)."""
    import numformer.experiments.chat_pipeline as chat_pipeline
    import numformer.experiments.gpt_to_llama as gpt_to_llama
    import numformer.experiments.language_model as language_model
    import numformer.experiments.speedrun as speedrun
    import numformer.train.final as final
    import numformer.train.trainer as trainer

    for module in (trainer, final, speedrun, language_model, gpt_to_llama, chat_pipeline):
        monkeypatch.setattr(module, "git_commit", lambda: value)


def set_metadata(path, **changes):
    """Rewrite a safetensors file with some metadata entries changed (None removes one)."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(path), framework="np") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for k, v in changes.items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    save_file(tensors, str(path), metadata=meta)


def interrupt_after_the_header(monkeypatch, module):
    """Make ``module``'s ``write_atomic`` stop (Ctrl-C) once a file's first piece, its header, went to the
    temporary file: a write cut short midway. The file must come as pieces (``safetensors_pieces``), never
    as one bytes object of the whole file held in memory."""
    from numformer.run_files import write_atomic

    def interrupted(path, data):
        assert not isinstance(data, (bytes, bytearray, memoryview)), f"{path} was built whole in memory"

        def pieces():
            yield next(iter(data))
            raise KeyboardInterrupt
        write_atomic(path, pieces())
    monkeypatch.setattr(module, "write_atomic", interrupted)


def src_env():
    """The environment of a subprocess that imports this checkout's numformer (src/ first on PYTHONPATH)."""
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    return {**os.environ, "PYTHONPATH": os.path.abspath(src) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@contextlib.contextmanager
def mounted_tmpfs(folder, options, skip_reason):
    """A tmpfs mounted on ``folder`` (created) with mount ``options`` ("size=4m", "ro,size=1m"), unmounted
    afterwards; the test is skipped with ``skip_reason`` where mounting is not allowed (it needs root)."""
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(skip_reason)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


class FakeClock:
    """time.perf_counter advancing by ``tick`` seconds at every call: the run's timing is deterministic. Code
    that stands for slow work advances ``now`` itself (see ``test_budget.costly_forwards``)."""

    def __init__(self, tick=0.002):
        self.now, self.tick = 1000.0, tick

    def __call__(self):
        self.now += self.tick
        return self.now


@pytest.fixture
def fake_clock(monkeypatch):
    """A FakeClock in place of time.perf_counter: tests check timing logic on it, never on wall time."""
    import time

    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock


@pytest.fixture(scope="session")
def explorer_run(tmp_path_factory):
    """A run folder of a 2-layer character-level GPT (2 heads, d_model 16, block_size 32) trained by
    ``numformer train`` for 40 steps on 3,000 characters of tiny Shakespeare: the explorer tests' model, small
    enough to train in seconds and trained enough that its attention is not uniform."""
    from numformer.cli import main
    from numformer.data.text import read_corpus

    folder = tmp_path_factory.mktemp("explorer")
    (folder / "small.txt").write_text(read_corpus("")[:3000], encoding="utf-8")
    (folder / "text.toml").write_text(tiny_text_toml(folder / "small.txt"), encoding="utf-8")
    sets = ["data.block_size=32", "model.n_layers=2", "train.max_steps=40", "train.lr=1e-2", "train.eval_every=40"]
    assert main(["train", str(folder / "text.toml"), "--out", str(folder / "run"), "--quiet",
                 *(a for s in sets for a in ("--set", s))]) == 0
    return folder / "run"


EXPLORER_PROMPT = "ROMEO: What say"


@pytest.fixture
def explorer_server(explorer_run):
    """The explorer's server of ``explorer_run`` on a free port of 127.0.0.1, serving in a thread, its page
    opened with ``EXPLORER_PROMPT`` analysed; its rng seeded with 0."""
    import numformer
    from numformer.explorer import Explorer, make_server, page_data, prompt_ids, serving

    model, tokenizer = numformer.load(explorer_run)
    ids, n_prompt = prompt_ids(model, tokenizer, EXPLORER_PROMPT)
    data = page_data(model, tokenizer, ids, n_prompt, "tiny", "server")
    with serving(make_server(Explorer(model, tokenizer, seed=0), 0, data)) as server:
        yield server


@pytest.fixture
def native_blas_afterwards():
    """For a test that calls ``numformer.set_fast_runtime()`` (a benchmark run): the BLAS's native threading
    again afterwards, as the other tests expect it."""
    yield
    import numformer

    numformer.set_fast_runtime(blas="native")
