"""A task the user registered in a module of their own (issue 36: such a run could not be used by `eval` or
`generate`). docs/reference/data.md's example (its module, its config and its commands) runs as written: the
run records ``[data] task_module`` and every command that reads the run imports it again, in a new process;
a module that cannot be imported is one error line naming it and the fix."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import one_error_line, src_env

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "data.md"
SHORT = ["--set", "train.max_steps=20", "--set", "train.eval_every=10", "--set", "model.n_layers=1"]


def page_blocks():
    """The section's module, config and shell commands, as the page shows them."""
    section = PAGE.read_text(encoding="utf-8").split("## A task of your own (Python)\n", 1)[1].split("\n## ", 1)[0]
    module = re.search(r"```python\n(# my_tasks\.py\n.*?)```", section, re.S)[1]
    config = re.search(r"```toml\n(# echo\.toml\n.*?)```", section, re.S)[1]
    commands = re.search(r"```bash\n(.*?)```", section, re.S)[1].strip().splitlines()
    return module, config, commands


def numformer(args, cwd, env=None):
    """The numformer command as a new user runs it: ``-P`` keeps the current folder off Python's path, as the
    installed ``numformer`` script does."""
    done = subprocess.run([sys.executable, "-P", "-m", "numformer.cli", *args], cwd=cwd, capture_output=True,
                          text=True, env=env or src_env(), timeout=300)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder with the page's my_tasks.py and echo.toml, and runs/echo trained by the page's command."""
    here = tmp_path_factory.mktemp("echo")
    module, config, commands = page_blocks()
    (here / "my_tasks.py").write_text(module, encoding="utf-8")
    (here / "echo.toml").write_text(config, encoding="utf-8")
    train = commands[0].split()[1:]
    assert train == ["train", "echo.toml", "--out", "runs/echo"]
    rc, _, err = numformer(train + SHORT, here)
    assert rc == 0, err
    return here


def test_the_pages_commands_train_evaluate_and_sample_a_registered_task(folder):
    _, _, commands = page_blocks()
    assert json.loads((folder / "runs" / "echo" / "config.json").read_text())["data"]["task_module"] == "my_tasks"
    for command in commands[1:]:
        rc, out, err = numformer(shlex.split(command)[1:], folder)
        assert rc == 0, (command, err)
        assert out.strip()
    rc, out, _ = numformer(["generate", "runs/echo", "--prompt", "face=", "--max-new-tokens", "3", "--greedy"], folder)
    assert rc == 0 and out.startswith("face=")


def test_a_run_read_where_its_module_cannot_be_imported_is_one_line_naming_it(folder, tmp_path):
    rc, _, err = numformer(["eval", folder / "runs" / "echo"], tmp_path)
    line = one_error_line(rc, err, "eval")
    assert "[data] task_module = 'my_tasks' cannot be imported" in line and "PYTHONPATH" in line
    env = {**src_env(), "PYTHONPATH": os.pathsep.join([src_env()["PYTHONPATH"], str(folder)])}
    rc, _, err = numformer(["eval", folder / "runs" / "echo"], tmp_path, env)          # the fix it names
    assert rc == 0, err


def test_a_run_trained_from_python_records_the_tasks_module(folder, tmp_path, monkeypatch):
    from numformer.data.base import TASKS
    from numformer.train import Trainer

    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "my_tasks", raising=False)
    import my_tasks  # noqa: F401  (registers "echo")

    run = tmp_path / "run"
    try:
        Trainer({"data": {"task": "echo"}, "model": {"n_layers": 1, "d_model": 16, "n_heads": 2},
                 "train": {"max_steps": 4, "eval_every": 2, "processes": 1}}, run, quiet=True).train()
    finally:
        TASKS.pop("echo", None)             # other tests find the task through its module only
    assert json.loads((run / "config.json").read_text())["data"]["task_module"] == "my_tasks"
    rc, out, err = numformer(["eval", run], folder)
    assert rc == 0, err


@pytest.mark.parametrize("data, says", [
    ({"task": "echo2"}, "is not a known task; choose one of ["),
    ({"task": "echo2", "task_module": "json"}, "the module 'json' ([data] task_module) registers no task of that name"),
    ({"task": "echo3", "task_module": "no_such_module_here"}, "cannot be imported (ModuleNotFoundError"),
    ({"task": "echo3", "task_module": "my tasks"}, "should be a module name such as"),
])
def test_a_task_that_cannot_be_found_is_one_clear_error(data, says):
    from numformer.config import resolve_config

    with pytest.raises(ValueError, match=re.escape(says)):
        resolve_config({"data": data})
    if "task_module" not in data:
        with pytest.raises(ValueError, match=r"name the module that registers your own task .*\[data\] task_module"):
            resolve_config({"data": data})
