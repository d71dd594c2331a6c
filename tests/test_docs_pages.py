"""Every Python block of the tutorials, the exercises page, the examples page and the README runs.

Sybil executes each page's ```python blocks in order, in one namespace per page; blocks written as
doctests (``>>>``) must print exactly what the page shows (ELLIPSIS and NORMALIZE_WHITESPACE on).
On the tutorials and the how-to guides, ```bash blocks run too (``numformer`` commands); ```console
blocks are shown, not run (the commands that need a downloaded dataset or model, or hours), and a
block after ``<!-- skip: next -->`` is shown, not run (Python that needs a downloaded model).
Each page runs in a fresh temporary folder, with ``configs/`` linked in, so what a page writes
(run folders, figures) never lands in the repository.

Long steps (real training) run with tiny settings here: TINY lists, per page, the text on the page
and what the test runs instead; each replaced text must be on the page, so the list cannot drift
from it silently. The pages state what the full run gives, from results/*.md.

Figures: a page shows ``../figures/NAME.png`` only if its own code writes NAME.png (checked here), and a
committed figure that says what it shows (a model diagram's PNG holds the diagram as text) shows what the
page draws now.
``python tests/test_docs_pages.py --figures [PAGE ...]`` runs the figure-making pages as written (their
full settings) and copies what they draw to docs/figures/, so regenerating the committed PNGs. The architecture drawings are the exception: docs/figures/diagrams.py
draws them (``python docs/figures/diagrams.py``; tests/test_docs_figures.py).
"""
from __future__ import annotations

import contextlib
import doctest
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/index.md", "docs/exercises.md", "docs/examples.md",
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "tutorials").glob("*.md")),
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "how-to").glob("*.md"))]
RUN_SHELL = ("docs/tutorials/", "docs/how-to/")      # pages whose ```bash blocks run too

# (page, text on the page, what the test runs instead)
TINY = {
    "docs/tutorials/first-gpt.md": [
        ('"max_steps": 2000', '"max_steps": 12'),
        ('"eval_every": 250', '"eval_every": 6'),
        ('"eval_batches": 4', '"eval_batches": 1'),
        ('"n_layers": 4', '"n_layers": 1'),
    ],
    "docs/tutorials/encoder-decoder.md": [
        ('"max_steps": 400', '"max_steps": 8'),
        ('"length": 12', '"length": 4'),
        ('"n_val": 200', '"n_val": 16'),
        ('"n_test": 200', '"n_test": 16'),
    ],
    "docs/tutorials/looking-inside.md": [
        ('"max_steps": 400', '"max_steps": 8'),
        ('"n_val": 200', '"n_val": 16'),
    ],
    "docs/tutorials/researcher.md": [
        ("steps = 1500", "steps = 6"),
    ],
    "docs/tutorials/fast-numpy.md": [
        ("T = 2048", "T = 256"),
        ("n_layers=8", "n_layers=2"),
    ],
    "docs/tutorials/quantization.md": [
        ('"max_steps": 300', '"max_steps": 30'),
        ('"data": {"task": "text", "block_size": 64},', '"data": {"task": "text", "block_size": 64, "val_fraction": 0.01},'),
        ("max_batches=8", "max_batches=1"),
    ],
    "docs/examples.md": [
        ("block_size, batch_size, max_steps = 64, 12, 300", "block_size, batch_size, max_steps = 64, 12, 6"),
        ('"max_steps": 300', '"max_steps": 6'),
        ('"eval_every": 100', '"eval_every": 3'),
        ("train.max_steps=400", "train.max_steps=9"),
        ('"data": {"task": "text", "block_size": 64},', '"data": {"task": "text", "block_size": 64, "val_fraction": 0.01},'),
    ],
}
FIGURE = re.compile(r"\]\(\.\./figures/([\w.-]+\.png)\)")


