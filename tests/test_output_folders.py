"""Every folder numformer writes is written only when it is new or empty, or with --overwrite (issue 36): run
folders, an experiment's run folders (per seed, per row, beside it), export folders and results folders. An
overwritten export folder holds only the new export's files. Each refusal is one line and changes nothing."""
from __future__ import annotations

import hashlib
import json

import pytest

from conftest import hf_bpe_folder, one_error_line, set_commit, tiny_text_toml


def snapshot(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -- export --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """An imported run whose tokenizer has a Hugging Face form (its export writes tokenizer.json and
    tokenizer_config.json) and a character-level run (its export writes neither)."""
    pytest.importorskip("tokenizers")
    from numformer.cli import main
    from numformer.data.text import read_corpus

    root = tmp_path_factory.mktemp("export")
    text = read_corpus("")[:3000]
    (root / "small.txt").write_text(text)
    hf = root / "hf"
    hf_bpe_folder(hf, text)
    assert main(["import-hf", str(hf), "--out", str(root / "bpe"), "--data", str(root / "small.txt")]) == 0
    (root / "char.toml").write_text(tiny_text_toml(root / "small.txt", max_steps=2))
    assert main(["train", str(root / "char.toml"), "--out", str(root / "char"), "--quiet"]) == 0
    return root / "bpe", root / "char"


def test_export_writes_only_files_it_declares(two_runs, tmp_path, run_cli):
    from numformer.commands.export import EXPORT_FILES

    bpe, char = two_runs
    for run in (bpe, char):
        out = tmp_path / run.name
        assert run_cli("export", run, "--out", out)[0] == 0
        assert {p.name for p in out.iterdir()} <= set(EXPORT_FILES)
    assert {p.name for p in (tmp_path / "bpe").iterdir()} == {"config.json", "model.safetensors", "tokenizer.json",
                                                             "tokenizer_config.json"}


def test_a_refused_export_leaves_no_folder_of_its_own_making(two_runs, tmp_path, run_cli, monkeypatch):
    import numformer.interop.hf as hf

    def refuse(*args, **kwargs):
        raise ValueError("this model cannot be written")
    monkeypatch.setattr(hf, "export_hf", refuse)
    _, char = two_runs
    rc, _, err = run_cli("export", char, "--out", tmp_path / "new" / "deeper")
    assert "cannot be written" in one_error_line(rc, err, "export")
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()                         # a folder the user made stays
    rc, _, err = run_cli("export", char, "--out", tmp_path / "mine")
    assert rc == 2 and (tmp_path / "mine").is_dir()


def test_a_lora_export_is_replaced_whole_and_refused_when_its_base_holds_another_file(two_runs, tmp_path, run_cli):
    """--overwrite over a LoRA export (the adapter in DIR, its base model in DIR/base) removes only its files;
    a file numformer did not write, also inside base/, is refused before anything is removed."""
    bpe, char = two_runs
    out = tmp_path / "E"
    out.mkdir()
    (out / "base").mkdir()
    for name in ("config.json", "model.safetensors"):
        (out / "base" / name).write_text("{}")
    for name in ADAPTER_FILES:
        (out / name).write_text("{}")
    (out / "base" / "notes.txt").write_text("mine")
    rc, _, err = run_cli("export", char, "--out", out, "--overwrite")
    assert rc == 2 and "base/notes.txt" in one_error_line(rc, err, "export")
    assert (out / "base" / "config.json").is_file() and (out / "adapter_config.json").is_file()   # nothing removed
    (out / "base" / "notes.txt").unlink()
    assert run_cli("export", char, "--out", out, "--overwrite")[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")     # a LoRA run's export (test_peft)


def test_an_overwritten_export_holds_only_the_new_exports_files(two_runs, tmp_path, run_cli):
    bpe, char = two_runs
    out = tmp_path / "E"
    assert run_cli("export", bpe, "--out", out)[0] == 0
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    (out / ".config.json.123.abcd.tmp").write_bytes(b"{")           # a write of an earlier export cut short
    assert run_cli("export", char, "--out", out, "--overwrite")[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    # generate no longer finds the first export's tokenizer: it cannot encode text with the wrong one
    rc, _, err = run_cli("generate", out, "--prompt", "The", "--max-new-tokens", "2")
    assert rc == 2 and "tokenizer" in one_error_line(rc, err, "generate")


def test_export_refuses_a_non_empty_folder_without_overwrite(two_runs, tmp_path, run_cli):
    bpe, char = two_runs
    out = tmp_path / "E"
    assert run_cli("export", bpe, "--out", out)[0] == 0
    before = snapshot(out)
    rc, _, err = run_cli("export", char, "--out", out)
    assert "is not empty" in one_error_line(rc, err, "export") and snapshot(out) == before


@pytest.mark.parametrize("foreign", ["README.md", "sub/notes.txt", "pytorch_model.bin",
                                     "additional_chat_templates/notes.txt", "base/README.md"])
def test_export_overwrite_refuses_files_it_did_not_write(two_runs, tmp_path, run_cli, foreign):
    bpe, char = two_runs
    out = tmp_path / "E"
    assert run_cli("export", bpe, "--out", out)[0] == 0
    (out / foreign).parent.mkdir(exist_ok=True)
    (out / foreign).write_text("the user's")
    before = snapshot(out)
    rc, _, err = run_cli("export", char, "--out", out, "--overwrite")
    line = one_error_line(rc, err, "export")
    assert foreign.split("/")[0] in line and "does not write" in line
    assert snapshot(out) == before


# -- the run folders of an experiment ------------------------------------------------------------------------
@pytest.fixture
def fake_clock(fake_clock):
    """conftest's fake clock, ticking 50 ms a call: the quick speedrun's budget passes in few steps."""
    fake_clock.tick = 0.05
    return fake_clock


@pytest.fixture
def commit(monkeypatch):
    """Set the git commit numformer records and compares (``commit("abc")``), the same in every module."""
    set_commit(monkeypatch, "abc1234")
    return lambda value: set_commit(monkeypatch, value)


def reproduce(tmp_path, name, *args):
    """(exit code, stderr) of ``numformer reproduce NAME --quick`` into tmp_path/runs and tmp_path/results."""
    import contextlib
    import io

    from numformer.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["reproduce", name, "--quick", "--runs", str(tmp_path / "runs"), "--results",
                   str(tmp_path / "results"), "--quiet", *map(str, args)])
    return rc, err.getvalue()


def run_folders(runs):
    return {p.parent for p in runs.rglob("config.json")}


SHORT = "train.budget_minutes=0.05"      # the quick speedrun's budget, shorter: 3 s on the fake clock
# One experiment of each way of writing run folders: runs/NAME; a run beside it (parity's baseline); a seed
# study (runs/NAME_seeds/seed_K); the speedrun's seeds; the ablation's rows (a folder per config and seed);
# a custom pipeline of eight runs.
EXPERIMENTS = [("copy", ()), ("parity", ()), ("shakespeare_char", ("--seeds", 2)),
               ("shakespeare_speedrun", ("--seeds", 2, "--set", SHORT)),
               ("shakespeare_speedrun_ablation", ("--seeds", 2)),
               ("positional", ())]


@pytest.mark.parametrize("name, args", EXPERIMENTS, ids=[e[0] for e in EXPERIMENTS])
def test_every_run_folder_of_an_experiment_is_checked_before_anything_trains(tmp_path, fake_clock, commit, name,
                                                                             args):
    from numformer.experiments import Context, resolve
    from numformer.experiments.runner import planned_runs

    runs = tmp_path / "runs"
    (exp,) = resolve(name)
    seeds = int(args[1]) if args else 0
    planned = [folder for folder, _ in planned_runs(exp, Context(runs, tmp_path / "results", quick=True,
                                                                    seeds=seeds, overrides=list(args[3:])))]
    rc, err = reproduce(tmp_path, name, *args)
    assert rc == 0, err
    assert run_folders(runs) == set(planned)          # the plan names every folder the experiment writes
    results = snapshot(tmp_path / "results")
    for folder in planned:                             # any one of them holding a file: nothing trains
        import shutil

        shutil.rmtree(runs)
        folder.mkdir(parents=True)
        (folder / "notes.txt").write_text("the user's")
        rc, err = reproduce(tmp_path, name, *args)
        line = one_error_line(rc, err, "reproduce")
        assert str(folder) in line and "--overwrite" in line
        assert run_folders(runs) == set() and (folder / "notes.txt").read_text() == "the user's"
        assert snapshot(tmp_path / "results") == results


def test_the_speedrun_refuses_an_existing_seed_folder_without_overwrite(tmp_path, fake_clock, commit):
    """A seed folder holding a run is refused without --overwrite, and trained again with it. Each reproduce
    releases its run folders' locks when it ends (they were left to the garbage collector: the third command
    below then found the folder made anew where its process still held a deleted one, whenever no collection
    had run in between)."""
    from numformer.train import run_folder

    runs = tmp_path / "runs"
    assert reproduce(tmp_path, "shakespeare_speedrun", "--seeds", 2, "--set", SHORT)[0] == 0
    assert not any(key.startswith(str(tmp_path)) for key in run_folder._HELD)
    seed_1 = runs / "shakespeare_speedrun_seeds" / "seed_1"
    before = snapshot(seed_1)
    import shutil

    shutil.rmtree(runs / "shakespeare_speedrun")       # only the experiment's top folder was checked before
    rc, err = reproduce(tmp_path, "shakespeare_speedrun", "--seeds", 2, "--set", SHORT)
    assert f"{seed_1} already holds a run" in one_error_line(rc, err, "reproduce")
    assert snapshot(seed_1) == before and not (runs / "shakespeare_speedrun").exists()
    (seed_1 / "summary.json").write_text("{}")     # an older run's file: --overwrite trains the seed again
    assert reproduce(tmp_path, "shakespeare_speedrun", "--seeds", 2, "--overwrite", "--set", SHORT)[0] == 0
    assert "steps" in json.loads((seed_1 / "summary.json").read_text())


def test_experiments_train_only_through_the_checked_start(tmp_path):
    """No module of numformer.experiments builds a Trainer but experiments/_runs.py (start_run)."""
    import ast
    from pathlib import Path

    import numformer.experiments as package

    for path in Path(package.__file__).parent.glob("*.py"):
        calls = [node.lineno for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Trainer"]
        assert not calls or path.name == "_runs.py", f"{path.name} builds a Trainer at lines {calls}: use start_run"


def test_every_custom_experiment_says_which_run_folders_it_writes():
    from numformer.experiments import EXPERIMENTS, load_all

    load_all()
    assert all(exp.run_dirs is not None for exp in EXPERIMENTS.values() if exp.custom is not None)


# -- the results folder --------------------------------------------------------------------------------------
def test_results_go_only_into_a_results_folder_of_numformer(tmp_path, run_cli):
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "README.md").write_text("# My project\n")
    before = snapshot(mine)
    rc, _, err = run_cli("reproduce", "copy", "--quick", "--runs", tmp_path / "runs", "--results", mine, "--quiet")
    line = one_error_line(rc, err, "reproduce")
    assert f"--results {mine} holds files that numformer did not write" in line
    assert snapshot(mine) == before and not (tmp_path / "runs").exists()
    assert run_cli("reproduce", "copy", "--quick", "--runs", tmp_path / "runs", "--results", tmp_path / "new",
                   "--quiet")[0] == 0
    assert (tmp_path / "new" / "README.md").read_text().startswith("# Results\n")
    (tmp_path / "new" / "notes.txt").write_text("kept")      # numformer's own results folder: written again
    assert run_cli("reproduce", "copy", "--quick", "--runs", tmp_path / "runs", "--results", tmp_path / "new",
                   "--quiet", "--overwrite")[0] == 0
    assert (tmp_path / "new" / "notes.txt").read_text() == "kept"


def test_bench_writes_only_into_a_results_folder_of_numformer(tmp_path, run_cli):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "bench.md").write_text("my notes\n")
    before = snapshot(mine)
    rc, _, err = run_cli("bench", "depth", "--quick", "--out", mine)
    assert f"--out {mine} holds files that numformer did not write" in one_error_line(rc, err, "bench")
    assert snapshot(mine) == before


# -- the class: every command of the CLI -------------------------------------------------------------------------
# What each command writes. A command that writes a folder is refused when that folder holds someone else's
# file (unless --overwrite); the table must name every command, so a new one is decided when it is added.
WRITES = {
    "analyze": "--out (default RUN_DIR/report): new, empty or an earlier report's, else --overwrite",
    "bench": "--out: a results folder of numformer's; quantize without --run-dir its run folder: --overwrite",
    "chat": None, "classify": None, "eval": None, "generate": None, "params": None, "translate": None,
    "data": "numformer's own data cache (NUMFORMER_CACHE), entries named by their hashes",
    "explore": "--static OUT.html: a new file, or a page explore --static wrote (replaced); any other file is "
               "refused",
    "exercises": "start: NAME.py in --dir, replaced only with --overwrite; hint: its memory file in --dir",
    "export": "--out: new or empty, or an earlier export with --overwrite (only EXPORT_FILES)",
    "import-hf": "--out: a run folder, as train's",
    "reproduce": "--runs: every run folder planned, before anything trains; --results: numformer's",
    "train": "--out: a run folder: one holding a file of a run file's name only with --overwrite (other files "
             "are left beside the run, docs/reference/run-folder.md)",
}


def test_every_command_says_what_it_writes():
    from numformer.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.choices and isinstance(a.choices, dict)]
    assert set(sub.choices) == set(WRITES)


