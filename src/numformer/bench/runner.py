"""Run benchmark parts and keep ``results/bench.json`` and ``results/bench.md`` up to date.

A *part* is a module ``numformer.bench.<part>`` that defines

    run(quick: bool) -> dict
        Measure and return the figures (JSON-able: numbers, strings, lists, dicts).
        ``quick=True`` is a smoke run that must finish in under a minute. A part may take
        more keyword arguments (the part ``quantize``: ``run_dir``, ``group_size``, ``overwrite``;
        ``generate``: ``quantize``, ``group_size``); ``run_parts`` passes each part the ``options`` its
        ``run`` names.

    markdown(result: dict, fig_dir: pathlib.Path) -> str
        A markdown section (starting with a ``## `` heading) describing ``result``.
        Plots are written as PNG files into ``fig_dir`` (created by the runner;
        it is ``<out>/figures``) and linked relative to ``<out>/bench.md``;
        ``image_link(path, alt)`` below builds that link.

and may define

    cpu_row(result: dict) -> dict
        The part's few headline figures ({column title: number, or a list of numbers shown as "a / b"}), kept
        in bench.md's table "Measured on each CPU model" of the part's section: the speed ratios change from
        one CPU model to another, so one full run's row is kept per CPU model (see ``keep_cpu_rows``).

    REQUIRES: tuple
        The optional packages the part imports (import names of ``_install.PROVIDED_BY``, e.g. ("torch",)):
        a part whose package is missing is refused with what to install before any part runs.

``run_parts`` merges each part's result into ``bench.json`` under the part's
name (other parts' entries are kept, so parts can be run one at a time; a part
run with ``quantize="int8"`` under ``<part>_int8``, beside its float32 section) and
regenerates ``bench.md`` from every part present in the JSON. A part with ``cpu_row`` keeps, under its
section's key ``_per_cpu``, one row per CPU model ({cpu_label: {"date", "command", "commit", figures}}): a full
run replaces the row of its own CPU model (``provenance.machine_info()["cpu_label"]``, e.g. "AMD EPYC (Zen 3,
family 25 model 1, AVX2)") and keeps the others; a quick run adds none.
"""
from __future__ import annotations

import datetime as _dt
import importlib
import inspect
import json
import os
import pkgutil
import time
from pathlib import Path

from .._install import require
from .._limits import check_record, read_json_file
from .._results import BENCH_TITLE, check_results_folder
from ..provenance import cpu_label, git_commit, machine_info
from ..run_files import write_atomic

# The parts in the order bench.md lists them; any other module found in numformer.bench with
# ``run`` and ``markdown`` is a part too and comes after these.
PARTS = ("throughput", "op_families", "attention", "checkpointing", "generate", "depth")
# Modules of numformer.bench that are helpers, not parts (modules whose name starts with "_" are left out too).
NOT_PARTS = {"runner", "torch_reference", "profile"}
META_KEY = "_run"
CPU_ROWS_KEY = "_per_cpu"          # a section's rows by CPU model: written by the runner, like META_KEY
_ROW_META = ("date", "command", "commit")


def available_parts():
    """Names of the part modules present in numformer.bench (without importing them)."""
    found = {m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
             if not m.name.startswith("_") and m.name not in NOT_PARTS}
    return [p for p in PARTS if p in found] + sorted(found - set(PARTS))


def load_part(name):
    """Import ``numformer.bench.<name>`` and check it exposes run() and markdown()."""
    if name not in available_parts():
        raise ValueError(f"unknown benchmark part {name.replace('_', '-')!r}; choose one of "
                         f"{', '.join(p.replace('_', '-') for p in available_parts() + ['all'])}")
    module = importlib.import_module(f"{__package__}.{name}")
    missing = [f for f in ("run", "markdown") if not callable(getattr(module, f, None))]
    if missing:
        raise ValueError(f"benchmark part {name!r} (numformer.bench.{name}) does not define {missing}")
    return module


def image_link(path, alt, fig_dir):
    """Markdown image link to ``path`` (a PNG in ``fig_dir``), relative to bench.md (``fig_dir``'s parent)."""
    rel = os.path.relpath(Path(path), Path(fig_dir).parent)
    return f"![{alt}]({Path(rel).as_posix()})"


def _atomic_write(path, text):
    Path(path).parent.mkdir(parents=True, exist_ok=True)       # --out names a folder that may not exist yet
    write_atomic(path, text.encode())


