"""The README's two steps without make (the macOS / Linux spelling) run as written in a fresh virtual
environment, in a copy of the checkout: create .venv, install, train, generate; install with the test
extra, run pytest.

Two things are made small, as the docs tests do (each replaced text must be on the page, so the list
cannot drift from it): the training (a 1-layer model for 30 steps instead of 2000 steps of 4 layers) and
the test run (two test files instead of the whole suite, which runs this test too).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TINY = [
    ("--out runs/shakespeare_char --overwrite\n",
     "--out runs/shakespeare_char --overwrite --set model.n_layers=1 --set model.d_model=32 "
     "--set train.max_steps=30 --set train.eval_every=15 --set train.eval_batches=1 --set train.warmup_steps=3\n"),
    ("--max-new-tokens 500", "--max-new-tokens 40"),
    ('pytest -n 2 -m "not slow" -q', 'pytest -n 2 -m "not slow" -q tests/test_ops.py tests/test_generate.py'),
]


def readme_block():
    """The ```bash block that follows "Without make" in README.md."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.search(r"Without make.*?```bash\n(.*?)```", readme, re.S).group(1)


def test_the_block_is_what_the_test_runs():
    block = readme_block()
    for text, _ in TINY:
        assert text in block, f"README's block without make no longer says {text!r}: update TINY"
    lines = block.strip().splitlines()
    assert lines[0].startswith("python3 -m venv .venv") and "pytest" in lines[-1]


@pytest.mark.slow
def test_readme_commands_without_make_in_a_fresh_venv(tmp_path):
    block = readme_block()
    for text, tiny in TINY:
        block = block.replace(text, tiny)
    checkout = tmp_path / "numformer"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache")
    for name in ("src", "configs", "tests"):
        shutil.copytree(ROOT / name, checkout / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert (checkout / "runs" / "shakespeare_char" / "model.safetensors").is_file()
    assert "ROMEO:" in done.stdout                                    # the sample
    assert re.search(r"\d+ passed", done.stdout), done.stdout[-2000:]
