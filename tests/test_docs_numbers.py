"""Every figure the README and the docs quote from a result equals the results file it cites.

A quoted figure carries a marker right after it, invisible on GitHub and on the site:
``1.9116<!-- result: shakespeare_char.json figures.test_loss -->``: the file under results/, the dotted
key of the figure (a number indexes a list: ``rows.1.val_bpb``), and optionally a divisor (``wall_time_s /60``
quotes seconds as minutes). The figure written before the marker must equal the file's value rounded to the
decimals the page shows; thousands separators are allowed. In the pages that quote the most (README,
docs/index.md, the training reference and every tutorial), every figure next to a results link must carry a
marker.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"(?P<figure>[0-9][0-9,]*(?:\.[0-9]+)?)\**\s*<!-- result: (?P<file>\S+) (?P<key>[\w.@-]+)"
                    r"(?: /(?P<divisor>[0-9.]+))? -->")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FULLY_MARKED = ["README.md", "docs/index.md", "docs/reference/training.md",
                *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "tutorials").glob("*.md"))]


def _markers():
    for page in PAGES:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for m in MARKER.finditer(line):
                yield pytest.param(m, id=f"{page.relative_to(ROOT)}:{n}:{m['key']}")


def lookup(data, dotted):
    """The value at a dotted key; a number indexes a list (``rows.1.val_bpb``)."""
    for part in dotted.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def test_the_pages_quote_results_with_markers():
    assert len(list(_markers())) >= 10


@pytest.mark.parametrize("m", list(_markers()))
def test_quoted_figure_equals_its_results_file(m):
    path = ROOT / "results" / m["file"]
    assert path.is_file(), f"the marker cites results/{m['file']}, which does not exist"
    value = lookup(json.loads(path.read_text(encoding="utf-8")), m["key"]) / float(m["divisor"] or 1)
    shown = m["figure"]
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    assert float(shown.replace(",", "")) == round(value, decimals), (
        f"the page shows {shown}; results/{m['file']} {m['key']} is {value} (rewrite the page, or re-run the "
        f"command that writes the file)")


# a figure (a decimal or a number with thousands separators) on a line that cites a results page
FIGURE = re.compile(r"(?<![\w.])[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?(?![\w,])|(?<![\w.])[0-9]+\.[0-9]+(?![\w.])")


@pytest.mark.parametrize("name", FULLY_MARKED)
def test_every_figure_next_to_a_results_link_is_marked(name):
    unmarked = []
    for n, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1):
        if "results/" not in line:
            continue
        marked = {m.start("figure") for m in MARKER.finditer(line)}
        for f in FIGURE.finditer(line):
            if f.start() not in marked:
                unmarked.append(f"{name}:{n}: {f.group()}")
    assert not unmarked, f"figures quoted next to a results link without a marker: {unmarked}"
