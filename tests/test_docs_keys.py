"""Lists of config keys on the documentation pages are checked against the code's key tables, so that they
cannot go stale (issue 36: training.md's list of valid [model] keys lacked four of them):

- training.md's example errors are what ``numformer train`` prints for them (the list of valid [model] keys
  included), and its [train] table has a row for every key of ``config._train_keys``;
- run-folder.md names exactly the [train] keys ``--resume --set`` refuses (``config.RESUME_REFUSED``), and the
  keys of [model], [data] and [lora] it may change (``config.RESUMABLE``).

After a change of the keys, ``python tests/test_docs_keys.py --write`` rewrites training.md's example errors
from what the command prints now."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINING = ROOT / "docs" / "reference" / "training.md"
RUN_FOLDER = ROOT / "docs" / "reference" / "run-folder.md"
ERRORS = re.compile(r"```text\n(\$ numformer train .*?)```", re.S)
WIDTH = 88                  # the longest code line of a page (tests/test_docs_style.py)


def example_errors(page):
    """(command, the output the page shows) for each ``$ numformer train`` line of the page's error example."""
    block = ERRORS.search(page)[1]
    pairs = re.findall(r"^\$ (numformer .*)\n((?:(?!\$ ).*\n)*)", block, flags=re.M)
    return [(command, " ".join(output.split())) for command, output in pairs]


def printed_error(command, tmp):
    """What ``command`` prints on stderr, run in the repository (its --out moved under ``tmp``: nothing is
    written, the config is refused first)."""
    from numformer.cli import main

    args = shlex.split(command)[1:]
    args[args.index("--out") + 1] = str(Path(tmp) / "x")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.chdir(ROOT):
        assert main(args) == 2
    return err.getvalue().strip()


def test_the_example_errors_are_what_the_command_prints(tmp_path):
    pairs = example_errors(TRAINING.read_text(encoding="utf-8"))
    assert len(pairs) == 2
    for command, shown in pairs:
        assert shown == " ".join(printed_error(command, tmp_path).split()), (
            f"{command}: run `python tests/test_docs_keys.py --write` to update training.md")


def test_the_valid_model_keys_shown_are_the_gpts():
    from numformer.config import _model_defaults

    shown = example_errors(TRAINING.read_text(encoding="utf-8"))[0][1]
    listed = re.search(r"valid keys: \[(.*)\]", shown)[1]
    assert sorted(re.findall(r"'(\w+)'", listed)) == sorted(_model_defaults("gpt"))


def test_the_train_table_has_a_row_for_every_train_key():
    from numformer.config import _train_keys

    page = TRAINING.read_text(encoding="utf-8")
    table = page.split("## `[train]` keys", 1)[1].split("\n\n| key |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines()[2:]]
    documented = {key for row in rows for key in re.findall(r"`(\w+)`", row)}
    assert documented == set(_train_keys())


def test_run_folder_md_names_the_keys_resume_refuses():
    from numformer.config import RESUME_REFUSED, _train_keys

    page = " ".join(RUN_FOLDER.read_text(encoding="utf-8").split())
    refused = page.split("Refused, because the checkpoint was made with them:", 1)[1].split("For example", 1)[0]
    named = {k for k in re.findall(r"`(\w+)`", refused) if k in _train_keys()}
    assert named == set(RESUME_REFUSED) | {"budget_minutes"}        # budget_minutes: turned on or off


def test_run_folder_md_names_the_keys_resume_may_change_in_the_other_sections():
    from numformer.config import RESUMABLE

    page = " ".join(RUN_FOLDER.read_text(encoding="utf-8").split())
    for section, keys in RESUMABLE.items():
        listed = page.split(f"in `[{section}]` ", 1)[1].split("(", 1)[1].split(")", 1)[0]
        assert re.findall(r"`(\w+)`", listed) == list(keys), section


def write():
    """Rewrite training.md's example errors with what the command prints now."""
    import tempfile

    page = TRAINING.read_text(encoding="utf-8")
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for command, _ in example_errors(page):
            lines += [f"$ {command}", *textwrap.wrap(printed_error(command, tmp), WIDTH, break_long_words=False,
                                                     break_on_hyphens=False)]
    old = ERRORS.search(page)[1]
    TRAINING.write_text(page.replace(old, "\n".join(lines) + "\n"), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.exit("usage: python tests/test_docs_keys.py --write")
