"""MkDocs hook: publish the generated results/ folder (pages, figures, translations) as site pages.

results/ lives at the repository root because `numformer reproduce` and `numformer bench` write it
there; this hook adds its files to the build under results/, so the tutorials can link
``../results/positional.md`` and the site shows the committed figures without copying them.
"""
from __future__ import annotations

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
