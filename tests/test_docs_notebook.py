"""The MiniLLM notebook (docs/notebooks/minillm.py, jupytext percent format) executes, and its page shows it run.

The notebook's "parameters" cell is followed by one that shrinks the training and the sample, so
the test runs in seconds; everything else runs as a reader would run it, in a fresh kernel. The
site's notebook page (docs/notebook.md) is that notebook executed with its own settings by
``python docs/notebooks/render.py``: the page must hold the notebook's current code, its outputs
and its figure.
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "notebooks" / "minillm.py"
PAGE = ROOT / "docs" / "notebook.md"
SMALL = "train_steps = 2\nbatch_size = 2\nsample_length = 20\nval_fraction = 0.002"


def renderer():
    spec = importlib.util.spec_from_file_location("render", ROOT / "docs" / "notebooks" / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_notebook_executes(tmp_path, monkeypatch):
    pytest.importorskip("jupytext", reason="the notebook test needs jupytext (the test extra)")
    pytest.importorskip("nbclient", reason="the notebook test needs nbclient (the test extra)")
    pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel (the test extra)")

    if os.environ.get("PYTEST_XDIST_WORKER"):      # one worker per core: the kernel on one thread too
        for name in ("NUMFORMER_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
            monkeypatch.setenv(name, "1")
    render = renderer()
    nb = render.execute(cwd=tmp_path, extra_cell=SMALL)
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "by hand: 10,770,816" in outputs
    assert "--- top-p 0.9" in outputs
    assert (tmp_path / "runs" / "minillm_notebook" / "model.safetensors").is_file()
    page, n_figures = render.to_markdown(nb, tmp_path)
    assert n_figures >= 1 and (tmp_path / "minillm_1.png").stat().st_size > 10_000
    assert "```text\n" in page and "by hand: 10,770,816" in page


def test_notebook_page_shows_the_notebook_run():
    """docs/notebook.md: the notebook's code cell by cell, their outputs, a figure, and how to open it."""
    jupytext = pytest.importorskip("jupytext", reason="the notebook test needs jupytext (the test extra)")
    text = PAGE.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)\n```", text, re.S)
    cells = renderer().code_cells(jupytext.read(NOTEBOOK))
    assert blocks == cells, "docs/notebook.md is out of date: run `python docs/notebooks/render.py`"
    assert text.count("```text\n") >= 4, "the notebook page shows no outputs"
    assert "by hand: 10,770,816" in text and "--- top-p 0.9" in text
    figures = re.findall(r"!\[[^\]]+\]\((figures/minillm_\d+\.png)\)", text)
    assert figures, "the notebook page shows no figure"
    for figure in figures:
        assert (ROOT / "docs" / figure).is_file(), f"docs/{figure} is missing"
    assert "jupytext --to notebook docs/notebooks/minillm.py" in text
