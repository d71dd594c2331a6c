"""The declared minimum versions, exactly: ``make test-floors`` installs them into a venv of their own.

    python tests/floors.py constraints > floors.txt    # pip constraints: every `name>=X` of pyproject.toml as name==X
    python tests/floors.py check nlp data pytest      # in that venv: the floors of the dependencies, these extras
                                                      # and these packages are what is installed

Every requirement in pyproject.toml (the dependencies and every extra) must carry a lower bound (``>=``)
or an exact pin (``==``); ``constraints`` turns each into ``name==version``, so pip installs the floor
itself (pip then resolves the packages that those need to versions that fit). ``check`` prints, per
package, the floor and the version installed, and fails when they differ or a package is missing.
"""
from __future__ import annotations

import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(>=|==)\s*([0-9][0-9A-Za-z.+-]*)\s*(;.*)?$")


def floors(extras=None):
    """{package: floor version} of the dependencies and the given extras (all extras for None); a name that is
    not an extra selects that one package of any extra (``check nlp pytest``)."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    chosen = optional if extras is None else [e for e in extras if e in optional]
    groups = [project["dependencies"]] + [optional[e] for e in chosen]
    if extras is not None:
        singles = {_normal(e) for e in extras if e not in optional}
        everything = [r for group in optional.values() for r in group]
        groups.append([r for r in everything if REQUIREMENT.match(r) and _normal(REQUIREMENT.match(r).group(1)) in singles])
        unknown = singles - {_normal(REQUIREMENT.match(r).group(1)) for r in groups[-1]}
        if unknown:
            raise SystemExit(f"pyproject.toml declares no {', '.join(sorted(unknown))}")
    out = {}
    for requirement in (r for group in groups for r in group):
        m = REQUIREMENT.match(requirement)
        if m is None:
            raise SystemExit(f"pyproject.toml: {requirement!r} has no lower bound (name>=X) or pin (name==X)")
        name, floor = _normal(m.group(1)), m.group(4)
        if out.get(name, floor) != floor:
            raise SystemExit(f"pyproject.toml: {name} has two floors, {out[name]} and {floor}; make them one")
        out[name] = floor
    return out


def _normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _same(a, b):
    """Versions equal as PEP 440 release numbers (1.26 == 1.26.0); a local label (+cpu) is ignored."""
    def release(v):
        parts = [int(p) for p in re.match(r"[0-9.]+", v.split("+")[0]).group(0).strip(".").split(".")]
        while parts and parts[-1] == 0:
            parts.pop()
        return parts
    return release(a) == release(b)


def main(argv):
    if argv[:1] == ["constraints"]:
        for name, floor in floors().items():
            print(f"{name}=={floor}")
        return 0
    if argv[:1] == ["check"]:
        bad = 0
        print(f"{'package':<18} {'floor':<10} installed")
        for name, floor in floors(argv[1:]).items():
            try:
                installed = version(name)
            except PackageNotFoundError:
                installed = "missing"
            ok = installed != "missing" and _same(installed, floor)
            bad += not ok
            print(f"{name:<18} {floor:<10} {installed}{'' if ok else '   <- not the floor'}")
        return 1 if bad else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
