"""What a learner's file may import: NumPy, the standard library, and from numformer only what its stub imports.

The grader compares results only, so a file that imports numformer's own op (``from numformer.ops import
softmax_forward``) would pass without a line of it written. ``refuse_numformer_imports(path, allowed)`` reads the
file's syntax tree before the file runs and raises a ``Failure`` at the first use of numformer that the exercise's
stub does not make itself (``allowed``: dotted names such as "numformer.ops.erf", imported as
``from numformer.ops import erf``): an ``import numformer...`` or ``from numformer... import ...`` statement, a call
given a literal "numformer..." module name (``__import__``, ``importlib``, ``sys.modules.get``, ``pkgutil.resolve_name``
... under any alias), ``sys.modules["numformer..."]``, or ``exec``/``eval``/``compile`` of an import of numformer.
The helper files of the learner's folder that the file imports are read the same way, whether by an import
statement or by name (``__import__("helper")``). A name built at run time is not seen: the check keeps a learner
from passing by accident or shortcut; it is no sandbox.
"""
from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

from .checker import Failure

PACKAGE = "numformer"
RUNS_CODE = ("exec", "eval", "compile")           # builtins that run a string of code
IMPORT_IN_CODE = re.compile(rf"\b(import|from)\s+{PACKAGE}\b")


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
    found = []
    for node in ast.walk(tree):
        what = _numformer_use(node, allowed)
        if what:
            found.append((node.lineno, node.col_offset, node, what))
    return min(found, key=lambda f: f[:2])[2:] if found else (None, None)


def _numformer_use(node, allowed):
    """What ``node`` takes from numformer beyond ``allowed`` (a sentence), or None."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names if names_numformer(a.name)]
        return f"imports {names[0]}" if names else None
    if isinstance(node, ast.ImportFrom) and not node.level and names_numformer(node.module):
        names = [a.name for a in node.names if f"{node.module}.{a.name}" not in allowed]
        return f"imports {', '.join(names)} from {node.module}" if names else None
    if isinstance(node, ast.Call):
        texts = [a.value for a in [*node.args, *(k.value for k in node.keywords)]
                 if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        names = [t for t in texts if names_numformer(t)]
        if names:                                   # any callee: an alias of __import__ or import_module too
            return f"imports {names[0]} by name"
        if _dotted(node.func).split(".")[-1] in RUNS_CODE and any(IMPORT_IN_CODE.search(t) for t in texts):
            return "imports numformer in a string of code it runs"
        return None
    if isinstance(node, ast.Subscript) and _dotted(node.value).endswith("modules"):
        key = node.slice
        if isinstance(key, ast.Constant) and names_numformer(key.value):
            return f"takes {key.value} from the modules loaded"
    return None


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
    modules |= {a.value for n in ast.walk(tree) if isinstance(n, ast.Call) for a in n.args      # __import__("helper")
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.isidentifier()}
    files = []
    for top in sorted({m.split(".")[0] for m in modules}):
        if (root / f"{top}.py").is_file():
            files.append(root / f"{top}.py")
        elif (root / top).is_dir():
            files.extend(sorted((root / top).rglob("*.py")))
    return files