# command -> its arguments; {mine} is a folder that holds a file of the user's (runs/... for reproduce): notes.txt,
# or where the rule is about the names a command writes (a run folder, an exercise's stub), a file of that name
FOREIGN = {
    "train": ["train", "{root}/char.toml", "--out", "{mine}", "--quiet"],
    "import-hf": ["import-hf", "{root}/hf", "--out", "{mine}"],
    "export": ["export", "{root}/char", "--out", "{mine}"],
    "export --overwrite": ["export", "{root}/char", "--out", "{mine}", "--overwrite"],
    "reproduce --runs": ["reproduce", "copy", "--quick", "--runs", "{mine}/..", "--results", "{tmp}/results",
                         "--quiet"],
    "reproduce --results": ["reproduce", "copy", "--quick", "--runs", "{tmp}/runs", "--results", "{mine}", "--quiet"],
    "bench --out": ["bench", "depth", "--quick", "--out", "{mine}"],
    "bench quantize": ["bench", "quantize", "--quick", "--out", "{tmp}/results"],
    "analyze --out": ["analyze", "{root}/char", "--out", "{mine}", "--no-ablation", "--no-occlusion"],
    "exercises start": ["exercises", "start", "layer_norm", "--dir", "{mine}"],
    "explore --static": ["explore", "{root}/char", "--prompt", "To be", "--static", "{mine}/page.html"],
}


