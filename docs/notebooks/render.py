"""Execute the MiniLLM notebook and write it as the site's notebook page, outputs and figures included.

    python docs/notebooks/render.py          # rewrites docs/notebook.md and docs/figures/minillm_*.png

The notebook is kept as text (jupytext percent format, ``minillm.py``); this script runs it in a
fresh kernel with its own parameters, as a reader would, and writes each cell as Markdown: the
Markdown cells as they are, each code cell as a Python block followed by what it printed and the
figures it drew (printed lines longer than 88 characters are wrapped to fit the page).
tests/test_docs_notebook.py checks that the page's code is the notebook's.
"""
from __future__ import annotations

import base64
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent
NOTEBOOK = HERE / "minillm.py"
PAGE = DOCS / "notebook.md"
FIGURE_PREFIX = "minillm_"
WIDTH = 88          # output lines longer than this are wrapped (tests/test_docs_style.py)

HEADER = """# The MiniLLM notebook

[`docs/notebooks/minillm.py`](notebooks/minillm.py) builds the MiniLLM model (a 6-layer
character-level GPT, d_model 384, context 256), counts its parameters component by component and
checks the count by hand, trains it briefly with `Trainer`, draws the training curve and samples
from it with three strategies. Below is the notebook as it ran, outputs included.

It is kept as text in jupytext's percent format, so it diffs and merges like code. To open it in
Jupyter, install jupytext and convert it to a notebook file, or let Jupyter open the .py file:

```console
pip install jupytext notebook
jupytext --to notebook docs/notebooks/minillm.py    # writes minillm.ipynb beside it
jupyter notebook docs/notebooks/minillm.ipynb
```

(With jupytext installed, `jupyter notebook` also opens `minillm.py` itself as a notebook: right
click, "Open With", "Notebook".) The test suite executes it in a fresh kernel with 2 training
steps instead of 30 (`tests/test_docs_notebook.py`); this page is written by
`python docs/notebooks/render.py`, which runs it with the settings shown. It ran on a shared,
heavily loaded 2-core machine: the tokens per second it prints are no benchmark
([results/bench.md](../results/bench.md) has the measured speeds).

"""


def execute(notebook=NOTEBOOK, cwd=None, extra_cell=None):
    """The notebook executed in a fresh kernel in ``cwd``; ``extra_cell`` runs after the parameters cell."""
    import jupytext
    import nbclient
    import nbformat

    nb = jupytext.read(notebook)
    if extra_cell:
        tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
        nb.cells.insert(tagged[0] + 1, nbformat.v4.new_code_cell(extra_cell))
    nbclient.NotebookClient(nb, timeout=1200, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd or Path.cwd())}}).execute()
    return nb


def code_cells(nb):
    """The source of every code cell, in order."""
    return [c.source for c in nb.cells if c.cell_type == "code"]


def to_markdown(nb, figures_dir, figure_prefix=FIGURE_PREFIX):
    """The executed notebook as Markdown; its PNG outputs are written to ``figures_dir``."""
    parts, n_fig = [], 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source)
            continue
        parts.append(f"```python\n{cell.source}\n```")
        text = []

        def flush():
            if text:
                lines = "".join(text).rstrip("\n").split("\n")
                wrapped = [piece for line in lines
                           for piece in (textwrap.wrap(line, WIDTH, drop_whitespace=False)
                                         or [""])]
                parts.append("```text\n" + "\n".join(wrapped) + "\n```")
                text.clear()

        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                text.append(out.text)
            elif out.output_type in ("execute_result", "display_data"):
                data = out.get("data", {})
                if "image/png" in data:
                    flush()
                    n_fig += 1
                    name = f"{figure_prefix}{n_fig}.png"
                    (Path(figures_dir) / name).write_bytes(base64.b64decode(data["image/png"]))
                    parts.append(f"![Figure {n_fig} of the notebook](figures/{name})")
                elif "text/plain" in data:
                    text.append(data["text/plain"] + "\n")
            elif out.output_type == "error":
                raise RuntimeError(f"the notebook failed: {out.ename}: {out.evalue}")
        flush()
    return "\n\n".join(parts) + "\n", n_fig


def render(page=PAGE, figures_dir=DOCS / "figures", cwd=None, extra_cell=None):
    """Execute the notebook and write ``page`` (and its figures); returns the page's text."""
    with tempfile.TemporaryDirectory() as tmp:
        nb = execute(cwd=cwd or tmp, extra_cell=extra_cell)
    body, _ = to_markdown(nb, figures_dir)
    text = HEADER + body
    Path(page).write_text(text, encoding="utf-8")
    return text


if __name__ == "__main__":
    render()
    print("wrote", PAGE, file=sys.stderr)
