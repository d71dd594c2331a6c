"""A results folder: where ``numformer reproduce`` and ``numformer bench`` write their records and pages.

Each command rewrites its own files there (results/NAME.json and NAME.md, figures/, the index README.md;
bench.json and bench.md): regenerating them is what the commands are for. So that they never write among
someone else's files (``--results .`` in a project of one's own would replace its README.md), a results
folder must be new, empty, or one that numformer wrote, recognized by the first line of its index or of the
benchmarks' page. ``numformer analyze --out DIR`` follows the same rule with its report (``report.md``,
recognized by its title, ``REPORT_TITLE``).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ._platform import LOCK_FILE

INDEX_TITLE = "# Results"                   # the first line of results/README.md (experiments.runner.write_index)
BENCH_TITLE = "# numformer benchmarks"      # the first line of bench.md (bench.runner.render_markdown)
REPORT_TITLE = "# Analysis report"         # the start of report.md's first line (analysis.report.write_report)
_PAGES = {"README.md": INDEX_TITLE, "bench.md": BENCH_TITLE}
# The figures an analysis report may draw beside its report.md (analysis.report.write_report)
REPORT_FIGURES = ("model_diagram.png", "attention_*.png", "head_stats_*.png", "head_ablation.png",
                  "position_importance.png", "loss.png", "lr.png", "eval_metrics.png", "positional_*.png",
                  "position_similarity_*.png", "wavelengths.png")


def _first_line(path):
    try:
        with open(path, "rb") as f:
            return f.readline(200).decode("utf-8", "replace").rstrip("\r\n")
    except OSError:
        return None


def is_results_folder(path, pages=None):
    """Whether ``path`` is new, empty, or a folder of results numformer wrote: one of ``pages`` ({file: its first
    line}, default the results index and the benchmarks' page; given, {file: the start of its first line}) is
    there."""
    path = Path(path)
    if not os.path.lexists(path):
        return True
    if not path.is_dir():
        return False
    if not any(entry.name != LOCK_FILE for entry in path.iterdir()):
        return True
    lines = {page: _first_line(path / page) or "" for page in (pages or _PAGES) if (path / page).is_file()}
    return any(line == _PAGES[page] if pages is None else line.startswith(pages[page]) for page, line in lines.items())


def check_results_folder(path, option="--results", overwrite=False):
    """ValueError naming ``path`` unless it is a results folder (``is_results_folder``) or ``overwrite``."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        raise ValueError(f"{option} {path} is a file, not a folder; choose another {option}")
    if overwrite or is_results_folder(path):
        return
    raise ValueError(f"{option} {path} holds files that numformer did not write (it has no results index "
                     f"README.md or bench.md of numformer's): results and their index would be written among "
                     f"them; choose another {option}" + (", or give --overwrite" if option == "--results" else ""))


def check_report_folder(path, overwrite=False):
    """ValueError naming ``path`` (analyze's --out) unless it is new, empty, holds an earlier analysis report
    (its report.md), or ``overwrite``: the report's report.md and figures are never written among other files."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        raise ValueError(f"--out {path} is a file, not a folder; choose another --out")
    if overwrite or is_results_folder(path, {"report.md": REPORT_TITLE}):
        return _check_writable(path)
    raise ValueError(f"--out {path} holds files that are not an analysis report of numformer's (no report.md "
                     f"starting with '{REPORT_TITLE}'): report.md and its figures would be written among them; "
                     f"choose another --out, or give --overwrite")


def _check_writable(path):
    """ValueError when no file can be made in ``path``, or in the nearest folder above it that exists (the one
    its making would write): found before the report is computed, not after."""
    folder = Path(os.path.abspath(path))
    while not folder.is_dir() and folder.parent != folder:
        folder = folder.parent
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".numformer-probe-")
    except OSError as e:
        raise ValueError(f"--out {path} cannot be written ({folder}: {e.strerror or e}); choose another --out, for "
                         f"example one in your home folder") from None
    os.close(fd)
    os.unlink(probe)


def remove_report(path):
    """Delete the analysis report in folder ``path`` (report.md with its title, and the figures a report
    draws; the folder too once empty), as when the run it describes is replaced; other files stay. Returns
    whether there was one."""
    path = Path(path)
    if not (path.is_dir() and (_first_line(path / "report.md") or "").startswith(REPORT_TITLE)):
        return False
    for figure in (f for pattern in REPORT_FIGURES for f in path.glob(pattern)):
        figure.unlink(missing_ok=True)
    (path / "report.md").unlink(missing_ok=True)
    if not any(path.iterdir()):
        path.rmdir()
    return True
