"""What a new user meets first: a misspelt command or option, a folder that is not a run folder, a copy of a
large weights file, a yes-or-no environment variable, notes of a resumed run that a check then refuses, and
eval of a run whose checkpoint is damaged."""
from __future__ import annotations

import json
import os
import re
import tracemalloc

import numpy as np
import pytest

from numformer import _platform
from numformer.cli import main
from numformer.run_files import CHECKPOINT, MODEL, save_model

from conftest import tiny_copy_toml

COPY = tiny_copy_toml(max_steps=4, batch_size=4, eval_every=2, processes=1)


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    """A trained run folder (the tiny GPT on the copy task) and its config file."""
    root = tmp_path_factory.mktemp("trial")
    (root / "copy.toml").write_text(COPY, encoding="utf-8")
    assert main(["train", str(root / "copy.toml"), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


@pytest.fixture
def damaged_copy(copy_run, tmp_path):
    """A copy of the run folder, to damage."""
    import shutil

    def copy():
        dest = tmp_path / "damaged"
        shutil.copytree(copy_run, dest)
        return dest

    return copy


def _usage_error(capsys, *args):
    """The last stderr line of a command line argparse refuses (exit code 2)."""
    with pytest.raises(SystemExit) as exit:
        main([str(a) for a in args])
    assert exit.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


# -- 1. a misspelt command or option -------------------------------------------------------------------------

@pytest.mark.parametrize("args,expected", [
    (["genrate", "RUN"], "numformer: error: argument COMMAND: invalid choice: 'genrate'; did you mean generate?"),
    (["exercises", "chek"], "invalid choice: 'chek'; did you mean check?"),
    (["eval", "RUN", "--split", "tset"], "invalid choice: 'tset'; did you mean test?"),
])
def test_a_misspelt_command_or_choice_names_the_nearest(capsys, args, expected):
    assert expected in _usage_error(capsys, *args)


def test_a_command_far_from_any_suggests_none(capsys):
    line = _usage_error(capsys, "xyzzy")
    assert "invalid choice: 'xyzzy' (choose from " in line and "did you mean" not in line


def test_an_option_of_other_commands_says_which_rather_than_a_far_guess(capsys, tmp_path):
    line = _usage_error(capsys, "train", tmp_path / "c.toml", "--out", tmp_path / "r", "--quantize", "int8")
    assert line.startswith("numformer train: error: unrecognized arguments: --quantize int8; --quantize is an option "
                           "of "), line
    assert re.search(r"of (\w+, )*generate(, \w+)*, not of train$", line) and "--quiet" not in line, line
    line = _usage_error(capsys, "eval", "RUN", "--max-new-tokens", "3")
    assert re.search(r"--max-new-tokens is an option of (\w+, )*generate(, \w+)*, not of eval$", line), line


def test_a_misspelt_option_of_another_command_names_it_and_where_it_is(capsys):
    line = _usage_error(capsys, "eval", "RUN", "--max-new-tokns", "3")
    assert re.search(r"did you mean --max-new-tokens for --max-new-tokns\? \(an option of (\w+, )*generate"
                     r"(, \w+)*, not of eval\)$", line), line


def test_edit_distance_and_the_nearest_name():
    from numformer.cli import edit_distance, nearest_name

    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("otu", "out") == 1 and edit_distance("ab", "ba") == 1      # a swap is one edit
    assert edit_distance("", "abc") == 3 and edit_distance("same", "same") == 0
    assert nearest_name("--max-new-tokns", ["--max-new-tokens", "--top-k"]) == "--max-new-tokens"
    assert nearest_name("--quantize", ["--quiet", "--out"]) is None      # five edits: not what was meant
    assert nearest_name("evl", ["eval", "export"]) == "eval"


# -- 2. a folder that is not a run folder ---------------------------------------------------------------------

def test_what_is_not_a_run_folder_is_named_with_what_to_give(copy_run, cli_error, tmp_path):
    line = cli_error("eval", tmp_path / "missing")
    assert f"run folder {tmp_path / 'missing'} does not exist; give the folder of a run" in line
    assert "`numformer train CONFIG --out RUN_DIR`" in line and "`numformer import-hf" in line
    config = copy_run.parent / "copy.toml"
    assert (f"{config} is a file, not a run folder; it looks like a config: train it with `numformer train "
            f"{config} --out RUN_DIR`, then give RUN_DIR") in cli_error("eval", config)
    assert (f"{copy_run / MODEL} is a file, not a run folder; give the folder that holds it ({copy_run})"
            in cli_error("eval", copy_run / MODEL))


def test_generate_of_a_missing_source_names_what_it_reads(cli_error, tmp_path):
    line = cli_error("generate", tmp_path / "missing")
    assert line.endswith("does not exist; give a run folder (`numformer train CONFIG --out RUN_DIR` makes one) or "
                         "a Hugging Face model folder"), line


# -- 3. copying a weights file within the run folder ----------------------------------------------------------

def _peak_of(call):
    """(what ``call()`` returned, the most memory it held at once beyond what was there before, in bytes)."""
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_copy_in_folder_streams_the_file(tmp_path):
    from numformer.run_files import COPY_CHUNK, copy_in_folder

    data = np.random.default_rng(0).integers(0, 256, 16 * COPY_CHUNK + 123, dtype=np.uint8).tobytes()
    (tmp_path / "big.bin").write_bytes(data)
    _, peak = _peak_of(lambda: copy_in_folder(tmp_path / "big.bin", tmp_path / "copy.bin"))
    assert (tmp_path / "copy.bin").read_bytes() == data
    assert peak < 3 * COPY_CHUNK, peak
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.bin", "copy.bin"]      # no temporary file left


def test_the_selection_copied_aside_is_never_whole_in_memory(tmp_path):
    """model.safetensors copied aside (RunWriter.save_weights: a selection the last checkpoint records) is
    streamed: before, the whole file was read into memory."""
    from numformer.nn import Linear
    from numformer.train.run_folder import KEPT_SELECTION
    from numformer.train.run_writer import RunWriter

    model = Linear(1024, 4096, rng=0)                     # 16 MiB of weights
    writer = RunWriter.for_new_run(tmp_path / "run")
    try:
        save_model(tmp_path / "run" / MODEL, model, {"step": 2})
        before = (tmp_path / "run" / MODEL).read_bytes()
        writer._checkpoint_selection = (4, 2)             # the last checkpoint (step 4) selected step 2
        config = {"model": {"type": "linear"}, "train": {"dtype": "float32"}}
        _, peak = _peak_of(lambda: writer.save_weights(model, config, step=6))
    finally:
        writer.close()
    assert (tmp_path / "run" / KEPT_SELECTION).read_bytes() == before
    assert peak < len(before) / 4, (peak, len(before))


# -- 4. yes-or-no environment variables ----------------------------------------------------------------------

@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("YES", True), (" on ", True), ("0", False),
                                      ("false", False), ("No", False), ("off", False), ("", False)])
