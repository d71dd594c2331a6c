"""Every expected failure of the CLI is one line `numformer COMMAND: error: ...` and exit code 2, with no
traceback; Ctrl-C exits with 130 quietly; only a bug shows a traceback, with a line asking to report it."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from numformer.cli import main
from numformer.run_files import CHECKPOINT, MODEL

from conftest import mounted_tmpfs, one_error_line, src_env, tiny_copy_toml, tiny_text_toml

TEXT = tiny_text_toml()

COPY = tiny_copy_toml(max_steps=4, batch_size=4, eval_every=2, processes=1)



@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A trained character-level GPT (run folder), trained from a config with a relative data path."""
    from numformer.data.text import read_corpus

    root = tmp_path_factory.mktemp("text")
    (root / "small.txt").write_text(read_corpus("")[:3000])
    (root / "text.toml").write_text(TEXT)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(["train", "text.toml", "--out", "run", "--quiet"]) == 0
    finally:
        os.chdir(cwd)
    return root / "run"


@pytest.fixture
def copy_of(tmp_path):
    """A copy of a run folder to damage."""
    import shutil

    def copy(run):
        dest = tmp_path / "damaged"
        shutil.copytree(run, dest)
        return dest

    return copy


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "copy.toml"
    path.write_text(COPY)
    return path


