"""No traceback from any file or input numformer reads (issue 27, items 7-15): each damaged file is written for
real into a copy of a trained run (or a Hugging Face folder), the command ends with exit code 2 and one line
naming the file, and nothing in the folder changes (a snapshot of every file before and after)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from numformer.cli import main

from conftest import one_error_line, set_metadata, src_env, tiny_copy_toml, tiny_text_toml



def snapshot(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A trained character-level GPT (text run) and a GPT trained on the copy task (symbols run)."""
    from numformer.data.text import read_corpus

    root = tmp_path_factory.mktemp("runs")
    (root / "small.txt").write_text(read_corpus("")[:3000])
    (root / "text.toml").write_text(tiny_text_toml(root / "small.txt", max_steps=6, eval_every=3, checkpoint_every=3))
    (root / "copy.toml").write_text(tiny_copy_toml(max_steps=40, batch_size=8, eval_every=20, processes=1))
    assert main(["train", str(root / "text.toml"), "--out", str(root / "text"), "--quiet"]) == 0
    assert main(["train", str(root / "copy.toml"), "--out", str(root / "copy"), "--quiet"]) == 0
    return root


@pytest.fixture
def damaged(runs, tmp_path):
    """damaged(name) -> a fresh copy of the run ``name`` in tmp_path, to damage."""
    def copy(name="text"):
        dest = tmp_path / f"{name}-copy"
        shutil.copytree(runs / name, dest)
        return dest
    return copy


def fails(run_cli, *args):
    """Run a command that must fail; returns its one error line."""
    rc, _, err = run_cli(*args)
    return one_error_line(rc, err, str(args[0]))


# -- 7: tokenizer.json ---------------------------------------------------------------------------------------
def test_a_damaged_hf_tokenizer_in_a_run_folder(damaged, run_cli):
    run = damaged()
    (run / "tokenizer.json").write_text(json.dumps({"type": "hf", "hf_json": "{not json"}))
    before = snapshot(run)
    line = fails(run_cli, "generate", run, "--max-new-tokens", "3")
    assert f"tokenizer file {run / 'tokenizer.json'} is damaged" in line and "hf_json is not a Hugging Face" in line
    assert snapshot(run) == before


def test_a_garbage_tokenizer_in_a_hugging_face_folder(damaged, run_cli, tmp_path):
    hf = tmp_path / "hf"
    assert run_cli("export", damaged(), "--out", hf)[0] == 0
    (hf / "tokenizer.json").write_text('{"model": {"vocab": {"1": 2, 3: 4}}}')       # not JSON (key 3)
    before = snapshot(hf)
    line = fails(run_cli, "import-hf", hf, "--out", tmp_path / "imported")
    assert f"{hf / 'tokenizer.json'} is not a Hugging Face tokenizer" in line
    assert snapshot(hf) == before and not (tmp_path / "imported").exists()


# -- 8: metrics.jsonl ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [b"[1,2,3]", b"null", b'{"step":"x"}', b"\xff\xfe binary"])
def test_a_damaged_metrics_line_refuses_resume(damaged, run_cli, bad):
    run = damaged()
    lines = (run / "metrics.jsonl").read_bytes().splitlines()
    (run / "metrics.jsonl").write_bytes(b"\n".join(lines[:2] + [bad] + lines[2:]) + b"\n")
    before = snapshot(run)
    line = fails(run_cli, "train", "--out", run, "--resume", "--set", "train.max_steps=9", "--quiet")
    assert f"metrics file {run / 'metrics.jsonl'}, line 3" in line, line
    assert snapshot(run) == before
    assert run_cli("eval", run)[0] == 0                      # the run itself is intact


@pytest.mark.parametrize("newline", [True, False])
def test_a_damaged_last_metrics_line_refuses_resume_unless_cut_short(damaged, run_cli, newline):
    """A complete last line (a newline after it) that is not a record is damage, named as any other line; only
    a last line cut short (no newline: a crash while it was written) is dropped (before: both were dropped)."""
    run = damaged()
    lines = (run / "metrics.jsonl").read_bytes().splitlines()
    (run / "metrics.jsonl").write_bytes(b"".join(line + b"\n" for line in lines) + b"garbage" + b"\n" * newline)
    if newline:
        line = fails(run_cli, "train", "--out", run, "--resume", "--set", "train.max_steps=9", "--quiet")
        assert f"metrics file {run / 'metrics.jsonl'}, line {len(lines) + 1}" in line, line
    else:
        assert run_cli("train", "--out", run, "--resume", "--set", "train.max_steps=9", "--quiet")[0] == 0
        assert b"garbage" not in (run / "metrics.jsonl").read_bytes()


