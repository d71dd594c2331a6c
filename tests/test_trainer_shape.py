"""A trainer a reader can hold (issue 37): train/trainer.py keeps the loop and the training step, at most 400
lines; the run folder's writing (train/run_writer.py), the evaluations (train/evaluation.py), the end of a run
(train/final.py) and the data-parallel processes (train/workers.py) live beside it; no function of train/, nor
of the rest of the package, is longer than 60 lines (docstring included)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "numformer"
TRAIN = PACKAGE / "train"
MAX_TRAINER_LINES = 400
MAX_FUNCTION_LINES = 60


def test_trainer_py_is_at_most_400_lines():
    lines = len((TRAIN / "trainer.py").read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_TRAINER_LINES, f"train/trainer.py has {lines} lines"


def long_functions(paths):
    """["file:line name (n lines)"] of every function (methods and nested ones too) longer than 60 lines."""
    long = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({n} lines)")
    return long


def test_no_function_of_train_is_over_60_lines():
    assert not long_functions(sorted(TRAIN.glob("*.py")))


def test_no_function_of_the_package_is_over_60_lines():
    """DESIGN.md's rule for the whole of src/numformer (decoding.generate had 66)."""
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 100
    long = long_functions(paths)
    assert not long, long


def test_the_training_step_reads_in_a_few_lines():
    """The step (forward, loss, backward, clip, update) is visible in Trainer._train_step."""
    source = (TRAIN / "trainer.py").read_text(encoding="utf-8")
    step = next(node for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.FunctionDef) and node.name == "_train_step")
    text = ast.get_source_segment(source, step)
    assert step.end_lineno - step.lineno + 1 <= 25
    for call in ("self.task.train_batch(", "loss_and_backward(", "clip_grad_norm(", "self.optimizer.step()",
                 "self.optimizer.zero_grad()", "self.optimizer.set_lr("):
        assert call in text, call