# -- files that cannot be read ------------------------------------------------------------------------------
@pytest.mark.parametrize("damage,expected", [
    (lambda d: (d / "config.json").write_text('{"model": 5}'), "config.json: a config is a table of sections"),
    (lambda d: (d / "config.json").write_text("[]"), "config.json is damaged (it holds a JSON list, not a run's"),
    (lambda d: (d / "config.json").write_text("{}"), "config.json is damaged (it holds an empty JSON object"),
    (lambda d: (d / "config.json").write_text('{"model": {"type": "gpt"}'), "config.json is not valid JSON"),
    (lambda d: (d / "config.json").write_bytes(b"\xff\xfe{}"), "config.json is not UTF-8 text"),
    (lambda d: (d / "config.json").unlink(), "is not a numformer run folder (no config.json)"),
    (lambda d: (d / "tokenizer.json").write_text('{"type": "char"}'), "tokenizer.json does not fit"),
    (lambda d: (d / "tokenizer.json").write_text("{"), "tokenizer file"),
    (lambda d: (d / "tokenizer.json").write_bytes(b"\xff"), "tokenizer.json is not UTF-8 text"),
    (lambda d: (d / "tokenizer.json").write_text("{}"), "tokenizer.json is damaged (it holds an empty JSON object"),
    (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json is missing: the run's task 'text' keeps"),
    (lambda d: (d / MODEL).write_bytes(b"garbage"), "is corrupt or truncated"),
    (lambda d: [(d / MODEL).unlink(), (d / CHECKPOINT).unlink()], "has no saved weights"),
])
def test_damaged_run_folder(text_run, copy_of, cli_error, damage, expected):
    run = copy_of(text_run)
    damage(run)
    assert expected in cli_error("eval", run)


@pytest.mark.parametrize("command", ["eval", "analyze"])
def test_a_run_that_saved_no_weights_is_named_with_the_fix_that_works(text_run, copy_of, cli_error, command):
    """A run that ended before it saved any weights (killed before its first evaluation or checkpoint): the
    readers say so with the one fix that works (before: eval gave no fix, and analyze advised a --resume that
    needs the missing checkpoint)."""
    run = copy_of(text_run)
    (run / MODEL).unlink()
    (run / CHECKPOINT).unlink()
    assert cli_error(command, run) == (
        f"numformer {command}: error: {run} has no saved weights ({MODEL} or {CHECKPOINT}): its training ended before its first evaluation or "
        f"checkpoint saved any, so --resume cannot continue it either; train it again with `numformer train CONFIG "
        f"--out {run} --overwrite`")


def test_a_folder_of_runs_given_as_a_run_names_the_runs_in_it(text_run, copy_of, cli_error, tmp_path):
    """`numformer eval runs/`: the folder that holds the runs is named as such, with runs to give (before: the
    advice to train one with --out runs/, which scatters a run's files among the others)."""
    runs = tmp_path / "runs"
    runs.mkdir()
    run = copy_of(text_run)
    run.rename(runs / "a")
    assert cli_error("eval", runs) == (f"numformer eval: error: {runs} is not a numformer run folder (no "
                                       f"config.json) but holds run folders: give one of them, e.g. {runs / 'a'}")


def test_a_folder_in_place_of_the_weights_file_is_named(text_run, copy_of, cli_error):
    """A folder named model.safetensors: eval names it (before: it was read as missing, and eval went on with the
    checkpoint's last weights instead of the selected ones), as --resume does before it writes anything."""
    run = copy_of(text_run)
    (run / MODEL).unlink()
    (run / MODEL).mkdir()
    fix = "is not a file; numformer saves a run's weights as a file of that name: remove what is there"
    assert cli_error("eval", run) == f"numformer eval: error: {run / MODEL} {fix}, or put back the file"
    before = sorted(p.name for p in run.iterdir())
    line = cli_error("train", "--resume", "--out", run, "--set", "train.max_steps=100")
    assert line == f"numformer train: error: {run / MODEL} is not a regular file; remove it, or choose another --out"
    assert sorted(p.name for p in run.iterdir()) == before


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_an_empty_folder_is_neither_a_run_nor_a_hugging_face_model(tmp_path, cli_error, command, monkeypatch):
    """generate and chat take both kinds of folder: an empty one is named as neither (it was named a run folder
    to train, as if only runs were taken); a run folder that lost its config.json is still named a run."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert "has no config.json: it is neither a run folder (written by numformer train) nor a Hugging Face model " \
           "folder" in cli_error(command, tmp_path)


@pytest.mark.parametrize("damage,expected", [
    (lambda d: (d / "tokenizer.json").write_text('{"type": "char"}'), "tokenizer.json is damaged"),
    (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json is missing: the run's task 'text' keeps"),
])
def test_damaged_tokenizer_for_generate(text_run, copy_of, cli_error, damage, expected):
    run = copy_of(text_run)
    damage(run)
    assert expected in cli_error("generate", run, "--max-new-tokens", "3")


@pytest.mark.parametrize("command", [
    ("generate", "--prompt", "a", "--max-new-tokens", "3"), ("eval",), ("chat",),
    ("explore", "--static", "x.html", "--prompt", "a", "--max-new-tokens", "3"), ("export", "--out", "hf"),
], ids=lambda command: command[0])
def test_a_tokenizer_json_of_another_vocabulary_size_is_refused(text_run, copy_of, cli_error, command, tmp_path,
                                                                 monkeypatch):
    """An edited tokenizer.json that still parses, but whose vocabulary is not the model's, is named before any
    token is generated or any text encoded (it printed "a", then an id outside the vocabulary)."""
    monkeypatch.chdir(tmp_path)
    run = copy_of(text_run)
    (run / "tokenizer.json").write_text('{"type": "char", "chars": "ab"}', encoding="utf-8")
    line = cli_error(command[0], run, *command[1:])
    assert "tokenizer.json holds a vocabulary of 2 tokens, but the model's vocab_size is " in line
    assert "restore the run's tokenizer.json" in line and not any(tmp_path.glob("[hx]*"))


@pytest.mark.parametrize("template, expected", [
    (None, "the model's context of 16 tokens is too small for numformer's chat format: it needs 18 tokens "
           "before any message; use a model with a longer block_size, or give a shorter template with "
           "--chat-template FILE"),
    ("{{ 'e' * 40 }}", "too small for the chat template: it needs 40 tokens before any message"),
    ("{{ 'x' }}", "numformer chat: error: the chat format cannot be encoded by the model's tokenizer: 1 "
                  "character(s) not in the vocabulary"),
])
def test_a_context_too_small_for_the_chat_format_says_so(text_run, cli_error, tmp_path, monkeypatch, template,
                                                         expected):
    """A model of 16 tokens of context cannot take numformer's built-in chat format (no template was given:
    the error does not ask for a shorter one as if there were) nor a long --chat-template; a template it
    cannot encode says so once, without "the chat format, written in the chat format"."""
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("/quit\n"))
    flags = []
    if template is not None:
        (tmp_path / "t.jinja").write_text(template, encoding="utf-8")
        flags = ["--chat-template", tmp_path / "t.jinja"]
    line = cli_error("chat", text_run, "--max-new-tokens", "5", *flags)
    assert expected in line and line.count("chat format") <= 1


def test_a_chat_template_file_that_is_not_utf8_names_it(text_run, cli_error, tmp_path, monkeypatch):
    """It was "'utf-8' codec can't decode byte 0xff in position 2: invalid start byte", naming neither the file nor
    what to do; [data] chat_template (a chat fine-tuning run's) reads its file the same way."""
    from numformer.data.chat_tasks import chat_format

    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\n"))
    (tmp_path / "t.jinja").write_bytes(b"{{\xff messages }}")
    line = cli_error("chat", text_run, "--max-new-tokens", "2", "--chat-template", tmp_path / "t.jinja")
    assert f"--chat-template {tmp_path / 't.jinja'} is not UTF-8 text (invalid start byte at byte 2); save the " \
           f"template as UTF-8" in line
    with pytest.raises(ValueError, match=r"^\[data\] chat_template .*t.jinja is not UTF-8 text"):
        chat_format(tmp_path / "t.jinja")


@pytest.mark.parametrize("command", ["generate", "chat", "explore"])
def test_a_missing_source_says_how_a_hub_id_is_written(tmp_path, cli_error, command, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = cli_error(command, "HuggingFaceTB/SmolLM2-135M")
    assert "run folder HuggingFaceTB/SmolLM2-135M does not exist (a Hugging Face hub id is written " \
           "hf:HuggingFaceTB/SmolLM2-135M" in line


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_greedy_with_a_sampling_flag_is_one_error(tmp_path, cli_error, command, monkeypatch):
    """--greedy takes the most likely token: a temperature (other than 0), top-k or top-p beside it would be
    ignored without a word, so it is the command's error, before any model is loaded."""
    monkeypatch.chdir(tmp_path)
    line = cli_error(command, "no_such_run", "--greedy", "--temperature", "0.7", "--top-k", "5")
    assert ("--greedy always takes the most likely token, so --temperature and --top-k would do nothing: drop "
            "--greedy to sample, or drop --temperature and --top-k") in line
    assert "--temperature" not in cli_error(command, "no_such_run", "--greedy", "--temperature", "0")


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_missing_run_folder_inside_a_folder_is_not_taken_for_a_hub_id(tmp_path, cli_error, command, monkeypatch):
    """runs/nope, where runs/ exists, is a mistyped run folder: the error does not suggest the hub's hf: form."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    line = cli_error(command, "runs/nope")
    assert "run folder runs/nope does not exist" in line and "hf:" not in line


@pytest.mark.parametrize("command", ["generate", "chat", "explore", "eval", "analyze"])
def test_a_run_config_without_its_model_section_is_not_taken_for_hugging_faces(text_run, copy_of, cli_error,
                                                                               command):
    run = copy_of(text_run)
    config = json.loads((run / "config.json").read_text())
    del config["model"]
    (run / "config.json").write_text(json.dumps(config))
    line = cli_error(command, run)
    assert "config.json" in line and "model" in line and "model_type" not in line


@pytest.mark.parametrize("command", ["export", "eval"])
def test_a_hugging_face_folder_given_for_a_run_is_named_as_one_with_what_to_do(tmp_path, cli_error, command):
    """A Hugging Face model folder where a run folder is expected: one line saying so and what to do (before: a
    wall of "no key of any section (a typo?)", one per config.json field)."""
    folder = tmp_path / "hf_model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                    "hidden_size": 16, "vocab_size": 300}))
    line = cli_error(command, folder, *(["--out", tmp_path / "out"] if command == "export" else []))
    assert line.startswith(f"numformer {command}: error: {folder} is a Hugging Face model folder (its config.json "
                           f"has model_type 'llama'), not a numformer run folder: "), line
    assert f"`numformer import-hf {folder} --out RUN_DIR`" in line and "a typo?" not in line, line
    if command == "export":
        assert "transformers loads it as it is" in line and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,expected", [
    (["eval", "{tmp}/missing"], "run folder {tmp}/missing does not exist"),
    (["eval", "{tmp}/copy.toml"], "{tmp}/copy.toml is a file, not a run folder"),
    (["train", "{tmp}/missing.toml", "--out", "{tmp}/r"], "config file {tmp}/missing.toml does not exist"),
    (["train", "{tmp}", "--out", "{tmp}/r"], "config file {tmp} is a directory"),
    (["train", "{tmp}/bad.toml", "--out", "{tmp}/r"], "config file {tmp}/bad.toml is not UTF-8 text"),
    (["train", "{tmp}/broken.toml", "--out", "{tmp}/r"], "config file {tmp}/broken.toml is not valid TOML"),
    (["params", "{tmp}/bad.toml"], "config file {tmp}/bad.toml is not UTF-8 text"),
    (["train", "{tmp}/copy.toml", "--out", "{tmp}/r", "--resume"], "--resume continues the run in"),
    (["train", "--out", "{tmp}/r", "--resume", "--overwrite"], "give one of them"),
    (["train", "--out", "{tmp}/r"], "give a CONFIG.toml"),
    (["train", "--out", "{tmp}/r", "--resume"], "cannot resume: {tmp}/r/config.json does not exist"),
    (["train", "{tmp}/copy.toml", "--out", "{tmp}/copy.toml/r"], "{tmp}/copy.toml is a file, not a folder"),
    (["train", "{tmp}/copy.toml", "--out", "{tmp}/r", "--set", "train.lr"], "--set expects section.key=value"),
    (["reproduce", "bogus"], "unknown experiment 'bogus'"),
    (["params", "{tmp}/typo.toml"], "unknown section(s) ['modl'] (did you mean 'model'?)"),
    (["params", "{tmp}/train_only.toml"], "[model] needs type, one of ['classifier', 'gpt', 'transformer']"),
    (["exercises", "train", "{tmp}/copy.toml", "--every", "0"], "--every must be at least 1"),
    (["params", "{tmp}/copy.toml", "--depth", "0"], "--depth must be at least 1 (the model's top-level modules)"),
])
def test_bad_arguments_and_files(tmp_path, cfg, cli_error, args, expected):
    (tmp_path / "bad.toml").write_bytes(b"\xff\xfe = 1")
    (tmp_path / "broken.toml").write_text("[model\n")
    (tmp_path / "typo.toml").write_text('[modl]\ntype = "gpt"\n')
    (tmp_path / "train_only.toml").write_text("[train]\nlr = 1e-3\n")
    line = cli_error(*[a.format(tmp=tmp_path) for a in args])
    assert expected.format(tmp=tmp_path) in line


# -- data sets ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["train"])       # params reads no data: tests/test_cli.py
@pytest.mark.parametrize("task,path,expected", [
    ("imdb", "no/such/imdb.tar.gz", "no IMDB data at"),
    ("agnews", "no/such/folder", "no AG News folder at"),
])
def test_missing_data_set(tmp_path, cli_error, monkeypatch, command, task, path, expected):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\ntype = "classifier"\n[data]\ntask = "{task}"\npath = "{path}"\n')
    args = ["--out", tmp_path / "r"] if command == "train" else []
    line = cli_error(command, cfg, *args)
    assert expected in line and str(tmp_path / path) in line       # the resolved path that was read
    assert not (tmp_path / "r").exists()


def test_missing_text_file(tmp_path, cfg, cli_error):
    line = cli_error("train", cfg, "--out", tmp_path / "r", "--set", 'data.task="text"', "--set",
                     'data.path="none.txt"', "--set", "data.length=0")
    assert "[data]" in line      # the task's keys are checked first; then the file:
    cfg.write_text(TEXT.replace("small.txt", "none.txt"))
    assert "none.txt" in cli_error("train", cfg, "--out", tmp_path / "r")


def test_run_folder_stores_the_data_path_resolved(text_run, run_cli, tmp_path, monkeypatch):
    saved = json.loads((text_run / "config.json").read_text())
    assert saved["data"]["path"] == str(text_run.parent / "small.txt")
    monkeypatch.chdir(tmp_path)                                 # another directory: the same file is read
    assert run_cli("eval", text_run)[0] == 0


# -- generate, eval --------------------------------------------------------------------------------------------
SAMPLING_OPTIONS = [["--top-p", "2"], ["--top-k", "0"], ["--temperature", "-1"], ["--temperature", "nan"],
                    ["--max-new-tokens", "-1"], ["--seed", "-1"]]


@pytest.mark.parametrize("option", SAMPLING_OPTIONS)
def test_generate_rejects_options_before_printing(text_run, run_cli, option):
    rc, out, err = run_cli("generate", text_run, "--prompt", "First", *option)
    assert f"error: {option[0]} must be" in one_error_line(rc, err, "generate")     # the flag, by its name
    assert out == ""                                              # not even the prompt


@pytest.mark.parametrize("command", ["chat", "explore"])
@pytest.mark.parametrize("option", SAMPLING_OPTIONS)
def test_chat_and_explore_name_the_bad_sampling_flag(text_run, run_cli, command, option):
    rc, out, err = run_cli(command, text_run, *option)
    assert f"error: {option[0]} must be" in one_error_line(rc, err, command)


@pytest.mark.parametrize("args,command,flag,meant", [
    (["generate", "RUN", "--promt", "x"], "generate", "--promt", "--prompt"),
    (["explore", "RUN", "--statc", "a.html"], "explore", "--statc", "--static"),
    (["exercises", "check", "layer_norm", "a.py", "--hint"], "exercises check", "--hint", None),
    (["generate", "RUN", "--temprature=0.5"], "generate", "--temprature=0.5", "--temperature"),
    (["--verison"], "", "--verison", "--version"),                    # not "arguments are required: COMMAND"
    (["train", "CFG", "--otu", "x"], "train", "--otu", "--out"),        # not only "required: --out"
    (["analyze", "RUN", "--nosuch"], "analyze", "--nosuch", None),      # --src is not close to it
])
def test_an_unknown_flag_is_the_commands_error_with_a_guess(text_run, capsys, args, command, flag, meant):
    with pytest.raises(SystemExit) as exit:
        main([{"RUN": str(text_run), "CFG": str(text_run.parent / "text.toml")}.get(a, a) for a in args])
    err = capsys.readouterr().err
    prog = " ".join(["numformer", command]).strip()
    assert exit.value.code == 2 and err.startswith(f"usage: {prog} ")
    line = err.splitlines()[-1]
    assert line.startswith(f"{prog}: error: unrecognized arguments: {flag}")
    assert (f"did you mean {meant} for {flag}?" in line) if meant else "did you mean" not in line


def test_generate_out_of_memory(text_run, cli_error):
    assert "out of memory" in cli_error("generate", text_run, "--max-new-tokens", str(10 ** 12))


def test_eval_of_a_diverged_run_reports_inf_perplexity(text_run, copy_of, run_cli):
    from safetensors.numpy import load_file, save_file

    run = copy_of(text_run)
    weights = load_file(str(run / MODEL))
    weights = {k: (v * 1e30).astype(v.dtype) if k.endswith("weight") else v for k, v in weights.items()}
    save_file(weights, str(run / MODEL), metadata={"format": "numformer-model-1"})
    rc, out, err = run_cli("eval", run, "--json")
    assert rc == 0, err
    assert json.loads(out)["perplexity"] == float("inf")


def test_training_that_explodes_is_stopped_with_one_line_and_no_numpy_warnings(tmp_path, cfg, run_cli):
    rc, _, err = run_cli("train", cfg, "--out", tmp_path / "r", "--set", "train.lr=1e6", "--set",
                         "train.max_steps=60", "--set", "train.eval_every=100")
    line = one_error_line(rc, err, "train")
    assert "the training loss diverged" in line and "Warning" not in err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["stopped_by"] == "diverged" and "diverged" in summary["error"]


@pytest.mark.parametrize("processes,lr", [(1, "1e6"), (2, "1e6"), (1, "1e308")])
def test_nan_stop_prints_only_its_line(tmp_path, cfg, processes, lr):
    """A real process (warnings go to its stderr, also from data-parallel workers and kernel threads): the NaN
    stop is the one line on stderr, with no NumPy overflow warnings before it (lr = 1e308 overflows in the
    optimizer's update, which printed them)."""
    proc = subprocess.run([sys.executable, "-W", "default", "-m", "numformer.cli", "train", str(cfg), "--out",
                           str(tmp_path / "r"), "--quiet", "--set", f"train.lr={lr}", "--set", "train.max_steps=30",
                           "--set", "model.d_model=64", "--set", f"train.processes={processes}"],
                          capture_output=True, text=True, env=src_env(), timeout=300)
    line = one_error_line(proc.returncode, proc.stderr, "train")
    assert "became nan" in line or "diverged" in line
    assert proc.stderr.strip() == line, proc.stderr


# -- failures inside a command ---------------------------------------------------------------------------------
def test_failed_data_parallel_worker(tmp_path, cfg, cli_error, monkeypatch):
    from numformer.train import parallel

    def dies(self, *a, **k):
        raise parallel.DataParallelError("data-parallel worker 1 exited unexpectedly (exit code -9); was it "
                                         "killed for lack of memory?")

    monkeypatch.setattr(parallel.DataParallel, "forward_backward", dies)
    line = cli_error("train", cfg, "--out", tmp_path / "r", "--set", "train.processes=2", "--quiet")
    assert "worker 1 exited unexpectedly" in line


@pytest.mark.skipif(sys.platform != "linux", reason="data parallelism forks (Linux)")
def test_killed_data_parallel_worker(tmp_path, cfg):
    """A real worker killed with SIGKILL: its (good) message comes as one line, not inside a traceback."""
    cfg.write_text(COPY.replace("max_steps = 4", "max_steps = 1000000\ncheckpoint_every = 1000000")
                   .replace("processes = 1", "processes = 2"))
    proc = subprocess.Popen([sys.executable, "-m", "numformer.cli", "train", str(cfg), "--out", str(tmp_path / "r"),
                             "--quiet"], stderr=subprocess.PIPE, text=True, env=src_env())
    try:
        children, deadline = [], time.monotonic() + 60
        while not children and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            if (tmp_path / "r" / "metrics.jsonl").exists():
                path = f"/proc/{proc.pid}/task/{proc.pid}/children"
                children = [int(c) for c in open(path).read().split()] if os.path.exists(path) else []
        if not children:
            pytest.skip("no data-parallel worker to kill (one usable core?)")
        os.kill(children[0], signal.SIGKILL)
        rc = proc.wait(timeout=60)
        line = one_error_line(rc, proc.stderr.read(), "train")
        assert "exited unexpectedly" in line
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()


@pytest.mark.parametrize("command", ["eval", "analyze", "generate"])
def test_ctrl_c_exits_130_quietly(text_run, run_cli, monkeypatch, command):
    import importlib

    module = importlib.import_module(f"numformer.commands.{command}")

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "run", interrupted)
    monkeypatch.setattr(sys, "argv", ["numformer"])
    from numformer.cli import build_parser

    parser = build_parser()
    args = parser.parse_args([command, str(text_run)])
    assert args.func is interrupted
    rc, out, err = run_cli(command, text_run)
    assert rc == 130 and "Traceback" not in err and "error" not in err


def test_ctrl_c_during_generate_for_real(text_run):
    proc = subprocess.Popen([sys.executable, "-m", "numformer.cli", "generate", str(text_run), "--max-new-tokens",
                             "100000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=src_env())
    try:
        proc.stdout.read(20)                                   # it is generating
        proc.send_signal(signal.SIGINT)
        # read its output while it exits: a full pipe nobody reads would block its last flush (and the test)
        _, err = proc.communicate(timeout=60)
        rc, err = proc.returncode, err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert rc == 130 and "Traceback" not in err


def test_a_reader_that_goes_away_ends_the_command_quietly(text_run):
    """`numformer generate ... | head -c 20`: the closed pipe stops the command with SIGPIPE's exit code 141 and
    nothing on stderr, as other command-line tools."""
    proc = subprocess.Popen([sys.executable, "-m", "numformer.cli", "generate", str(text_run), "--max-new-tokens",
                             "100000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=src_env())
    try:
        proc.stdout.read(20)                                   # it is generating
        proc.stdout.close()                                    # the reader goes away
        err = proc.stderr.read().decode()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()
    assert rc == 141 and err == ""


@pytest.mark.parametrize("error", [OSError(30, "Read-only file system", "/runs/x/metrics.jsonl"),
                                   OSError(13, "Permission denied", "/runs/x"),
                                   MemoryError("Unable to allocate 7.28 TiB")])
def test_system_errors_are_one_line(tmp_path, cfg, cli_error, monkeypatch, error):
    from numformer.train import workers

    def fails(*a, **k):
        raise error

    monkeypatch.setattr(workers, "loss_and_backward", fails)
    line = cli_error("train", cfg, "--out", tmp_path / "r", "--quiet")
    assert {30: "read-only", 13: "permission denied"}.get(getattr(error, "errno", None), "out of memory") in line


def test_read_only_folder(tmp_path, cfg, cli_error):
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m", "cannot mount a read-only tmpfs here (needs root)") as ro:
        assert "read-only" in cli_error("train", cfg, "--out", ro / "run")


def test_a_bug_shows_its_traceback_and_asks_for_a_report(tmp_path, cfg, run_cli, monkeypatch):
    from numformer.train import workers

    def bug(*a, **k):
        return 1 / 0

    monkeypatch.setattr(workers, "loss_and_backward", bug)
    rc, _, err = run_cli("train", cfg, "--out", tmp_path / "r", "--quiet")
    assert rc == 1 and "Traceback" in err and "ZeroDivisionError" in err
    assert err.strip().splitlines()[-1].startswith("numformer train: internal error (ZeroDivisionError): this is "
                                                   "a bug in numformer; please report it")


# -- reproduce and --version ------------------------------------------------------------------------------------
def test_reproduce_refuses_an_existing_run(tmp_path, cfg, cli_error, run_cli):
    runs = tmp_path / "runs"
    assert run_cli("train", cfg, "--out", runs / "copy", "--quiet")[0] == 0
    before = (runs / "copy" / CHECKPOINT).read_bytes()
    line = cli_error("reproduce", "copy", "--quick", "--runs", runs, "--results", tmp_path / "res")
    assert f"{runs / 'copy'} already holds a run (or other files); give --overwrite" in line
    assert (runs / "copy" / CHECKPOINT).read_bytes() == before and not (tmp_path / "res").exists()


def test_reproduce_quick_runs_go_to_their_own_folder(tmp_path, monkeypatch):
    from numformer.commands import reproduce

    seen = {}
    monkeypatch.setattr("numformer.experiments.run_experiment", lambda exp, ctx: seen.setdefault("ctx", ctx) and
                        {"figures": {}, "wall_time_s": 0.0})
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "copy", "--quick", "--quiet"]) is not None
    assert str(seen["ctx"].runs_dir) == os.path.join("runs", "quick")
    assert "shakespeare_char" in reproduce._names()


def test_version(capsys):
    from numformer import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"numformer {__version__}"


def test_resume_with_a_new_schedule_says_so(tmp_path, cfg, run_cli):
    cfg.write_text(COPY.replace("max_steps = 4", "max_steps = 4\nschedule = \"cosine\"\ncheckpoint_every = 2"))
    assert run_cli("train", cfg, "--out", tmp_path / "r", "--quiet", "--set", "train.max_steps=2")[0] == 0
    rc, _, err = run_cli("train", "--out", tmp_path / "r", "--resume", "--set", "train.max_steps=8")
    assert rc == 0 and "note: max_steps 2 -> 8 changes the learning-rate schedule" in err
    assert np.isfinite(json.loads((tmp_path / "r" / "summary.json").read_text())["best_val_loss"])


def test_resume_to_fewer_steps_than_taken_is_refused_and_leaves_the_run(tmp_path, cfg, run_cli, cli_error):
    assert run_cli("train", cfg, "--out", tmp_path / "r", "--quiet")[0] == 0          # 4 steps
    before = {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()}
    line = cli_error("train", "--out", tmp_path / "r", "--resume", "--set", "train.max_steps=2")
    assert "is at step 4, past max_steps = 2: resuming would train nothing" in line
    assert {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()} == before
    assert run_cli("train", "--out", tmp_path / "r", "--resume", "--quiet")[0] == 0    # a finished run: scored again


def test_params_of_a_run_folder(text_run, run_cli, monkeypatch):
    """A run folder's config.json holds the exact sizes: the same count as its config, nothing else read."""
    monkeypatch.chdir(text_run.parent)          # the config's data path is relative to it
    rc, out, err = run_cli("params", text_run)
    assert rc == 0, err
    total = next(line for line in out.splitlines() if line.startswith("total"))
    rc, out_cfg, err = run_cli("params", text_run.parent / "text.toml")
    assert rc == 0, err
    assert total in out_cfg
    line = run_cli("params", text_run, "--set", "model.d_model=8")[2]
    assert "--set applies to a TOML config, not to a run folder" in line


def test_params_of_a_fine_tuning_config(text_run, run_cli, tmp_path):
    """[model] init_from: the source's architecture, counted without reading the data."""
    cfg = tmp_path / "ft.toml"
    cfg.write_text(f'[model]\ninit_from = "{text_run}"\n[data]\ntask = "text"\npath = "no/such.txt"\nblock_size = 8\n')
    rc, out, err = run_cli("params", cfg)
    assert rc == 0, err
    assert "the architecture of init_from" in out
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert total in run_cli("params", text_run)[1]


@pytest.mark.parametrize("model_type,expected", [
    ('type = "gpt"\n', "init_from needs a run of the same model type (gpt)"),
    ("", "task 'text' trains a gpt model, so [model] init_from needs a run of that type"),
])
def test_init_from_a_run_of_another_model_type(tmp_path, cli_error, model_type, expected):
    """A classifier run as the init_from of a GPT config is named as such, whether the config writes
    [model] type or its task decides it (not "[model] needs ['block_size']", nor a type the user never wrote)."""
    source = tmp_path / "cls"
    source.mkdir()
    model = {"type": "classifier", "vocab_size": 8, "n_classes": 2, "max_len": 8, "d_model": 8, "n_heads": 2,
             "n_layers": 1}
    (source / "config.json").write_text(json.dumps({"model": model}), encoding="utf-8")
    cfg = tmp_path / "ft.toml"
    cfg.write_text(f'[model]\n{model_type}init_from = "{source}"\n[data]\ntask = "text"\nblock_size = 8\n',
                   encoding="utf-8")
    line = cli_error("train", cfg, "--out", tmp_path / "out")
    assert "cls holds a classifier model (EncoderClassifier)" in line and expected in line
    assert not (tmp_path / "out").exists()