def drawn_figures():
    """The figures docs/figures/diagrams.py draws (architecture drawings, not made by a page's code)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("diagrams", ROOT / "docs" / "figures" / "diagrams.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page_text(page, tiny=True):
    text = (ROOT / page).read_text(encoding="utf-8")
    for old, new in TINY.get(page, []) if tiny else []:
        assert old in text, f"{page} no longer contains {old!r}: update TINY in {__file__}"
        text = text.replace(old, new)
    return text


@contextlib.contextmanager
def one_thread_per_worker():
    """Under pytest-xdist (one worker per core) run numformer and the BLAS on one thread, as a data-parallel
    process does: threads of two workers competing for the same cores only wait for each other."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    from numformer._runtime import single_threaded

    saved = {k: os.environ.get(k) for k in ("NUMFORMER_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    os.environ.update(dict.fromkeys(saved, "1"))        # for the numformer commands the pages run
    try:
        with single_threaded():
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_shell(example):
    """Run a ```bash block of a tutorial (``numformer`` commands) with this interpreter's scripts first on PATH."""
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", example.parsed], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return f"exit code {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def run_page(page, cwd, tiny=True):
    """Run every Python block of ``page`` in order in ``cwd``; return the figure names the page shows."""
    from sybil import Document
    from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

    parsers = [PythonCodeBlockParser(doctest_optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE),
               SkipParser()]
    if page.startswith(RUN_SHELL):
        parsers.append(CodeBlockParser(language="bash", evaluator=run_shell))
    document = Document(page_text(page, tiny), str(ROOT / page))
    for parser in parsers:
        for region in parser(document):
            document.add(region)
    document.namespace["__name__"] = "__main__"
    old = Path.cwd()
    os.chdir(cwd)
    try:
        examples = list(document)
        assert examples, f"{page} has no Python blocks"
        for example in examples:
            example.evaluate()
    finally:
        os.chdir(old)
        import matplotlib.pyplot as plt
        plt.close("all")
    return FIGURE.findall(document.text)


@pytest.mark.parametrize("page", PAGES)
def test_page_runs(page, tmp_path):
    pytest.importorskip("sybil", reason="the docs tests need sybil (pip install -e '.[test]')")
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    with one_thread_per_worker():
        figures = run_page(page, tmp_path)
    drawn = drawn_figures().DRAWINGS
    for name in figures:
        if name in drawn:            # checked by tests/test_docs_figures.py
            continue
        assert (tmp_path / name).is_file(), f"{page} shows ../figures/{name} but its code does not write {name}"
        assert (ROOT / "docs" / "figures" / name).is_file(), f"run `python {__file__} --figures` to write {name}"
        shows = _description(tmp_path / name)       # a figure that says what it shows (a model diagram)
        assert shows is None or shows == _description(ROOT / "docs" / "figures" / name), \
            f"docs/figures/{name} does not show what {page} draws now: run `python {__file__} --figures`"


def _description(path):
    """The Description field of a PNG (numformer's model diagrams store the diagram as text there), or None."""
    from PIL import Image

    with Image.open(path) as image:
        return image.info.get("Description")


def test_first_gpt_config_is_the_make_run_config():
    """The config dict of "Train your first GPT" is configs/shakespeare_char.toml, key for key."""
    import tomllib

    text = page_text("docs/tutorials/first-gpt.md", tiny=False)
    block = re.search(r"```python\n(config = \{.*?)```", text, re.S).group(1)
    namespace = {}
    exec(block, namespace)
    toml = tomllib.loads((ROOT / "configs" / "shakespeare_char.toml").read_text(encoding="utf-8"))
    assert namespace["config"] == toml


def write_figures(pages=()):
    """Run each page that shows figures (or those of ``pages``) as written, not with the TINY settings, in a
    temporary folder, and copy its PNGs to docs/figures/: a figure of a trained model shows the page's run."""
    import shutil
    import tempfile

    for page in pages or PAGES:
        if not FIGURE.search(page_text(page, tiny=False)):
            continue
        print("running", page)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "configs").symlink_to(ROOT / "configs")
            for name in run_page(page, tmp, tiny=False):
                shutil.copy(Path(tmp) / name, ROOT / "docs" / "figures" / name)


if __name__ == "__main__" and "--figures" in sys.argv:
    write_figures([a for a in sys.argv[1:] if a != "--figures"])      # e.g. docs/tutorials/quantization.md