@pytest.mark.parametrize("case", sorted(FOREIGN))
def test_a_folder_holding_the_users_files_is_refused_and_left_as_it_was(two_runs, tmp_path, monkeypatch, run_cli,
                                                                        case):
    root = two_runs[1].parent
    monkeypatch.chdir(tmp_path)
    mine = {"reproduce --runs": tmp_path / "runs" / "copy",
            "bench quantize": tmp_path / "runs" / "bench_quantize_speedrun"}.get(case, tmp_path / "mine")
    mine.mkdir(parents=True)
    names = {"train": "tokenizer.json", "import-hf": "tokenizer.json", "exercises start": "layer_norm.py",
             "explore --static": "page.html"}
    name = names.get(case, "notes.txt")
    (mine / name).write_text("the user's")
    import numformer.bench.quantize as quantize

    monkeypatch.setattr(quantize, "speed", lambda *a, **k: pytest.fail("measured before the folder was checked"))
    args = [a.format(root=root, mine=mine, tmp=tmp_path) for a in FOREIGN[case]]
    rc, _, err = run_cli(*args)
    line = one_error_line(rc, err, args[0])
    assert str(mine) in line or mine.name in line, line
    assert [p.name for p in mine.iterdir()] == [name] and (mine / name).read_text() == "the user's"
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if not p.is_relative_to(mine))
    assert written == sorted(str(p.relative_to(tmp_path)) for p in mine.parents if p.is_relative_to(tmp_path)
                             and p != tmp_path), written


