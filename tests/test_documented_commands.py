"""Every shell command of the README, docs/index.md and the first tutorial runs, as written, in a new user's
shell: a copy of the repository, no virtual environment active, numformer not installed.

The commands are read from the pages' ```bash / ```console / ```sh blocks (so a command added to a page is
covered without editing this file), run in page order in one bash session per page (an activation line
stays in effect for the page's later commands), and each must exit 0. Only ``NOT_RUN`` is left out, each
with its reason. ``make run`` creates the fresh ``.venv`` as on a new machine; pip installs offline from a
local folder of wheels (``NUMFORMER_WHEELS``, default ``~/.cache/numformer-test-wheels``; the test skips,
saying how to fill it, when there is none), so nothing is downloaded.

The default test shortens the training commands with the environment variable ``NUMFORMER_TRAIN_SET``
(documented in the training reference); the slow test runs them with the pages' own settings.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/index.md", "docs/tutorials/first-gpt.md"]
SHELL_BLOCK = re.compile(r"^```(?:bash|console|sh|shell)\n(.*?)^```", flags=re.S | re.M)
NOT_RUN = {
    "make test": "the default test suite, which this test is part of",
    '.venv/bin/python -m pytest -n 2 -m "not slow" -q': "the same suite without make",
    '.venv/bin/python -m pip install -e ".[nlp,data,test]"': "the test extras (torch and the reference libraries "
                                                             "are not among the offline wheels); "
                                                             "tests/test_readme_without_make.py installs them",
}
SHORT = "train.max_steps=20 train.eval_every=10 train.eval_batches=1"
WHEELS = Path(os.environ.get("NUMFORMER_WHEELS", Path.home() / ".cache" / "numformer-test-wheels"))


def page_commands(page):
    """The shell commands of a page's shell blocks, in order: continuation lines joined, comments and blank
    lines dropped; in a block written with ``$ `` prompts, the prompted lines only (the rest is output)."""
    commands = []
    for block in SHELL_BLOCK.findall((ROOT / page).read_text(encoding="utf-8")):
        lines = block.replace("\\\n", " ").splitlines()
        if any(line.startswith("$ ") for line in lines):
            lines = [line[2:] for line in lines if line.startswith("$ ")]
        for line in lines:
            command = _strip_comment(line).strip()
            if command:
                commands.append(command)
    return commands


def _strip_comment(line):
    """The line without a trailing ``# comment``: the first # outside quotes that starts a word."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


def test_the_pages_have_the_first_hour_commands():
    commands = {page: page_commands(page) for page in PAGES}
    assert commands["README.md"][:2] == ["make run", "make test"]
    assert "source .venv/bin/activate" in commands["README.md"]
    assert "source .venv/bin/activate" in commands["docs/tutorials/first-gpt.md"]
    assert _strip_comment('numformer generate r --prompt "ROMEO:"   # a sample') == 'numformer generate r --prompt "ROMEO:"'
    assert _strip_comment("echo 'a # b'") == "echo 'a # b'"


def user_copy(tmp_path):
    """The repository's files (tracked and new, not ignored) copied to tmp_path/numformer, as a clone would
    have them; no .venv, runs or results/quick."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    repo = tmp_path / "numformer"
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            dest = repo / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(src.read_bytes())
    return repo


def user_environment(short):
    """A new user's environment: no virtual environment active, no numformer on PATH, pip offline."""
    venv_bins = {str(Path(sys.executable).parent), str(Path(sys.prefix) / "bin")}
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "NUMFORMER_TRAIN_SET", "PIP_REQUIRE_VIRTUALENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p not in venv_bins)
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(WHEELS), PIP_DISABLE_PIP_VERSION_CHECK="1", MPLBACKEND="Agg")
    if short:
        env["NUMFORMER_TRAIN_SET"] = SHORT
    return env


def run_pages(tmp_path, short):
    if not any(WHEELS.glob("numpy-*.whl")):
        pytest.skip(f"no wheels in {WHEELS} for the offline install of a fresh .venv; fill it once with "
                    f"`pip download -d {WHEELS} '.[nlp,data,docs]' setuptools pip` (or set NUMFORMER_WHEELS)")
    repo = user_copy(tmp_path)
    env = user_environment(short)
    assert subprocess.run(["bash", "-c", "command -v numformer"], env=env, capture_output=True).returncode != 0, \
        "numformer is on PATH before any documented step: the test would not see a missing activation"
    failures, ran = [], []
    for page in PAGES:
        script, commands = [], []
        for command in page_commands(page):
            if command in NOT_RUN:
                continue
            commands.append(command)
            script += [command, f'echo "__exit__ {len(commands) - 1} $?" >&3']
        log = tmp_path / (page.replace("/", "_") + ".log")
        exits = tmp_path / (page.replace("/", "_") + ".exits")
        with open(log, "wb") as out:
            subprocess.run(["bash", "-c", f"exec 3>{shlex.quote(str(exits))}\n" + "\n".join(script)], cwd=repo,
                           env=env, stdout=out, stderr=subprocess.STDOUT, timeout=3600)
        codes = dict(line.split()[1:] for line in exits.read_text().splitlines())
        for i, command in enumerate(commands):
            ran.append(f"{page}: {command}")
            if codes.get(str(i)) != "0":
                failures.append(f"{page}: `{command}` exited {codes.get(str(i), 'never (the shell stopped)')}")
        if failures:
            pytest.fail("\n".join(failures) + f"\n--- {log.name} (end)\n" + log.read_text(errors="replace")[-4000:])
    assert len(ran) >= 6, ran
    return repo


def test_documented_commands_run_in_a_new_users_shell(tmp_path):
    """As written, with the training commands shortened by NUMFORMER_TRAIN_SET."""
    repo = run_pages(tmp_path, short=True)
    assert (repo / "runs" / "shakespeare_char" / "model.safetensors").is_file()
    assert (repo / "site" / "index.html").is_file()


@pytest.mark.slow
def test_documented_commands_run_as_written(tmp_path):
    """As written, every training run at its full length (minutes each)."""
    run_pages(tmp_path, short=False)