def load_results(out_dir):
    """The parts' results stored in ``<out_dir>/bench.json`` ({} if none yet)."""
    path = Path(out_dir) / "bench.json"
    if not path.exists():
        return {}
    try:
        return check_record(read_json_file(path, "benchmark record"), {"*": dict}, f"benchmark record {path}")
    except ValueError as e:
        raise ValueError(f"{e} (move it away and run the benchmark again)") from None


def _jsonable(x):
    """Convert NumPy scalars/arrays and paths so that json.dumps accepts the result."""
    import numpy as np

    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    return x


def _row_of(module, result, log):
    """``module.cpu_row(result)`` (JSON-able), or None for a part without cpu_row or a result it cannot read (a
    section written by an older version of the part: its row is left out, the rest of the run goes on)."""
    row_fn = getattr(module, "cpu_row", None)
    if not callable(row_fn):
        return None
    try:
        return _jsonable(dict(row_fn(result)))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        log(f"  numformer.bench.{module.__name__.rsplit('.', 1)[-1]}.cpu_row() failed on the run of "
            f"{result.get(META_KEY, {}).get('date', '?')} ({type(e).__name__}: {e}); that run has no CPU row")
        return None


def _cpu_row(module, result, log):
    """{CPU label: row} for the full run ``result`` (a section with its META_KEY), or {} (a quick run, no row)."""
    meta = result.get(META_KEY) or {}
    row = None if meta.get("quick", True) else _row_of(module, result, log)
    if row is None:
        return {}
    when = {k: meta[k] for k in _ROW_META if meta.get(k)}      # older sections recorded no commit
    return {cpu_label(meta.get("machine") or {}): {**when, **{k: v for k, v in row.items() if k not in _ROW_META}}}


def keep_cpu_rows(module, previous, result, log=print):
    """The rows by CPU model the section ``result`` (this run, its META_KEY set) keeps when it replaces
    ``previous`` (the section bench.json holds, or None): the previous rows, with this run's row (if a full
    run) in place of the row of its CPU label. A previous section written before sections kept rows (no
    ``_per_cpu``) gives its own full run's row, labelled from its recorded machine (``provenance.cpu_label``)."""
    rows = {}
    if isinstance(previous, dict):
        kept = previous.get(CPU_ROWS_KEY)
        if isinstance(kept, dict):
            rows.update({label: row for label, row in kept.items() if isinstance(row, dict)})
        elif kept is None:
            rows.update(_cpu_row(module, previous, log))
    rows.update(_cpu_row(module, result, log))
    return rows


def _figure(value):
    """A figure of a CPU row as bench.md shows it."""
    if isinstance(value, list):
        return " / ".join(_figure(v) for v in value)
    if isinstance(value, float):               # ratios to two decimals, large counts whole, tiny ones to 3 digits
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.2f}" if abs(value) >= 0.01 else f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "" if value is None else str(value)


def cpu_rows_markdown(rows):
    """Markdown lines of a section's rows by CPU model ({label: row}): one line per model, its run's date and
    commit, then the part's figures (every row's keys, in the order first seen)."""
    figures = list(dict.fromkeys(k for row in rows.values() for k in row if k not in _ROW_META))
    lines = ["Measured on each CPU model (one row per model, from the latest full run of this part on it):", "",
             "| CPU model | date | commit | " + " | ".join(figures) + " |", "|---|---|---|" + "---:|" * len(figures)]
    for label in sorted(rows):
        row = rows[label]
        cells = [label, str(row.get("date") or "?")[:10], str(row.get("commit") or "")]
        cells += [_figure(row.get(k)) for k in figures]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def render_markdown(results, out_dir):
    """bench.md text for every part in ``results``; each part's plots go to ``<out_dir>/figures``."""
    fig_dir = Path(out_dir) / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    lines = [BENCH_TITLE, "",
             "Written by `numformer bench PART` (`numformer bench all` runs every part); "
             "the figures come from `bench.json` next to this file. Never edited by hand.", ""]
    order = [p for p in PARTS if p in results] + sorted(p for p in results if p not in PARTS)
    for name in order:
        result = results[name]
        meta = result.get(META_KEY, {}) if isinstance(result, dict) else {}
        try:
            module = load_part(meta.get("part", name))
            section = module.markdown(result, fig_dir).rstrip()
        except Exception as e:  # one broken part must not hide the others
            section = f"## {name}\n\nmarkdown() of this part failed: `{type(e).__name__}: {e}`"
        lines.append(section)
        rows = result.get(CPU_ROWS_KEY) if isinstance(result, dict) else None
        if rows and isinstance(rows, dict):
            lines += ["", *cpu_rows_markdown(rows)]
        if meta:
            m = meta.get("machine", {})
            lines += ["", f"<sub>`{meta.get('command', 'numformer bench ' + name)}` on {meta.get('date', '?')}, "
                          f"{meta.get('seconds', 0):.0f} s; {m.get('cpu_label') or m.get('cpu', '?')}, "
                          f"{m.get('cores', '?')} cores, "
                          f"NumPy {m.get('numpy', '?')} ({m.get('blas', '?')}"
                          + (f", {m['blas_core']} kernels" if m.get("blas_core") else "") + ")"
                          f"{' — quick run (smoke check, not for reporting)' if meta.get('quick') else ''}</sub>"]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _part_options(modules, options):
    """{part: the options its run() takes}; one error for an option no selected part takes."""
    taken = {name: {k: v for k, v in options.items() if k in inspect.signature(m.run).parameters}
             for name, m in modules.items()}
    unused = [k for k in options if not any(k in t for t in taken.values())]
    if unused:
        flags = ", ".join("--" + k.replace("_", "-") for k in unused)
        raise ValueError(f"{flags} is not an option of {', '.join(modules)}; `numformer bench --help` says which "
                         f"parts take it")
    return taken


