"""The tutorials' pictures: every tutorial opens with one, and the drawings of docs/figures/diagrams.py are drawn.

diagrams.py draws the architecture and computation-graph figures (the head split, the residual
stream, attention's graphs, the model diagrams); ``python docs/figures/diagrams.py`` rewrites the
committed PNGs. The other figures are written by the pages' own code (tests/test_docs_pages.py).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_docs_pages import drawn_figures

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
IMAGE = re.compile(r"!\[[^\]]+\]\((\.\./[\w/.-]+\.png)\)")


@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: p.name)
def test_tutorial_opens_with_a_figure(page):
    """A figure (with alt text) before the first section, and every figure it shows exists."""
    text = page.read_text(encoding="utf-8")
    intro = text.split("\n## ", 1)[0]
    assert IMAGE.search(intro), f"{page.name} does not open with a picture of what it builds"
    for target in IMAGE.findall(text):
        rel = target.removeprefix("../")
        path = ROOT / rel if rel.startswith("results/") else ROOT / "docs" / rel
        assert path.is_file(), f"{page.name} shows {target}, which does not exist"


def test_diagrams_draw_and_are_committed(tmp_path):
    pytest.importorskip("matplotlib")
    diagrams = drawn_figures()
    names = diagrams.draw_all(tmp_path)
    shown = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md"))
    for name in names:
        assert (tmp_path / name).stat().st_size > 10_000, f"{name} is drawn empty"
        assert (ROOT / "docs" / "figures" / name).is_file(), \
            f"run `python docs/figures/diagrams.py` to commit {name}"
        assert f"../figures/{name}" in shown, f"no page shows {name}"
