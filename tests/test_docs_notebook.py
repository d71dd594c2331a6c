"""The MiniLLM notebook (docs/notebooks/minillm.py, jupytext percent format) executes without error.

The notebook's "parameters" cell is followed by one that shrinks the training and the sample, so
the test runs in seconds; everything else runs as a reader would run it, in a fresh kernel.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "notebooks" / "minillm.py"
SMALL = "train_steps = 2\nbatch_size = 2\nsample_length = 20\nval_fraction = 0.002"


def test_notebook_executes(tmp_path, monkeypatch):
    jupytext = pytest.importorskip("jupytext", reason="the notebook test needs jupytext (the test extra)")
    nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient (the test extra)")
    pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel (the test extra)")
    import nbformat

    if os.environ.get("PYTEST_XDIST_WORKER"):      # one worker per core: the kernel on one thread too
        for name in ("NUMFORMER_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
            monkeypatch.setenv(name, "1")
    nb = jupytext.read(NOTEBOOK)
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    nb.cells.insert(tagged[0] + 1, nbformat.v4.new_code_cell(SMALL))
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "by hand: 10,770,816" in outputs
    assert "--- top-p 0.9" in outputs
    assert (tmp_path / "runs" / "minillm_notebook" / "model.safetensors").is_file()