# -- 9: non-UTF-8 arguments and files ------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["generate", "{run}", "--prompt", b"ein \xff mann"],
                                  ["classify", "{run}", b"ein \xff mann"],
                                  ["translate", "{run}", b"ein \xff mann"]])
def test_a_non_utf8_argument(damaged, args):
    run = damaged()
    before = snapshot(run)
    argv = [a if isinstance(a, bytes) else a.format(run=run).encode() for a in args]
    done = subprocess.run([sys.executable.encode(), b"-m", b"numformer.cli", *argv], capture_output=True, env=src_env(),
                          timeout=120)
    line = one_error_line(done.returncode, done.stderr.decode(), args[0])
    assert "is not UTF-8 text (byte 0xff at position 4)" in line
    assert snapshot(run) == before


def test_a_latin1_file_to_translate(damaged, run_cli, tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("ein Mann fährt\n".encode("latin-1"))
    line = fails(run_cli, "translate", damaged(), "--file", latin1)
    assert f"--file {latin1} is not UTF-8 text" in line


# -- 10: safetensors metadata --------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["[1]", "null", "x", "[" * 5000])
def test_damaged_model_config_metadata(damaged, run_cli, value):
    run = damaged()
    set_metadata(run / "model.safetensors", model_config=value)
    before = snapshot(run)
    line = fails(run_cli, "eval", run)
    assert f"model_config metadata of {run / 'model.safetensors'}" in line
    assert snapshot(run) == before


@pytest.mark.parametrize("changes", [{"state": "[]"}, {"state": "{}"}, {"optimizer": "[]"}, {"state": None},
                                     {"optimizer": '{"type": "AdamW", "groups": 5}'}, "no step", "bad rng",
                                     "bad early stopping"])
def test_damaged_checkpoint_metadata_refuses_resume(damaged, run_cli, changes):
    run = damaged()
    path = run / "checkpoint.safetensors"
    if isinstance(changes, str):
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as f:
            state = json.loads(f.metadata()["state"])
        if changes == "no step":
            del state["step"]
        elif changes == "bad rng":
            state["model_rng"] = {"bit_generator": "MT19937", "state": 5}
        else:
            state["early_stopping"]["best"] = "x"
        changes = {"state": json.dumps(state)}
    set_metadata(path, **changes)
    before = snapshot(run)
    line = fails(run_cli, "train", "--out", run, "--resume", "--set", "train.max_steps=9", "--quiet")
    assert f"checkpoint {path}" in line and "cannot be resumed" in line, line
    assert snapshot(run) == before


# -- a config.json that holds no config ---------------------------------------------------------------------
@pytest.mark.parametrize("content, holds", [("{}", "an empty JSON object"), ("[]", "a JSON list")])
@pytest.mark.parametrize("with_checkpoint", [True, False])
def test_an_emptied_config_json_in_a_run_folder_is_named(damaged, run_cli, content, holds, with_checkpoint):
    """A run folder whose config.json holds no config is still a run folder (its checkpoint, metrics, summary):
    one line naming the file and where the config is found again. generate took it for a Hugging Face folder
    ("config.json has no model_type", "... not a Hugging Face config")."""
    from numformer.run_files import checkpoint_config

    run = damaged()
    checkpoint = run / "checkpoint.safetensors"
    recorded = checkpoint_config(checkpoint)["config"]
    if not with_checkpoint:
        checkpoint.unlink()
    (run / "config.json").write_text(content)
    before = snapshot(run)
    again = (f"from the config its checkpoint records (numformer.run_files.checkpoint_config({str(checkpoint)!r})"
             f"['config'], written as JSON)" if with_checkpoint else "train the run again")
    for args in (["generate", run, "--prompt", "The", "--max-new-tokens", "2"], ["eval", run]):
        assert fails(run_cli, *args) == (
            f"numformer {args[0]}: error: config file {run / 'config.json'} is damaged (it holds {holds}, not a "
            f"run's config); restore it from a copy of the run folder, or {again}")
    assert snapshot(run) == before
    if with_checkpoint:         # the advice works: the config the checkpoint records is the run's config.json
        (run / "config.json").write_text(json.dumps(recorded))
        assert run_cli("generate", run, "--prompt", "The", "--max-new-tokens", "2")[0] == 0


# -- 11: deep nesting and size -------------------------------------------------------------------------------
def test_a_deeply_nested_config_json_in_a_run_folder(damaged, run_cli):
    run = damaged()
    (run / "config.json").write_text("[" * 100_000)
    before = snapshot(run)
    for args in (["eval", run], ["train", "--out", run, "--resume"], ["generate", run]):
        line = fails(run_cli, *args)
        assert f"{run / 'config.json'} nests 100,000 levels deep" in line
    assert snapshot(run) == before


def test_a_deeply_nested_config_json_in_a_hugging_face_folder(damaged, run_cli, tmp_path):
    hf = tmp_path / "hf"
    assert run_cli("export", damaged(), "--out", hf)[0] == 0
    (hf / "config.json").write_text('{"model_type": "gpt2", "x": ' + "[" * 100_000)
    before = snapshot(hf)
    for args in (["import-hf", hf, "--out", tmp_path / "imported"], ["generate", hf]):
        line = fails(run_cli, *args)
        assert f"{hf / 'config.json'} nests 100,001 levels deep" in line
    assert snapshot(hf) == before and not (tmp_path / "imported").exists()


def test_a_deeply_nested_toml_value(tmp_path, run_cli, damaged):
    cfg = tmp_path / "deep.toml"
    cfg.write_text(tiny_copy_toml(max_steps=2) + "x = " + "[" * 5000 + "]" * 5000 + "\n")
    line = fails(run_cli, "train", cfg, "--out", tmp_path / "R")
    assert f"config file {cfg} nests 5,00" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.toml"]
    run = damaged()
    before = snapshot(run)
    line = fails(run_cli, "train", "--out", run, "--resume", "--set", "train.lr=" + "[" * 5000)
    assert "--set value" in line and "nests 5,000 levels deep" in line
    assert snapshot(run) == before


# -- 12: generate on a symbol-task run -----------------------------------------------------------------------
def test_generate_on_a_copy_task_run(runs, run_cli):
    rc, out, err = run_cli("generate", runs / "copy", "--prompt", "1 2 3 0 <sep>", "--max-new-tokens", "4",
                           "--greedy")
    assert rc == 0, err
    assert out.startswith("1 2 3 0 <sep>") and len(out.split()) >= 5


# -- 14: library calls ---------------------------------------------------------------------------------------
def test_library_calls_check_their_inputs():
    from numformer import ops
    from numformer.decoding import generate
    from numformer.models import GPT
    from numformer.optim import SGD, AdamW

    model = GPT(vocab_size=10, block_size=8, d_model=8, n_heads=2, n_layers=1)
    for shape in ((0, 3), (2, 0)):
        with pytest.raises(ValueError, match=r"batch >= 1 and seq >= 1, got \(" + f"{shape[0]}, {shape[1]}"):
            model(np.zeros(shape, dtype=np.int64))
    with pytest.raises(ValueError, match="prompt rows have different lengths"):
        generate(model, [[1, 2], [3]], 2)
    with pytest.raises(TypeError, match="targets must be integer class ids, got dtype float64"):
        ops.cross_entropy_forward(np.zeros((2, 3)), np.array([0.0, 1.0]))
    for opt in (AdamW, SGD):
        for lr in (float("nan"), float("inf"), -1.0):
            with pytest.raises(ValueError, match="learning rate must be a finite number >= 0"):
                opt(model.parameters(), lr=lr)
        with pytest.raises(TypeError, match="learning rate must be a number"):
            opt(model.parameters(), lr="0.1")


# -- 15: a classification file with one class ----------------------------------------------------------------
def test_a_classification_file_with_one_class(tmp_path, run_cli):
    data = tmp_path / "one.csv"
    data.write_text("text,label\n" + "".join(f"review number {i},pos\n" for i in range(40)))
    cfg = tmp_path / "cls.toml"
    cfg.write_text(f'[model]\ntype = "classifier"\nn_layers = 1\nn_heads = 2\nd_model = 16\n'
                   f'[data]\ntask = "classification"\npath = "{data}"\n[train]\nmax_steps = 2\n')
    line = fails(run_cli, "train", cfg, "--out", tmp_path / "R")
    assert f"{data}: the label column 'label' holds 1 class ('pos') in all 40 rows" in line
    assert not (tmp_path / "R").exists()


# -- issue 36: a damaged byte-level BPE tokenizer.json of a classification or translation run -----------------
@pytest.fixture(scope="module")
def bpe_runs(tmp_path_factory):
    """A text classifier and a translator trained on the user's own files with tokenizer = "bpe"."""
    pytest.importorskip("tokenizers")
    from test_own_data import labelled_rows, reversal_pairs, train, write_csv

    root = tmp_path_factory.mktemp("bpe_runs")
    write_csv(root / "train.csv", labelled_rows(120))
    train(root, "classifier", {"task": "classification", "path": str(root / "train.csv"), "text_column": "review",
                               "label_column": "topic", "tokenizer": "bpe", "vocab_size": 300, "min_freq": 1,
                               "max_len": 16}, name="classifier")
    src, tgt = reversal_pairs(120)
    (root / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(src, tgt)), encoding="utf-8")
    train(root, "transformer", {"task": "translation", "train": [str(root / "pairs.tsv")], "tokenizer": "bpe",
                                "vocab_size": 300, "min_freq": 1, "max_len": 10}, name="translator")
    return root


