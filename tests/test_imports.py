"""The import graph of numformer's own modules, read from the source with ``ast`` (nothing is imported).

Imports run one way, as ``LAYERS`` below lists them: (ops, run_files, ...) <- kernels <- nn <- quantize
<- (sampling, decoding, generate) <- (models, lora) <- (data, optim) <- interop <- config <- train
<- (analysis, explorer, experiments, bench, exercises) <- commands <- numformer <- cli. Every import statement
counts, at module level and inside function bodies alike, so a cycle cannot hide in a function. Outside the
CLI (``cli.py``, ``commands/``, which import lazily to keep ``numformer --help`` fast) a function body imports
numformer modules only where ``FUNCTION_IMPORTS_ALLOWED`` says why.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "numformer"

# The layers, lowest first; a module may import its own layer or a lower one (and never in a circle).
LAYERS = [
    ("numformer._runtime", "numformer._limits", "numformer._install", "numformer._platform", "numformer._results", "numformer.keys", "numformer.gradcheck", "numformer.provenance", "numformer.ops",
     "numformer.safetensors_reader", "numformer.safetensors_writer",     # safetensors files, read and written
     "numformer.run_files"),                                             # the run folder's files, read and written
    ("numformer.kernels",),
    ("numformer.nn",),
    ("numformer.quantize",),                                             # int8 layers, built on nn's Linear
    ("numformer.sampling", "numformer.decoding", "numformer.generate"),   # what models' generate() calls
    ("numformer.models", "numformer.lora"),                               # LoRA adapters on a model
    ("numformer.data", "numformer.optim"),
    ("numformer.interop",),                                              # loading any source; Hugging Face, PyTorch
    ("numformer.config",),                                               # [train], and whole configs
    ("numformer.train",),
    ("numformer.analysis", "numformer.explorer", "numformer.experiments", "numformer.bench", "numformer.exercises"),
    ("numformer.commands",),
    ("numformer",),                       # the package itself: the names ``import numformer`` offers
    ("numformer.cli",),
]

# (importing module, imported module): why the import sits in a function body.
FUNCTION_IMPORTS_ALLOWED = {
    ("numformer.experiments.speedrun", "numformer.experiments._torch_anchor"):
        "_torch_anchor imports torch (a test and benchmark dependency) at its top; the other parts run without it",
    ("numformer.bench.throughput", "numformer.bench.torch_reference"):
        "torch_reference imports torch (a test-only dependency) at its top; the benchmark runs without it",
}


def _modules():
    """{dotted name: (path, is_package)} of every module under src/numformer."""
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return mods


def _targets(node, module, is_package, mods):
    """The numformer modules an import statement names (a submodule where ``from X import Y`` names one)."""
    def known(name):
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    if isinstance(node, ast.Import):
        return [known(a.name) for a in node.names if a.name.split(".")[0] == "numformer"]
    if node.level:
        base = module.split(".")[: None if is_package else -1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "numformer":
        return []
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else known(target) for a in node.names]


def import_edges():
    """[(importer, imported, line, in_function)] for every import of a numformer module in src/numformer."""
    mods = _modules()
    edges = []
    for module, (path, is_package) in mods.items():
        def walk(node, in_function):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    edges.extend((module, t, child.lineno, in_function)
                                 for t in _targets(child, module, is_package, mods) if t != module)
                walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
        walk(ast.parse(path.read_text(encoding="utf-8")), False)
    return edges


def cycles(edges):
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    graph = {}
    for a, b, *_ in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer(module):
    """The index in LAYERS of the longest prefix naming ``module``'s layer, or None."""
    best, best_len = None, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = i, len(name)
    return best


def test_the_checks_see_cycles_and_function_imports():
    edges = [("a", "b", 1, False), ("b", "c", 1, True), ("c", "a", 1, True), ("c", "d", 1, False)]
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles(edges[:2]) == []
    found = import_edges()
    assert ("numformer.nn.attention", "numformer.ops") in {(a, b) for a, b, *_ in found}   # `from .. import ops`
    assert any(inside for *_, inside in found)                                          # function bodies counted


def test_no_import_cycle():
    edges = import_edges()
    found = cycles(edges)
    detail = [f"{a} -> {b} (line {line}{', in a function' if inside else ''})"
              for component in found for a, b, line, inside in edges if a in component and b in component]
    assert not found, "import cycle(s) among numformer's modules:\n" + "\n".join(detail)


def test_imports_run_one_way():
    edges = import_edges()
    unplaced = sorted({m for a, b, *_ in edges for m in (a, b) if layer(m) is None})
    assert not unplaced, f"modules in no layer of LAYERS (place them): {unplaced}"
    upward = [f"{a} -> {b} (line {line})" for a, b, line, _ in edges if layer(b) > layer(a)]
    assert not upward, "imports that run up the layers (" + " <- ".join("/".join(n) for n in LAYERS) + "):\n" + \
        "\n".join(upward)


def test_function_body_imports_only_where_allowed():
    lazy_ok = ("numformer.cli", "numformer.commands")
    inside = {(a, b) for a, b, _, in_function in import_edges()
              if in_function and not (a in lazy_ok or a.startswith("numformer.commands."))}
    unexplained = sorted(inside - set(FUNCTION_IMPORTS_ALLOWED))
    assert not unexplained, ("numformer modules imported inside function bodies (import them at the top, or add "
                             f"the pair with its reason to FUNCTION_IMPORTS_ALLOWED): {unexplained}")
    stale = sorted(set(FUNCTION_IMPORTS_ALLOWED) - inside)
    assert not stale, f"FUNCTION_IMPORTS_ALLOWED lists imports that are gone: {stale}"
    assert len(inside) <= 6, "a handful at most"