def test_analyze_writes_again_into_an_earlier_report_and_elsewhere_only_with_overwrite(two_runs, tmp_path, run_cli):
    char = two_runs[1]
    fast = ["--no-ablation", "--no-occlusion"]
    out = tmp_path / "report"
    assert run_cli("analyze", char, "--out", out, *fast)[0] == 0
    (out / "notes.txt").write_text("kept")
    assert run_cli("analyze", char, "--out", out, *fast)[0] == 0          # its own earlier report: written again
    assert (out / "notes.txt").read_text() == "kept"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    assert run_cli("analyze", char, "--out", mine, "--overwrite", *fast)[0] == 0
    assert (mine / "report.md").is_file() and (mine / "notes.txt").read_text() == "the user's"


def test_analyze_never_writes_into_a_run_folder(two_runs, run_cli):
    """Not even with --overwrite (before: report.md and its figures went among another run's files)."""
    bpe, char = two_runs
    before = snapshot(bpe)
    rc, _, err = run_cli("analyze", char, "--out", bpe, "--overwrite", "--no-ablation", "--no-occlusion")
    assert rc == 2 and "holds a numformer run; an analysis report is never written into a run folder" in err
    assert snapshot(bpe) == before


def test_bench_quantize_trains_into_its_folder_again_only_with_overwrite(tmp_path, monkeypatch):
    import numformer.bench.quantize as quantize

    monkeypatch.chdir(tmp_path)
    quantize.check_training_folder(None, overwrite=False)                  # new: trained there
    (tmp_path / quantize.RUN_DIR).mkdir(parents=True)
    quantize.check_training_folder(None, overwrite=False)                  # empty
    (tmp_path / quantize.RUN_DIR / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"already holds files: give --run-dir .* or --overwrite"):
        quantize.check_training_folder(None, overwrite=False)
    quantize.check_training_folder(None, overwrite=True)
    quantize.check_training_folder("runs/x", overwrite=False)               # measured, not trained