def run_parts(parts, quick=False, out_dir="results", log=print, options=None):
    """Run each part, merge its result into bench.json, and rewrite bench.md. Returns {part: result}.
    ``options``: keyword arguments ({name: value}) for the parts whose run() takes them."""
    if isinstance(parts, str):
        parts = [parts]
    names = available_parts() if "all" in parts else list(dict.fromkeys(p.replace("-", "_") for p in parts))
    modules = {name: load_part(name) for name in names}       # fail early on a bad name ...
    for name, module in modules.items():                        # ... or a package a part needs
        require(getattr(module, "REQUIRES", ()), f"numformer bench {name.replace('_', '-')}")
    taken = _part_options(modules, {k: v for k, v in (options or {}).items() if v is not None})
    out_dir = Path(out_dir)
    check_results_folder(out_dir, "--out")
    load_results(out_dir)                                      # a damaged bench.json: refused before any part runs
    commit = git_commit()                                      # the code this process runs, asked at its start
    forced = machine_info().get("blas_coretype")
    if forced:
        log(f"note: OPENBLAS_CORETYPE={forced} in the environment picks OpenBLAS's kernels instead of the CPU, and "
            f"the products' speed depends on them; these runs are labelled with it (unset it to measure the "
            f"kernels OpenBLAS picks for this CPU)")
    done = {}
    for name, module in modules.items():
        flags = (" --quick" if quick else "") + "".join(
            f" --{k.replace('_', '-')} {v}" for k, v in taken[name].items())
        log(f"numformer bench {name}{flags} ...")
        t0 = time.perf_counter()
        result = _jsonable(module.run(quick=quick, **taken[name]))
        if not isinstance(result, dict):
            raise TypeError(f"numformer.bench.{name}.run() must return a dict, got {type(result).__name__}")
        section = name + (f"_{taken[name]['quantize']}" if taken[name].get("quantize") else "")
        result[META_KEY] = {"quick": bool(quick), "seconds": round(time.perf_counter() - t0, 1), "part": name,
                            "date": _dt.datetime.now().isoformat(timespec="seconds"),
                            "command": f"numformer bench {name}{flags}",
                            "machine": machine_info(), **({"commit": commit} if commit else {})}
        json.dumps(result)                                     # fail here, not after merging
        results = load_results(out_dir)                        # re-read: another part may have written meanwhile
        rows = keep_cpu_rows(module, results.get(section), result, log)
        if rows:
            result[CPU_ROWS_KEY] = rows                        # the rows of other CPU models outlive this run
        results[section] = result                             # generate --quantize int8: generate_int8
        _atomic_write(out_dir / "bench.json", json.dumps(results, indent=1) + "\n")
        _atomic_write(out_dir / "bench.md", render_markdown(results, out_dir))
        done[section] = result
        log(f"  {section}: {result[META_KEY]['seconds']:.0f} s -> {out_dir / 'bench.json'}, {out_dir / 'bench.md'}")
    return done


__all__ = ["PARTS", "available_parts", "load_part", "run_parts", "render_markdown", "load_results", "image_link",
           "machine_info", "keep_cpu_rows", "cpu_rows_markdown"]
