"""numformer/_platform.py: the run-folder lock's Windows branch (msvcrt byte ranges, run here on a stand-in
msvcrt with Windows' contract), signals and forked workers looked up, and text files opened as UTF-8."""
from __future__ import annotations

import ast
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from numformer import _platform
from numformer.train.run_folder import RunFolderBusy, RunLock

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "tests" / "windows_sim"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the stand-in msvcrt uses Linux's OFD locks")


def _standin():
    spec = importlib.util.spec_from_file_location("_msvcrt_standin", SIM / "_msvcrt_standin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def windows_lock(monkeypatch):
    """_platform's lock functions on their Windows branch: no fcntl, the stand-in as msvcrt."""
    monkeypatch.setattr(_platform, "fcntl", None)
    monkeypatch.setattr(_platform, "msvcrt", _standin())
    return _platform


@linux_only
def test_windows_lock_readers_share_writers_exclude(tmp_path, windows_lock):
    p = windows_lock
    fds = [p.open_lock(tmp_path) for _ in range(4)]
    try:
        assert (tmp_path / p.LOCK_FILE).is_file()              # a folder cannot be locked itself on Windows
        assert p.try_lock(fds[0], exclusive=False) and p.try_lock(fds[1], exclusive=False)   # two readers
        assert not p.try_lock(fds[2], exclusive=True)          # a writer waits for the readers
        assert not p.try_lock(fds[1], exclusive=True)          # a reader cannot become the writer beside another
        assert fds[1] in p._reader_slot                        # ... and still holds its shared lock:
        p.unlock(fds[0])
        assert not p.try_lock(fds[2], exclusive=True)          # fds[1] still reads
        p.unlock(fds[1])
        assert p.try_lock(fds[2], exclusive=True)              # alone now
        assert not p.try_lock(fds[3], exclusive=True)          # a second writer is refused
        assert not p.try_lock(fds[3], exclusive=False)         # and so is a reader
        p.unlock(fds[2])
        assert p.try_lock(fds[3], exclusive=False)
        assert p.try_lock(fds[3], exclusive=True)              # shared -> exclusive when alone
        assert not p.try_lock(fds[0], exclusive=False)
    finally:
        for fd in fds:
            p.close_lock(fd)


@linux_only
def test_windows_lock_of_a_killed_process_is_gone(tmp_path, windows_lock):
    """A crashed writer's lock does not block the next run: the operating system drops it with the process."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(SIM)!r})
        import _msvcrt_standin
        from numformer import _platform
        _platform.fcntl, _platform.msvcrt = None, _msvcrt_standin
        fd = _platform.open_lock({str(tmp_path)!r})
        assert _platform.try_lock(fd, exclusive=True)
        print("locked", flush=True)
        sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        fd = windows_lock.open_lock(tmp_path)
        try:
            assert not windows_lock.try_lock(fd, exclusive=True)
            holder.kill()
            holder.wait()
            assert windows_lock.try_lock(fd, exclusive=True)
        finally:
            windows_lock.close_lock(fd)
    finally:
        holder.kill()
        holder.wait()


@linux_only
def test_run_lock_on_the_windows_branch(tmp_path, windows_lock):
    """RunLock itself (re-entrant per process) on the Windows primitive; another process is refused."""
    with RunLock(tmp_path, exclusive=False, what="read"):
        with RunLock(tmp_path, exclusive=True, what="train into"):       # the same process may upgrade
            code = (f"import sys; sys.path.insert(0, {str(SIM)!r}); import _msvcrt_standin\n"
                    f"from numformer import _platform\n"
                    f"_platform.fcntl, _platform.msvcrt = None, _msvcrt_standin\n"
                    f"from numformer.train.run_folder import RunLock, RunFolderBusy\n"
                    f"try:\n    RunLock({str(tmp_path)!r}, exclusive=False, what='read')\n"
                    f"except RunFolderBusy as e:\n    print(e)\n")
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            assert "is in use by another process" in done.stdout, done.stderr
    with RunLock(tmp_path, exclusive=True):                                # everything was released
        pass
    assert _platform._reader_slot == {}


def test_second_writer_refused_here(tmp_path):
    """The same guarantee on this platform's own primitive (flock on Linux and macOS)."""
    code = (f"from numformer.train.run_folder import RunLock\n"
            f"lock = RunLock({str(tmp_path)!r}); print('locked', flush=True); input()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderBusy, match="in use by another process"):
            RunLock(tmp_path)
        holder.kill()
        holder.wait()
        RunLock(tmp_path).release()
    finally:
        holder.kill()
        holder.wait()


def test_signals_are_looked_up(monkeypatch):
    assert _platform.signals("SIGTERM", "NO_SUCH_SIGNAL") == (signal.SIGTERM,)
    monkeypatch.delattr(signal, "SIGHUP", raising=False)
    monkeypatch.delattr(signal, "SIGUSR1", raising=False)
    assert _platform.signals("SIGTERM", "SIGHUP", "SIGUSR1") == (signal.SIGTERM,)


def test_forked_workers_refused_without_fork(monkeypatch):
    from numformer import GPT
    from numformer.train.parallel import usable_processes

    import numpy as np

    monkeypatch.delattr(os, "fork", raising=False)
    reason = _platform.forked_workers_unavailable()
    assert "Linux only" in reason and "no fork" in reason and "MPI" in reason and "\n" not in reason
    model = GPT(vocab_size=11, block_size=8, n_layers=1, n_heads=2, d_model=16, rng=np.random.default_rng(0))
    assert usable_processes(model, batch_size=8, requested=0) == 1          # auto: one process, no error
    with pytest.raises(ValueError, match="processes = 2: data-parallel training forks"):
        usable_processes(model, batch_size=8, requested=2)


# -- text files: UTF-8 everywhere ---------------------------------------------------------------------------

_NOT_TEXT = {"os", "tarfile", "zipfile", "gzip", "bz2", "lzma", "webbrowser", "Image"}


def _text_call_without_encoding(call):
    """'open(r)', '.read_text' ... when ``call`` opens a text file without naming its encoding, else None."""
    f = call.func
    if any(k.arg == "encoding" for k in call.keywords):
        return None
    if isinstance(f, ast.Attribute) and f.attr in ("read_text", "write_text"):
        return "." + f.attr
    if isinstance(f, ast.Name) and f.id == "open":
        mode_at = 1                                       # open(file, mode)
    elif isinstance(f, ast.Attribute) and f.attr == "open":
        if isinstance(f.value, ast.Name) and f.value.id in _NOT_TEXT:
            return None
        mode_at = 1 if isinstance(f.value, ast.Name) and f.value.id in ("io", "builtins") else 0   # Path.open(mode)
    else:
        return None
    mode = next((k.value for k in call.keywords if k.arg == "mode"),
                call.args[mode_at] if len(call.args) > mode_at else ast.Constant("r"))
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and "b" in mode.value:
        return None
    return f"open({mode.value if isinstance(mode, ast.Constant) else '?'})"


def test_text_files_are_opened_as_utf8():
    """Windows' default text encoding is not UTF-8: every text file numformer opens names its encoding."""
    found = []
    for path in sorted((ROOT / "src" / "numformer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and (what := _text_call_without_encoding(node)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {what}")
    assert not found, "text files opened without encoding=\"utf-8\":\n" + "\n".join(found)


def test_the_utf8_check_can_fail():
    calls = ['open(p)', 'open(p, "a")', 'Path(p).read_text()', 'p.open("w")', 'io.open(p, "r")']
    fine = ['open(p, "rb")', 'p.read_text(encoding="utf-8")', 'os.open(p, 0)', 'p.open("rb")', 'tarfile.open(p)']
    assert all(_text_call_without_encoding(ast.parse(c).body[0].value) for c in calls)
    assert not any(_text_call_without_encoding(ast.parse(c).body[0].value) for c in fine)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/stat is Linux's")
def test_process_cpu_seconds_counts_a_busy_child_and_not_a_gone_one():
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ninput()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while (_platform.process_cpu_seconds(child.pid) or 0.0) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _platform.process_cpu_seconds(child.pid) >= 0.3      # its 0.5 s spin counted (in clock ticks)
        assert _platform.process_cpu_seconds(os.getpid()) >= 0.0
    finally:
        child.communicate(b"\n")
    assert _platform.process_cpu_seconds(child.pid) is None         # reaped: no /proc entry
