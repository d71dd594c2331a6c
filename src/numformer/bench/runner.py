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

``run_parts`` merges each part's result into ``bench.json`` under the part's
name (other parts' entries are kept, so parts can be run one at a time; a part
run with ``quantize="int8"`` under ``<part>_int8``, beside its float32 section) and
regenerates ``bench.md`` from every part present in the JSON.
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

from .._limits import check_record, read_json_file
from .._results import BENCH_TITLE, check_results_folder
from ..provenance import machine_info
from ..run_files import write_atomic

# The parts in the order bench.md lists them; any other module found in numformer.bench with
# ``run`` and ``markdown`` is a part too and comes after these.
PARTS = ("throughput", "attention", "checkpointing", "generate", "depth")
# Modules of numformer.bench that are helpers, not parts (modules whose name starts with "_" are left out too).
NOT_PARTS = {"runner", "torch_reference", "profile"}
META_KEY = "_run"


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
        if meta:
            m = meta.get("machine", {})
            lines += ["", f"<sub>`{meta.get('command', 'numformer bench ' + name)}` on {meta.get('date', '?')}, "
                          f"{meta.get('seconds', 0):.0f} s; {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
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
    modules = {name: load_part(name) for name in names}       # fail early on a bad name
    taken = _part_options(modules, {k: v for k, v in (options or {}).items() if v is not None})
    out_dir = Path(out_dir)
    check_results_folder(out_dir, "--out")
    load_results(out_dir)                                      # a damaged bench.json: refused before any part runs
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
                            "machine": machine_info()}
        json.dumps(result)                                     # fail here, not after merging
        results = load_results(out_dir)                        # re-read: another part may have written meanwhile
        results[section] = result                             # generate --quantize int8: generate_int8
        _atomic_write(out_dir / "bench.json", json.dumps(results, indent=1) + "\n")
        _atomic_write(out_dir / "bench.md", render_markdown(results, out_dir))
        done[section] = result
        log(f"  {section}: {result[META_KEY]['seconds']:.0f} s -> {out_dir / 'bench.json'}, {out_dir / 'bench.md'}")
    return done


__all__ = ["PARTS", "available_parts", "load_part", "run_parts", "render_markdown", "load_results", "image_link",
           "machine_info"]
