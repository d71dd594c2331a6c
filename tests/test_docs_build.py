"""The documentation site builds with `mkdocs build --strict`: no broken link, anchor or API reference.

This is what `make docs` runs; here the site goes to a temporary folder. The API pages import
numformer's modules through mkdocstrings, so a renamed function breaks this test.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs build needs mkdocs-material and mkdocstrings (the test extra)")
    pytest.importorskip("material", reason="the docs build needs mkdocs-material (the test extra)")
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs build needs mkdocstrings[python]")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    for page in ("index.html", "exercises/index.html", "tutorials/backprop/index.html",
                 "reference/training/index.html", "api/ops/index.html", "results/positional/index.html"):
        assert (site / page).is_file(), f"the site has no {page}"
    ops = (site / "api" / "ops" / "index.html").read_text(encoding="utf-8")
    assert "layer_norm_backward" in ops, "the API page of numformer.ops lists no functions"
    assert (site / "results" / "figures" / "positional.png").is_file(), "results/ figures are not published"
    check_typeset_math(site)
    check_inline_code_keeps_its_hyphens(site)
    check_api_pages_show_their_tokens(site)
    pages = list(site.rglob("*.html"))
    offline = [p.relative_to(site) for p in pages if "fonts.googleapis" in p.read_text(encoding="utf-8")]
    assert not offline, f"pages that load Google Fonts (set theme.font: false): {offline[:5]}"


def test_the_pages_links_resolve_in_the_repository():
    """Every relative link of a docs page points at a file where the page sits in the repository, so GitHub
    and an editor follow it; results/ is linked where it is (../results/ from docs/), which
    docs/hooks/results.py points at the site's copy."""
    broken = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+:", path) and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken[:10]


def test_the_hook_points_results_links_at_the_sites_copies():
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        from results import site_links
    finally:
        sys.path.pop(0)
    assert site_links("[a](../results/bench.md#x) [b](tutorials/x.md)", "experiments.md") == \
        "[a](results/bench.md#x) [b](tutorials/x.md)"
    assert site_links("![f](../../results/figures/p.png) [c](../results/)", "tutorials/positions.md") == \
        "![f](../results/figures/p.png) [c](../results/)"


# The elements the API pages are made of (the theme's and Markdown's). A token written bare in a docstring
# (<eos>, <end_of_turn>, <model class>) becomes a tag the browser hides, or acts on: Llama's <s> strikes the
# text after it through, so "s" is not among them.
HTML_ELEMENTS = set("""a abbr article aside b blockquote body br button caption code col colgroup dd del details div dl
    dt em figcaption figure footer form h1 h2 h3 h4 h5 h6 head header hr html i img input ins kbd label li link main
    mark meta nav ol p path pre script section small span strong style sub summary sup svg table tbody td tfoot th
    thead title tr u ul""".split())


def check_api_pages_show_their_tokens(site):
    """Every tag of the API pages is an element of the pages' own (``HTML_ELEMENTS``): docstrings put a token
    such as <eos> in backticks. Also: every module of numformer.analysis has its functions on the page."""
    tag = re.compile(r"<([A-Za-z][^\s>/]*)")
    found = {str(p.relative_to(site)): sorted(set(tag.findall(p.read_text(encoding="utf-8"))) - HTML_ELEMENTS)
             for p in (site / "api").rglob("*.html")}
    assert not {k: v for k, v in found.items() if v}, f"docstring text that renders as HTML tags: {found}"
    analysis = (site / "api" / "analysis" / "index.html").read_text(encoding="utf-8")
    assert 'id="numformer.analysis.lens.logit_lens"' in analysis


def check_inline_code_keeps_its_hyphens(site):
    """A flag in inline code is not broken at its hyphens (docs/hooks/inline_code.py, stylesheets/extra.css)."""
    page = (site / "tutorials" / "quantization" / "index.html").read_text(encoding="utf-8")
    assert '<code><span class="nobr">--group-size</span> G</code>' in page
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert re.search(r"\.nobr \{\s*white-space: nowrap;", css)


def test_inline_code_is_wrapped_only_around_its_hyphenated_runs():
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        from inline_code import keep_hyphens
    finally:
        sys.path.pop(0)
    html = ('<p><code>--set train.lr=1e-3</code> and <code>make run</code></p>'
            '<pre><span></span><code><span class="n">a</span> - b</code></pre>')
    assert keep_hyphens(html) == ('<p><code><span class="nobr">--set</span> <span class="nobr">train.lr=1e-3</span>'
                                  '</code> and <code>make run</code></p>'
                                  '<pre><span></span><code><span class="n">a</span> - b</code></pre>')


def check_typeset_math(site):
    """The formulas are MathML in the built pages (docs/hooks/mathml.py), none left as LaTeX source."""
    for page in ("tutorials/backprop/index.html", "tutorials/block-by-block/index.html"):
        html = (site / page).read_text(encoding="utf-8")
        assert html.count("<math ") >= 10, f"{page} has no typeset math"
        assert '<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">' in html, \
            f"{page} has no displayed equation"
        assert "<mfrac>" in html, f"{page}: the fractions are not typeset"
    for page in site.rglob("*.html"):
        assert 'class="arithmatex"' not in page.read_text(encoding="utf-8"), \
            f"{page.relative_to(site)} keeps LaTeX source that was not typeset"


# The packages whose every public module the API reference renders: the equations (ops), their fast kernels,
# the layers and models built on them, the optimizers, the quantized kernels and every Hugging Face family.
RENDERED_IN_FULL = {"ops": "ops", "kernels": "kernels", "nn": "nn", "models": "models", "optim": "optim",
                    "quantize": "quantize", "interop/hf": "interop", "analysis": "analysis"}


@pytest.mark.parametrize("package, page", sorted(RENDERED_IN_FULL.items()))
def test_the_api_reference_renders_every_module_of(package, page):
    text = (ROOT / "docs" / "api" / f"{page}.md").read_text(encoding="utf-8")
    modules = sorted(p.stem for p in (ROOT / "src" / "numformer" / package).glob("*.py")
                     if not p.stem.startswith("_"))
    dotted = "numformer." + package.replace("/", ".")
    missing = [m for m in modules if f"::: {dotted}.{m}\n" not in text + "\n"]
    assert not missing, f"docs/api/{page}.md renders no `::: {dotted}.NAME` for {missing}"
