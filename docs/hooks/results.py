"""MkDocs hook: publish the generated results/ folder (pages, figures, translations) as site pages.

results/ lives at the repository root because `numformer reproduce` and `numformer bench` write it
there; this hook adds its files to the build under results/, so the site shows the committed figures
without copying them. The docs link them where they are in the repository (``../results/bench.md``
from ``docs/experiments.md``, ``../../results/positional.md`` from ``docs/tutorials/``), which GitHub
and an editor follow; the hook points those links at the site's copies (one ``../`` fewer).
"""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]


def on_files(files, config):
    results = ROOT / "results"
    for path in sorted(results.rglob("*")):
        if path.is_file() and path.suffix in {".md", ".png", ".json", ".en"}:
            src_uri = "results/" + path.relative_to(results).as_posix()
            files.append(File.generated(config, src_uri, abs_src_path=str(path)))
    return files


def site_links(markdown, src_uri):
    """The page's Markdown with its links into the repository's results/ pointed at the site's results/."""
    depth = src_uri.count("/")
    repository, site = "../" * (depth + 1) + "results/", "../" * depth + "results/"
    return re.sub(r"\]\(" + re.escape(repository), "](" + site, markdown)


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith("results/"):
        return markdown
    return site_links(markdown, page.file.src_uri)