def test_env_flag_reads_yes_and_no_words(monkeypatch, value, on):
    monkeypatch.setenv("NUMFORMER_TEST_FLAG", value)
    assert _platform.env_flag("NUMFORMER_TEST_FLAG") is on


def test_env_flag_unset_is_off_and_another_word_is_an_error(monkeypatch):
    monkeypatch.delenv("NUMFORMER_TEST_FLAG", raising=False)
    assert _platform.env_flag("NUMFORMER_TEST_FLAG") is False
    monkeypatch.setenv("NUMFORMER_TEST_FLAG", "maybe")
    with pytest.raises(ValueError, match=r"^environment variable NUMFORMER_TEST_FLAG='maybe' is neither on nor "
                                         r"off: set it to 1 \(or true, yes, on\) or to 0"):
        _platform.env_flag("NUMFORMER_TEST_FLAG")


@pytest.mark.parametrize("value", ["false", "no", "off", "0"])
def test_no_memory_check_set_to_an_off_word_leaves_the_check_on(monkeypatch, value):
    """Before, any value but "" or "0" (false, no, off) switched the check off."""
    monkeypatch.setattr(_platform, "available_memory", lambda: 2 ** 30)
    monkeypatch.setenv(_platform.NO_MEMORY_CHECK, value)
    with pytest.raises(ValueError, match="needs about 4.0 GiB of memory"):
        _platform.check_memory("a model", 4 * 2 ** 30, "its weights")
    monkeypatch.setenv(_platform.NO_MEMORY_CHECK, "true")
    _platform.check_memory("a model", 4 * 2 ** 30, "its weights")
    monkeypatch.setenv(_platform.NO_MEMORY_CHECK, "nope")
    with pytest.raises(ValueError, match="NUMFORMER_NO_MEMORY_CHECK='nope' is neither on nor off"):
        _platform.check_memory("a model", 1, "its weights")


