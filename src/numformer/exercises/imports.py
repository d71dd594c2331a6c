"""What a learner's file may import: NumPy, the standard library, and from numformer only what its stub imports.

The grader compares results only, so a file that imports numformer's own op (``from numformer.ops import
softmax_forward``) would pass without a line of it written. ``refuse_numformer_imports(path, allowed)`` reads the
file's syntax tree before the file runs and raises a ``Failure`` at the first use of numformer that the exercise's
stub does not make itself (``allowed``: dotted names such as "numformer.ops.erf", imported as
``from numformer.ops import erf``): an ``import numformer...`` or ``from numformer... import ...`` statement, or
``__import__``, ``importlib`` or ``sys.modules`` given a literal "numformer..." name. The helper files of the
learner's folder that the file imports are read the same way. A name built at run time is not seen: the check keeps
a learner from passing by accident or shortcut; it is no sandbox.
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from .checker import Failure

PACKAGE = "numformer"
LOOKUPS = ("__import__", "import_module", "find_spec", "reload")   # callables that import a module named by a string


def names_numformer(name):
    """Whether ``name`` is numformer or one of its modules ("numformer", "numformer.ops", ...)."""
    return isinstance(name, str) and (name == PACKAGE or name.startswith(PACKAGE + "."))


def stub_import_lines(allowed):
    """The lines that import ``allowed`` (dotted names), one per module, as the stub writes them."""
    modules = {}
    for dotted in allowed:
        module, name = dotted.rsplit(".", 1)
        modules.setdefault(module, []).append(name)
    return [f"from {module} import {', '.join(sorted(names))}" for module, names in modules.items()]


def refuse_numformer_imports(path, allowed=()):
    """Raise a Failure naming the line where the file ``path`` (or a helper file beside it that it imports) uses
    numformer beyond ``allowed``. A file that does not parse is left to running it, which says where."""
    path = Path(path)
    root, seen, todo = path.resolve().parent, set(), [path]
    while todo:
        current = todo.pop()
        if current.resolve() in seen:
            continue
        seen.add(current.resolve())
        try:
            text = importlib.util.decode_source(current.read_bytes())
            tree = ast.parse(text, str(current))
        except (OSError, SyntaxError, ValueError):
            continue
        node, what = _first_numformer_use(tree, set(allowed))
        if node is not None:
            raise Failure(_message(path, current, text, node, what, allowed))
        todo.extend(_local_files(tree, root))


def _message(path, current, text, node, what, allowed):
    """The refusal: where (the file, the line and its code), what it imports, and what to do instead."""
    code = text.splitlines()[node.lineno - 1].strip()
    code = code if len(code) <= 80 else code[:77] + "..."
    where = f"{path}" if current == path else f"{current} (a file {path.name} imports)"
    given = " or ".join(f"`{line}`" for line in stub_import_lines(allowed))
    return (f"{where}, line {node.lineno}: `{code}` {what}: the check grades the code you write, so it refuses "
            f"numformer's own. Remove that import and write the function yourself with NumPy and the standard "
            f"library" + (f" (from numformer, only what the stub imports: {given})." if given else "."))


def _first_numformer_use(tree, allowed):
    """(node, what it is) of the first use of numformer in ``tree`` outside ``allowed``, or (None, None)."""
    aliases = _importlib_aliases(tree)
    found = []
    for node in ast.walk(tree):
        what = _numformer_use(node, allowed, aliases)
        if what:
            found.append((node.lineno, node.col_offset, node, what))
    return min(found, key=lambda f: f[:2])[2:] if found else (None, None)


def _numformer_use(node, allowed, aliases):
    """What ``node`` takes from numformer beyond ``allowed`` (a sentence), or None."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names if names_numformer(a.name)]
        return f"imports {names[0]}" if names else None
    if isinstance(node, ast.ImportFrom) and not node.level and names_numformer(node.module):
        names = [a.name for a in node.names if f"{node.module}.{a.name}" not in allowed]
        return f"imports {', '.join(names)} from {node.module}" if names else None
    if isinstance(node, ast.Call) and _is_lookup(_dotted(node.func), aliases):
        names = [a.value for a in [*node.args, *(k.value for k in node.keywords)]
                 if isinstance(a, ast.Constant) and names_numformer(a.value)]
        return f"imports {names[0]} by name" if names else None
    if isinstance(node, ast.Subscript) and _dotted(node.value).endswith("modules"):
        key = node.slice
        if isinstance(key, ast.Constant) and names_numformer(key.value):
            return f"takes {key.value} from the modules loaded"
    return None


def _is_lookup(dotted, aliases):
    """Whether a call of ``dotted`` (a callee's dotted name) imports or finds a module named by a string."""
    parts = dotted.split(".")
    return (parts[-1] in LOOKUPS or parts[0] in aliases or dotted in aliases
            or dotted.endswith("modules.get"))


def _importlib_aliases(tree):
    """The names the file binds to importlib or to one of its functions (``import importlib as il``,
    ``from importlib import import_module as load``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "importlib"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "importlib":
            names |= {a.asname or a.name for a in node.names}
    return names


def _dotted(node):
    """``a.b.c`` for an attribute chain on a name, else ""."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def _local_files(tree, root):
    """The learner's own files that ``tree`` imports: ROOT/NAME.py, or every .py file of a package ROOT/NAME/."""
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level and n.module}
    files = []
    for top in sorted({m.split(".")[0] for m in modules}):
        if (root / f"{top}.py").is_file():
            files.append(root / f"{top}.py")
        elif (root / top).is_dir():
            files.extend(sorted((root / top).rglob("*.py")))
    return files