@pytest.mark.parametrize("run, command", [
    ("classifier", ["classify", "{run}", "the atom"]), ("classifier", ["eval", "{run}"]),
    ("classifier", ["train", "--out", "{run}", "--resume", "--quiet"]),
    ("translator", ["translate", "{run}", "1 2 3"]), ("translator", ["eval", "{run}"])])
@pytest.mark.parametrize("hf_json", ["cut", "[1, 2]"])
def test_a_damaged_bpe_tokenizer_of_a_classifier_or_translator_is_one_line(bpe_runs, tmp_path, run_cli, run,
                                                                           command, hf_json):
    folder = tmp_path / run
    shutil.copytree(bpe_runs / run, folder)
    state = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    part = state["src"] if run == "translator" else state
    assert part["type"] == "bpe"
    part["hf_json"] = part["hf_json"][:150] if hf_json == "cut" else hf_json
    (folder / "tokenizer.json").write_text(json.dumps(state), encoding="utf-8")
    before = snapshot(folder)
    line = fails(run_cli, *[a.format(run=folder) for a in command])
    assert "tokenizer.json" in line and "damaged" in line and "hf_json" in line
    assert snapshot(folder) == before


@pytest.mark.parametrize("data, says", [
    (b'{"messages": []}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nests 100,000 levels deep"),
    (b'{"messages": "\xff"}\n', r"is not UTF-8 text \(invalid start byte at byte 14\)"),
    (b'{"messages": []}\n{"messages": \n', r", line 2: not valid JSON"),
    (b"[" * 5000 + b"]" * 5000, "nests 5,000 levels deep"),
    (b'[{"messages": [', "is not valid JSON"),
])
def test_a_damaged_chat_or_preference_file_is_one_line_naming_it(tmp_path, data, says):
    """The records of [data] task = "chat" / "preference" (a deep JSON line was a RecursionError, a byte that is
    not UTF-8 the decoder's message without the file)."""
    from numformer.data.chat_tasks import read_records

    path = tmp_path / "chat.jsonl"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=says) as e:
        read_records(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("meta", ['[1]', '{"dtype": "float64"}', '{"dtype": 5}', '"uint16"'])
def test_a_damaged_meta_json_of_token_files_is_one_line_naming_it(tmp_path, meta):
    from numformer.data.token_files import read_tokens_dir

    for name in ("train.bin", "val.bin"):
        (tmp_path / name).write_bytes(b"\x00\x00" * 4)
    (tmp_path / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (tmp_path / "meta.json").write_text(meta)
    with pytest.raises(ValueError, match="must be an object whose \"dtype\" is \"uint16\" or \"uint32\"") as e:
        read_tokens_dir(tmp_path)
    assert str(tmp_path / "meta.json") in str(e.value)
    (tmp_path / "meta.json").unlink()
    (tmp_path / "tokenizer.json").write_text('{"model": [1], "added_tokens": 3}')   # the dtype from a damaged one
    assert read_tokens_dir(tmp_path)[0]["train"].dtype == np.uint16


# -- the class: every parse of JSON, TOML or a safetensors header goes through the bounded readers --------------
# (file, function) -> why its parser call is bounded and named. A call of json/tomllib/pickle/np.load or
# safetensors' safe_open anywhere else fails this test: read the file with numformer._limits (read_json_file,
# bounded_json, check_bounds) or safetensors_reader, or add it here with the reason.
BOUNDED_PARSES = {
    ("_limits.py", "bounded_json"): "the bounded reader: size and depth checked first, errors name the file",
    ("config.py", "load_config"): "check_bounds(toml=True) and the size first; TOML errors name the file",
    ("config.py", "parse_value"): "check_bounds of the --set value first",
    ("safetensors_reader.py", "read_header"): "the header's length and check_bounds first; errors name it",
    ("data/files.py", "json_lines"): "check_bounds over the whole file first; errors name the file and line",
    ("train/run_folder.py", "holds_run"): "at most 1 MB, RecursionError caught: only asks whether it is a run",
    ("commands/chat.py", "template_variables"): "check_bounds of the --template-var value first",
    ("run_files.py", "load_metadata"): "safetensors' own bounded header parser; every error names the file",
    ("experiments/_runs.py", "reusable_run"): "json.loads(json.dumps(config)): a copy in memory, no file",
    ("experiments/speedrun.py", "ladder_configs"): "json.loads(json.dumps(...)): a copy in memory, no file",
    ("experiments/speedrun.py", "run_torch_anchor"): "json.loads(json.dumps(...)): a copy in memory, no file",
    ("bench/mpi.py", "__init__"): "json.loads(json.dumps(config)): a copy in memory, no file",
    ("bench/mpi.py", "_answer"): "a line the benchmark's own child process printed",
    ("bench/_measure.py", "run_child"): "the last line the benchmark's own child process printed",
    ("bench/tokenizer.py", "measure"): "the tokenizers library's serialization of a tokenizer trained in memory",
    ("data/tokenizers/pretrained.py", "token_bytes"): "the tokenizers library's serialization of a tokenizer "
                                                      "already read through hf_json's bounded reader",
}
PARSERS = {("json", "loads"), ("json", "load"), ("tomllib", "loads"), ("tomllib", "load"), ("np", "load"),
           ("numpy", "load"), ("pickle", "loads"), ("pickle", "load")}


def _parser_calls(path):
    import ast

    calls = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in PARSERS
                    or isinstance(f, ast.Name) and f.id in ("safe_open", "load_file")):
                calls.append((function, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, function)
    visit(ast.parse(path.read_text(encoding="utf-8")), "<module>")
    return calls


def test_every_file_parse_goes_through_the_bounded_readers():
    from pathlib import Path

    import numformer

    root = Path(numformer.__file__).parent
    found = {(path.relative_to(root).as_posix(), function): line for path in sorted(root.rglob("*.py"))
             for function, line in _parser_calls(path)}
    unbounded = sorted(f"{p}:{line} in {f}()" for (p, f), line in found.items() if (p, f) not in BOUNDED_PARSES)
    assert not unbounded, f"parsed outside numformer._limits' readers: {unbounded}"
    assert set(BOUNDED_PARSES) <= set(found), sorted(set(BOUNDED_PARSES) - set(found))    # no stale entry


def test_a_deep_template_variable_is_one_line():
    from numformer.commands.chat import template_variables

    assert template_variables(["enable_thinking=false", "name=Ada"]) == {"enable_thinking": False, "name": "Ada"}
    with pytest.raises(ValueError, match="--template-var x nests 5,000 levels deep"):
        template_variables(["x=" + "[" * 5000 + "]" * 5000])
