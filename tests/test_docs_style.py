"""The docs' code fits the page (no line of a code block is longer than 88 characters) and pastes into a
Python prompt (a compound statement is followed by a blank line before the code after it).

Longer lines are cut off at a 1280-pixel window (the copy button over their end). The rule covers
every code block of the Markdown pages under docs/ (Python, shell, console, text and output
blocks) and the code of the notebook (docs/notebooks/minillm.py, rendered on the notebook page).
"""
from __future__ import annotations

import codeop
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 88
FENCE = re.compile(r"^\s*(```|~~~)")
PAGES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def long_code_lines(text, limit=LIMIT):
    """(line number, length) of every line inside a fenced code block longer than ``limit``."""
    found, fence = [], None
    for number, line in enumerate(text.split("\n"), 1):
        match = FENCE.match(line)
        if match and (fence is None or match.group(1) == fence):
            fence = match.group(1) if fence is None else None
            continue
        if fence is not None and len(line) > limit:
            found.append((number, len(line)))
    return found


def test_the_rule_sees_long_lines():
    text = "x\n```python\n" + "a" * 89 + "\n" + "b" * 88 + "\n```\n" + "c" * 120 + "\n"
    assert long_code_lines(text) == [(3, 89)]


@pytest.mark.parametrize("page", PAGES)
def test_code_lines_fit(page):
    found = long_code_lines((ROOT / page).read_text(encoding="utf-8"))
    assert not found, f"{page}: code lines longer than {LIMIT} characters at (line, length) {found}"


def test_notebook_code_fits():
    lines = (ROOT / "docs" / "notebooks" / "minillm.py").read_text(encoding="utf-8").split("\n")
    found = [(n, len(line)) for n, line in enumerate(lines, 1)
             if len(line) > LIMIT and not line.startswith("#")]      # "# ..." lines are prose
    assert not found, f"docs/notebooks/minillm.py: code lines longer than {LIMIT} at {found}"


def unpasteable_lines(text):
    """(line number, code) of each line that Python's prompt (3.11's, the floor) refuses when a ``python`` block
    without ``>>>`` is pasted into it: the prompt ends a compound statement (for, with, def ...) only at a blank
    line, so a statement right after its indented body is a syntax error. The prompt reads each line as
    ``codeop`` does. Blocks meant for a file (a blank line inside a body) end the check at that line."""
    found = []
    for match in PYTHON_BLOCK.finditer(text):
        if ">>>" in match.group(1):
            continue
        first = text.count("\n", 0, match.start(1)) + 1
        pending = []
        for offset, line in enumerate(match.group(1).split("\n")):
            pending.append(line)
            try:
                if codeop.compile_command("\n".join(pending), "<prompt>", "single") is not None:
                    pending = []
            except SyntaxError as error:
                if "indent" not in str(error):
                    found.append((first + offset, line))
                break
    return found


def test_the_paste_rule_sees_a_missing_blank_line():
    text = "```python\nfor i in range(2):\n    print(i)\nprint('done')\n```\n"
    assert unpasteable_lines(text) == [(4, "print('done')")]
    assert unpasteable_lines(text.replace("    print(i)\n", "    print(i)\n\n")) == []
    assert unpasteable_lines(text.replace("```python", "```python\n>>> 1")) == []


@pytest.mark.parametrize("page", PAGES + ["README.md"])
def test_python_blocks_paste_into_a_prompt(page):
    found = unpasteable_lines((ROOT / page).read_text(encoding="utf-8"))
    assert not found, f"{page}: add a blank line before these lines (a Python prompt refuses them): {found}"
