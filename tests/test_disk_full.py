"""Disk full: a write that fails for lack of space leaves the previous checkpoint intact, gives one clear line,
and the run resumes, bit for bit, once there is space again."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from numformer import run_files as checkpoint_module
from numformer.run_files import CHECKPOINT

from conftest import mounted_tmpfs, tiny_copy_toml

TINY = tiny_copy_toml(model={"dropout": 0.1}, max_steps=6, batch_size=4, eval_every=3, checkpoint_every=3,
                      log_every=1, processes=1)


def arrays(path):
    from safetensors.numpy import load_file
    return load_file(str(path))


@pytest.fixture
def tmpfs(tmp_path):
    """A 4 MiB tmpfs (needs root and mount rights; skipped elsewhere)."""
    with mounted_tmpfs(tmp_path / "disk", "size=4m",
                       "cannot mount a tmpfs here (needs root); the monkeypatched test covers disk full") as mount:
        yield mount


def fill(folder):
    """Fill the file system of ``folder`` to the last byte; returns the filler file."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def test_full_tmpfs(tmp_path, tmpfs, run_cli, cli_error):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    straight, out = tmp_path / "straight", tmpfs / "run"
    assert run_cli("train", cfg, "--out", straight, "--quiet")[0] == 0
    assert run_cli("train", cfg, "--out", out, "--quiet", "--set", "train.max_steps=3")[0] == 0
    before = (out / CHECKPOINT).read_bytes()
    filler = fill(tmpfs)

    line = cli_error("train", "--out", out, "--resume", "--set", "train.max_steps=6", "--quiet")
    assert "the disk is full; free some space and run again" in line
    assert (out / CHECKPOINT).read_bytes() == before                 # the previous checkpoint, intact
    assert not list(out.glob(".*.tmp"))                              # no temporary file left behind

    filler.unlink()
    assert run_cli("train", "--out", out, "--resume", "--set", "train.max_steps=6", "--quiet")[0] == 0
    a, b = arrays(straight / CHECKPOINT), arrays(out / CHECKPOINT)
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)    # bit-exact after the failure


def test_write_fails_half_way(tmp_path, run_cli, cli_error, monkeypatch):
    """Without a tmpfs: the checkpoint's write raises ENOSPC after half of its bytes."""
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    out = tmp_path / "run"
    assert run_cli("train", cfg, "--out", out, "--quiet", "--set", "train.max_steps=3")[0] == 0
    before = (out / CHECKPOINT).read_bytes()
    real_fdopen = os.fdopen

    class HalfFull:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(checkpoint_module.os, "fdopen", lambda fd, mode: HalfFull(real_fdopen(fd, mode)))
    line = cli_error("train", "--out", out, "--resume", "--set", "train.max_steps=6", "--quiet")
    assert line.startswith("numformer train: error: ") and "the disk is full" in line
    assert (out / CHECKPOINT).read_bytes() == before
    assert not list(out.glob(".*.tmp"))
