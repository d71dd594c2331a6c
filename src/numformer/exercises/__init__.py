"""Exercises a learner writes and numformer grades: ``numformer exercises list|start|check|hint|train``.

An exercise is an op of ``numformer.ops`` to write from its equation (``numformer exercises start layer_norm``
writes a stub with the signature, the docstring with shapes and the equation, and TODOs). The learner's file
defines the same functions with the same signatures as the reference; ``check`` grades them step by step
against the reference (``checker``), after refusing, before it runs, a file that imports numformer's own code
beyond what its stub imports (``imports``); ``hint`` gives the next hint, and ``train`` plugs every op that passes
into a GPT through the dispatch table and compares its loss curve with the library's (``training``).

Adding an exercise: one module in ``catalog/`` defining ``EXERCISE`` and one line in ``catalog.EXERCISES``.
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import textwrap
import traceback
from pathlib import Path

from .._limits import read_json_file
from ..keys import did_you_mean
from .catalog import EXERCISES
from .checker import STANDARD_STEPS, Exercise, Failure, Report, check
from .imports import refuse_numformer_imports, stub_import_lines

HINTS_FILE = ".numformer-exercises.json"      # which hints were shown, in the learner's folder
WIDTH = 88                                     # the commands' output is wrapped at this width
# the helpers of numformer some stub imports (``exercises train`` loads a file before it knows its exercises)
ANY_STUBS_IMPORTS = tuple(sorted({name for e in EXERCISES.values() for name in e.allowed_imports}))


def wrap(text, indent=""):
    """``text`` wrapped at WIDTH, paragraph by paragraph (its lines), continuation lines indented 2 more."""
    return "\n".join(textwrap.fill(line, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                                    break_on_hyphens=False, break_long_words=False)
                      for line in text.splitlines())


def get(name):
    """The exercise called ``name``; a ValueError naming the exercises otherwise."""
    try:
        return EXERCISES[name]
    except KeyError:
        raise ValueError(f"no exercise {name!r}{did_you_mean(name, EXERCISES)}; `numformer exercises list` shows "
                         f"them: {', '.join(EXERCISES)}") from None


def refuse_folder(path, exercise=None):
    """A ValueError when ``path`` is a folder, not the learner's .py file: it names the file meant (that of
    ``exercise``, where known)."""
    if Path(path).is_dir():
        example = f" (e.g. {Path(path) / f'{exercise}.py'})" if exercise else ""
        raise ValueError(f"{path} is a folder; give the .py file of your solution{example}")


def load_functions(path, allowed_imports=ANY_STUBS_IMPORTS):
    """The names a learner's file defines, after running it as a module (its folder on sys.path, so that it may
    import a helper file beside it). A file that does not run raises a Failure saying where; so does, before it
    runs, a file that imports numformer beyond ``allowed_imports`` (its exercise's ``allowed_imports``)."""
    path = Path(path)
    refuse_folder(path)
    if not path.is_file():
        raise FileNotFoundError(2, "no such file", str(path))
    name = f"_numformer_exercise_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:                # Python makes a module of a .py file only
        raise Failure(f"{path} is not a Python file: give the .py file with your functions (`numformer exercises "
                      f"start NAME` writes NAME.py)")
    refuse_numformer_imports(path, allowed_imports)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise Failure(f"{path} is not valid Python: {e.msg} at line {e.lineno}") from None
    except Exception as e:          # noqa: BLE001 -- whatever the learner's file raises, say where
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path.resolve()]
        where = f" at line {frames[-1].lineno}: {frames[-1].line}" if frames else ""
        raise Failure(f"{path} does not run: {type(e).__name__}: {e}{where}") from None
    finally:
        sys.path.remove(str(path.resolve().parent))
        sys.modules.pop(name, None)
    return vars(module)


def check_file(name, path):
    """Grade the learner's file ``path`` on exercise ``name``: a ``Report``."""
    exercise = get(name)
    refuse_folder(path, exercise.name)
    try:
        functions = load_functions(path, exercise.allowed_imports)
    except Failure as failure:
        return Report(exercise.name, failed=STANDARD_STEPS[0].title, message=str(failure))
    return check(exercise, functions)