# -- 5. the notes of a resumed run come after its checks ----------------------------------------------------

def _flip_last_tensor_byte(path):
    with open(path, "r+b") as f:
        f.seek(-5, os.SEEK_END)
        byte = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_resume_refused_by_a_check_prints_no_note_of_its_changes(damaged_copy, run_cli):
    run = damaged_copy()
    _flip_last_tensor_byte(run / CHECKPOINT)            # the header is intact: the checksum is checked on loading
    rc, _, err = run_cli("train", "--resume", "--out", run, "--set", "train.max_steps=8")
    assert rc == 2 and "is corrupt: its tensors' bytes changed" in err, err
    assert "note:" not in err and "max_steps" not in err, err


def test_a_resume_that_passes_its_checks_still_prints_its_notes(damaged_copy, run_cli):
    rc, _, err = run_cli("train", "--resume", "--out", damaged_copy(), "--set", "train.max_steps=6")
    assert rc == 0 and "note: max_steps 4 -> 6" in err, err


# -- 6. eval of a run whose checkpoint is damaged -------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 100])
def test_eval_reads_model_safetensors_when_the_checkpoint_is_unreadable(copy_run, damaged_copy, run_cli, size):
    rc, intact, _ = run_cli("eval", copy_run, "--json")
    assert rc == 0
    run = damaged_copy()
    os.truncate(run / CHECKPOINT, size)
    rc, out, err = run_cli("eval", run, "--json")
    assert rc == 0, err
    assert {k: v for k, v in json.loads(out).items()} == json.loads(intact)
    notes = [line for line in err.splitlines() if line]
    assert len(notes) == 1 and notes[0].startswith(f"note: checkpoint {run / CHECKPOINT} is corrupt or truncated")
    assert f"evaluating {run / MODEL} instead" in notes[0], notes


def test_eval_reads_model_safetensors_when_the_checkpoint_s_config_is_damaged(copy_run, damaged_copy, run_cli,
                                                                               monkeypatch):
    """A checkpoint whose bytes read but whose recorded config fails the checks is as unusable to compare with
    as a truncated one: eval evaluates model.safetensors with the note."""
    from numformer.train import run as run_module

    rc, intact, _ = run_cli("eval", copy_run, "--json")
    run = damaged_copy()

    def refuse(config, what):
        raise ValueError(f"{what}: [train] lr = -1 must be > 0")
    monkeypatch.setattr(run_module, "check_saved_config", refuse)
    rc, out, err = run_cli("eval", run, "--json")
    assert rc == 0, err
    assert json.loads(out) == json.loads(intact)
    assert err.strip() == (f"note: checkpoint {run / CHECKPOINT} is damaged (its config metadata: [train] lr = -1 "
                           f"must be > 0); evaluating {run / MODEL} instead (--resume needs the checkpoint restored)")


@pytest.mark.parametrize("model_file", ["missing", "truncated"])
def test_eval_with_neither_weights_file_usable_is_one_error(damaged_copy, cli_error, model_file):
    run = damaged_copy()
    os.truncate(run / CHECKPOINT, 100)
    if model_file == "missing":
        (run / MODEL).unlink()
    else:
        os.truncate(run / MODEL, 100)
    line = cli_error("eval", run)
    assert f"{run} has no weights to evaluate: checkpoint {run / CHECKPOINT} is corrupt or truncated" in line
    assert (f"there is no {MODEL}" if model_file == "missing" else f"model file {run / MODEL} is corrupt") in line
    assert line.endswith("restore a copy of either file, or retrain"), line
