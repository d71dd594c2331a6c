"""Run benchmark parts and keep ``results/bench.json`` and ``results/bench.md`` up to date.

A *part* is a module ``numformer.bench.<part>`` that defines

    run(quick: bool) -> dict
        Measure and return the figures (JSON-able: numbers, strings, lists, dicts).
        ``quick=True`` is a smoke run that must finish in under a minute.

    markdown(result: dict, fig_dir: pathlib.Path) -> str
        A markdown section (starting with a ``## `` heading) describing ``result``.
        Plots are written as PNG files into ``fig_dir`` (created by the runner;
        it is ``<out>/figures``) and linked relative to ``<out>/bench.md``;
        ``image_link(path, alt)`` below builds that link.

``run_parts`` merges each part's result into ``bench.json`` under the part's
name (other parts' entries are kept, so parts can be run one at a time) and
regenerates ``bench.md`` from every part present in the JSON.
"""
from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
import pkgutil
import time
from pathlib import Path

from ..provenance import machine_info
from ..run_files import write_atomic

# The parts in the order bench.md lists them; any other module found in numformer.bench with
# ``run`` and ``markdown`` is a part too and comes after these.
PARTS = ("throughput", "attention", "checkpointing", "generate", "depth")
# Modules of numformer.bench that are helpers, not parts.
NOT_PARTS = {"runner", "torch_reference", "common", "timing", "profile"}
META_KEY = "_run"


def available_parts():
    """Names of the part modules present in numformer.bench (without importing them)."""
    found = {m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
             if not m.name.startswith("_") and m.name not in NOT_PARTS}
    return [p for p in PARTS if p in found] + sorted(found - set(PARTS))


def load_part(name):
    """Import ``numformer.bench.<name>`` and check it exposes run() and markdown()."""
    if name not in available_parts():
        raise ValueError(f"unknown benchmark part {name!r}; choose one of {available_parts() + ['all']}")
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
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); move it away and run the benchmark again") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a JSON object keyed by part; move it away and run again")
    return data


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
    lines = ["# numformer benchmarks", "",
             "Written by `numformer bench PART` (`numformer bench all` runs every part); "
             "the figures come from `bench.json` next to this file. Never edited by hand.", ""]
    order = [p for p in PARTS if p in results] + sorted(p for p in results if p not in PARTS)
    for name in order:
        result = results[name]
        meta = result.get(META_KEY, {}) if isinstance(result, dict) else {}
        try:
            module = load_part(name)
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


def run_parts(parts, quick=False, out_dir="results", log=print):
    """Run each part, merge its result into bench.json, and rewrite bench.md. Returns {part: result}."""
    if isinstance(parts, str):
        parts = [parts]
    names = available_parts() if "all" in parts else list(dict.fromkeys(p.replace("-", "_") for p in parts))
    modules = {name: load_part(name) for name in names}       # fail early on a bad name
    out_dir = Path(out_dir)
    done = {}
    for name, module in modules.items():
        log(f"numformer bench {name}{' --quick' if quick else ''} ...")
        t0 = time.perf_counter()
        result = _jsonable(module.run(quick=quick))
        if not isinstance(result, dict):
            raise TypeError(f"numformer.bench.{name}.run() must return a dict, got {type(result).__name__}")
        result[META_KEY] = {"quick": bool(quick), "seconds": round(time.perf_counter() - t0, 1),
                            "date": _dt.datetime.now().isoformat(timespec="seconds"),
                            "command": f"numformer bench {name}{' --quick' if quick else ''}",
                            "machine": machine_info()}
        json.dumps(result)                                     # fail here, not after merging
        results = load_results(out_dir)                        # re-read: another part may have written meanwhile
        results[name] = result
        _atomic_write(out_dir / "bench.json", json.dumps(results, indent=1) + "\n")
        _atomic_write(out_dir / "bench.md", render_markdown(results, out_dir))
        done[name] = result
        log(f"  {name}: {result[META_KEY]['seconds']:.0f} s -> {out_dir / 'bench.json'}, {out_dir / 'bench.md'}")
    return done


__all__ = ["PARTS", "available_parts", "load_part", "run_parts", "render_markdown", "load_results", "image_link",
           "machine_info"]