def format_report(report, path):
    """The report as the command prints it: one line per step run, the failure's message indented."""
    exercise = EXERCISES[report.exercise]
    steps = exercise.steps or STANDARD_STEPS
    width = max(len(s.title) for s in steps) + 4
    lines = [f"{exercise.name}: checking {path}"]
    for n, step in enumerate(steps, 1):
        if step.title in report.passed:
            lines.append(f"  {n}. {step.title} ".ljust(width + 6, ".") + " ok")
        elif step.title == report.failed:
            lines.append(f"  {n}. {step.title} ".ljust(width + 6, ".") + " FAILED")
            lines.append(wrap(report.message, "     "))
            break
    if report.ok and exercise.in_model:
        llama = exercise.model == "llama"
        lines.append(wrap(f"{exercise.name} passes every step: it equals numformer's reference to 1e-10. Plug it "
                          f"into a {'Llama-style ' if llama else ''}GPT: numformer exercises train {path}"
                          + (" --model llama" if llama else "")))
    elif report.ok and exercise.route:
        lines.append(wrap(f"{exercise.name} passes every step: it equals numformer's reference to 1e-10. Plug it "
                          f"into a GPT that calls it: numformer exercises train {path} --set {exercise.route}"))
    elif report.ok:
        lines.append(wrap(f"{exercise.name} passes every step: it computes what numformer's reference computes."))
    else:
        lines.append(wrap(f"Stuck? `numformer exercises hint {exercise.name}` gives a hint at a time; the "
                          f"derivation is in docs/{exercise.page}."))
    return "\n".join(lines)


def stub_text(exercise):
    """The file ``start`` writes: the signatures, the docstrings with shapes and equations, and TODOs."""
    compared = "outputs and gradients with numformer's, in float64" if exercise.grads else "results with numformer's"
    header = textwrap.dedent(f'''\
        """numformer exercise {exercise.name}:
        {exercise.summary}.

        Write the functions below from their docstrings, then grade them:

            numformer exercises check {exercise.name} {exercise.name}.py

        `numformer exercises hint {exercise.name}` gives a hint at a time. The derivation is in
        the docs: docs/{exercise.page}.
        Your file may import NumPy and the standard library, and from numformer only what
        this stub imports: the check refuses a file that imports numformer's own code. It
        compares your functions' {compared}.
        """
        import numpy as np
        ''')
    given = stub_import_lines(exercise.allowed_imports)
    parts = [header] + (["# given by the exercise: the one import of numformer it allows\n"] if given else []) + \
        [line + "\n" for line in given]
    references = exercise.reference_functions()
    for function in exercise.functions:
        body = [f'"""{function.doc}\n"""'] + [wrap(f"# TODO: {todo}").replace("\n  ", "\n#   ") for todo in function.todos]
        body.append(f'raise NotImplementedError("{function.name}")')
        parts.append(f"\n\n{_def_line(function.name, inspect.signature(references[function.name]))}\n"
                     + textwrap.indent("\n".join(body), "    ") + "\n")
    return "".join(parts)


def _def_line(name, signature):
    """``def name(parameters):``, the parameters wrapped under the first one at WIDTH columns."""
    head, params = f"def {name}(", [str(p) for p in signature.parameters.values()]
    lines, line = [], head
    for n, param in enumerate(params):
        piece = param + ("," if n < len(params) - 1 else "):")
        if len(line) + len(piece) + 1 > WIDTH and line.strip() != head.strip():
            lines.append(line.rstrip())
            line = " " * len(head)
        line += piece + " "
    return "\n".join(lines + [line.rstrip()])


def write_stub(name, folder, overwrite=False):
    """Write the stub of exercise ``name`` to folder/NAME.py (a file already there is kept unless
    ``overwrite``); returns its path."""
    exercise = get(name)
    folder = Path(folder)
    path = folder / f"{exercise.name}.py"
    if path.exists() and not overwrite:
        raise ValueError(f"{path} exists (your work so far?); check it with `numformer exercises check "
                         f"{exercise.name} {path}`, or start again with --overwrite")
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(stub_text(exercise), encoding="utf-8")
    return path


def next_hint(name, folder="."):
    """(number, count, text) of the next hint of exercise ``name``, remembered in folder/.numformer-exercises.json
    (after the last hint, the last one again)."""
    exercise = get(name)
    state_path = Path(folder) / HINTS_FILE
    try:        # within the bounds of every JSON file numformer reads; a damaged memory starts the hints again
        state = read_json_file(state_path, "hint memory") if state_path.exists() else {}
    except ValueError:
        state = {}
    state = state if isinstance(state, dict) else {}
    seen = state.get("hints_seen") if isinstance(state.get("hints_seen"), dict) else {}
    count = seen.get(exercise.name, 0)
    count = count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else 0
    number = min(count + 1, len(exercise.hints))
    seen[exercise.name] = number
    state_path.parent.mkdir(parents=True, exist_ok=True)       # as `start --dir` makes its folder
    state_path.write_text(json.dumps({**state, "hints_seen": seen}, indent=1) + "\n", encoding="utf-8")
    return number, len(exercise.hints), exercise.hints[number - 1]


__all__ = ["EXERCISES", "wrap", "Exercise", "Report", "check", "check_file", "format_report", "get", "load_functions",
           "next_hint", "stub_text", "write_stub"]
