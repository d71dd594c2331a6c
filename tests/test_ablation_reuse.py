"""The speedrun ablation's runs: reused only after the checks, never across commits, retrained by --overwrite;
its page says what ran (issue 36). Also the experiment records a page reads, damaged, and --seeds that is not a
count. Every run here is budgeted on a fake clock and the git commit is fixed, so nothing depends on the
machine's speed or on the state of the checkout."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import time

import pytest

from numformer.cli import main

from conftest import FakeClock, one_error_line, set_commit

ABLATION = "shakespeare_speedrun_ablation"


@pytest.fixture
def commit(monkeypatch):
    monkeypatch.setattr(time, "perf_counter", FakeClock(tick=0.05))
    set_commit(monkeypatch, "abc1234")
    return lambda value: set_commit(monkeypatch, value)


def reproduce(root, name, *args):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["reproduce", name, "--quick", "--runs", str(root / "runs"), "--results", str(root / "results"),
                   "--quiet", *map(str, args)])
    return rc, err.getvalue()


def snapshot(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A quick ablation over 2 seeds, trained once at commit abc1234: copy it before changing it."""
    root = tmp_path_factory.mktemp("ablation")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(time, "perf_counter", FakeClock(tick=0.05))
        set_commit(mp, "abc1234")
        rc, err = reproduce(root, ABLATION, "--seeds", 2)
    assert rc == 0, err
    return root


@pytest.fixture
def ablation(trained, tmp_path):
    shutil.copytree(trained, tmp_path / "copy")
    return tmp_path / "copy"


def record(root, name=ABLATION):
    return json.loads((root / "results" / f"{name}.json").read_text(encoding="utf-8"))


def run_dirs(root):
    return sorted({p.parent for p in (root / "runs" / ABLATION).rglob("summary.json")})


def count_trainings(monkeypatch):
    import numformer.experiments.speedrun as speedrun

    calls = []
    start = speedrun.start_run

    def counting(ctx, config, run_dir, overrides=(), resume=False):
        calls.append(run_dir)
        return start(ctx, config, run_dir, overrides, resume)
    monkeypatch.setattr(speedrun, "start_run", counting)
    return calls


# -- reuse -----------------------------------------------------------------------------------------------------
def test_the_first_ablation_trains_each_config_once_and_says_which_rows_share_runs(trained):
    r = record(trained)
    sources = [[run["source"] for run in row["runs"]] for row in r["rows"]]
    # --quick: rows 3 and 4 have row 2's config
    assert sources == [["trained"] * 2] * 3 + [["shared"] * 2] * 2 + [["trained"] * 2] * 3
    assert all(run["commit"] == "abc1234" for row in r["rows"] for run in row["runs"])
    page = (trained / "results" / f"{ABLATION}.md").read_text(encoding="utf-8")
    assert "Rows 3, 4 have the same config as row 2" in page and "show row 2's runs" in page
    assert "earlier run" not in page and "earlier `numformer reproduce`" not in page
    assert len(run_dirs(trained)) == 12                       # 6 distinct configs x 2 seeds


def test_a_second_ablation_at_the_same_commit_reuses_every_run(ablation, commit, monkeypatch):
    calls = count_trainings(monkeypatch)
    before = snapshot(ablation / "runs")
    assert reproduce(ablation, ABLATION, "--seeds", 2)[0] == 0
    assert calls == [] and snapshot(ablation / "runs") == before
    r = record(ablation)
    assert {run["source"] for row in r["rows"] for run in row["runs"]} == {"reused", "shared"}
    page = (ablation / "results" / f"{ABLATION}.md").read_text(encoding="utf-8")
    assert ("Rows 0, 1, 2, 5, 6, 7 reuse the runs that an earlier `numformer reproduce` of this ablation trained with "
            "the same configs and seeds at commit abc1234") in page


def test_overwrite_trains_every_run_again(ablation, commit, monkeypatch):
    calls = count_trainings(monkeypatch)
    assert reproduce(ablation, ABLATION, "--seeds", 2, "--overwrite")[0] == 0
    assert sorted(calls) == run_dirs(ablation)
    assert {run["source"] for row in record(ablation)["rows"] for run in row["runs"]} == {"trained", "shared"}


def _edit_summary(run_dir, **changes):
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text(encoding="utf-8"))
    summary.update(changes)
    path.write_text(json.dumps(summary), encoding="utf-8")


@pytest.mark.parametrize("change, reason", [
    ({"commit": "def5678"}, "it was trained by commit def5678, whose src/ or configs/ differ from this commit abc1234"),
    ({"commit": None}, "its summary.json records no commit, so it cannot be shown to come from this commit abc1234"),
    ({"interrupted": True, "stopped_by": "interrupted"}, "its run did not finish (stopped by interrupted)"),
])
def test_a_run_that_cannot_be_reused_is_refused_with_the_reason(ablation, commit, change, reason):
    run_dir = run_dirs(ablation)[3]
    _edit_summary(run_dir, **change)
    before = snapshot(ablation)
    rc, err = reproduce(ablation, ABLATION, "--seeds", 2)
    line = one_error_line(rc, err, "reproduce")
    assert f"{run_dir} (not reused: {reason})" in line and "give --overwrite" in line
    assert snapshot(ablation) == before


def test_a_run_of_another_commit_with_the_same_source_is_reused(ablation, commit, monkeypatch):
    """A docs or results commit since the run trained changes nothing it ran: the run is reused."""
    import numformer.experiments._runs as runs
    monkeypatch.setattr(runs, "same_source", lambda a, b: {a, b} == {"def5678", "abc1234"})
    _edit_summary(run_dirs(ablation)[3], commit="def5678")
    calls = count_trainings(monkeypatch)
    assert reproduce(ablation, ABLATION, "--seeds", 2)[0] == 0
    assert calls == []
    assert runs.same_code("def5678", "abc1234") is None
    assert runs.same_code("0123abc", "abc1234").endswith("whose src/ or configs/ differ from this commit abc1234")


@pytest.mark.parametrize("now, reason", [
    ("abc1234+dirty", "this code has uncommitted changes (commit abc1234+dirty)"),
    (None, "this numformer is not a git checkout"),
])
def test_code_that_cannot_be_shown_the_same_reuses_nothing(ablation, commit, now, reason):
    commit(now)
    rc, err = reproduce(ablation, ABLATION, "--seeds", 2)
    line = one_error_line(rc, err, "reproduce")
    assert reason in line and "and 9 more already hold a run" in line


def test_a_run_of_another_config_is_refused_naming_the_difference(ablation, commit):
    run_dir = run_dirs(ablation)[0]
    config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    config["train"]["lr"] = 0.5
    (run_dir / "config.json").write_text(json.dumps(config), encoding="utf-8")
    line = one_error_line(*reproduce(ablation, ABLATION, "--seeds", 2), "reproduce")
    assert f"{run_dir} (not reused: its config.json differs from the config wanted (train.lr 0.5 -> " in line


DAMAGE = {
    "a list": b"[1, 2, 3]",
    "truncated": None,                        # the file cut in half
    "not UTF-8": b'{"steps": "\xff\xfe"}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
}


DAMAGES = list(DAMAGE) + ["a key missing", "a key of another type", "a number or null"]


def _damage_run_record(ablation, name, damage):
    """Damage the record ``name`` of the third run as ``damage`` says: (its run folder, the file's path)."""
    run_dir = run_dirs(ablation)[2]
    path = run_dir / name
    text = path.read_bytes()
    if damage == "truncated":
        data = text[:len(text) // 2]
    elif damage == "a key missing":
        obj = json.loads(text)
        obj.pop("best_val_loss" if name == "summary.json" else "train")
        data = json.dumps(obj).encode()
    elif damage == "a key of another type":
        obj = json.loads(text)
        obj["steps" if name == "summary.json" else "model"] = "many"
        data = json.dumps(obj).encode()
    elif damage == "a number or null":          # a schema of nested types, (NUMBER, None): an AttributeError
        obj = json.loads(text)
        obj["best_val_loss" if name == "summary.json" else "train"] = "low"
        data = json.dumps(obj).encode()
    else:
        data = DAMAGE[damage]
    path.write_bytes(data)
    return run_dir, path


@pytest.mark.parametrize("name", ["summary.json", "config.json"])
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_record_of_a_reused_run_is_one_line_naming_the_file(ablation, commit, name, damage):
    run_dir, path = _damage_run_record(ablation, name, damage)
    before = snapshot(ablation)
    line = one_error_line(*reproduce(ablation, ABLATION, "--seeds", 2), "reproduce")
    assert str(path) in line and f"{run_dir} (not reused:" in line
    if damage.startswith("a key") or damage == "a number or null":
        key = {"summary.json": {"a key missing": "best_val_loss", "a key of another type": "steps",
                                "a number or null": "best_val_loss"},
               "config.json": {"a key missing": "train", "a key of another type": "model",
                               "a number or null": "train"}}[name][damage]
        assert f"key '{key}'" in line
    assert snapshot(ablation) == before


# --overwrite does not read the old records: two damages run by default, every one in the slow run
@pytest.mark.parametrize("name", ["summary.json", "config.json"])
@pytest.mark.parametrize("damage", [d if d == "truncated" else pytest.param(d, marks=pytest.mark.slow)
                                    for d in DAMAGES])
def test_overwrite_trains_a_run_with_a_damaged_record_again(ablation, commit, name, damage):
    _, path = _damage_run_record(ablation, name, damage)
    assert reproduce(ablation, ABLATION, "--seeds", 2, "--overwrite")[0] == 0
    assert json.loads(path.read_text(encoding="utf-8"))


# -- what the page says --------------------------------------------------------------------------------------
def test_the_page_states_the_budget_the_rows_ran(tmp_path, commit):
    assert reproduce(tmp_path, ABLATION, "--seeds", 2, "--set", "train.budget_minutes=0.04")[0] == 0
    r = record(tmp_path)
    assert {row["config"]["train"]["budget_minutes"] for row in r["rows"]} == {0.04} and r["budget_minutes"] == 0.04
    assert all(run["budget_seconds"] == pytest.approx(2.4) for row in r["rows"] for run in row["runs"])
    assert "a proxy budget of 0.04 minutes" in (tmp_path / "results" / f"{ABLATION}.md").read_text(encoding="utf-8")


def test_one_seed_is_no_scatter(tmp_path, commit):
    assert reproduce(tmp_path, ABLATION, "--seeds", 1)[0] == 0
    page = (tmp_path / "results" / f"{ABLATION}.md").read_text(encoding="utf-8")
    assert "n/a (one seed)" in page and "yes, better" not in page and "yes, worse" not in page


# -- --seeds and the records of the other parts ----------------------------------------------------------------
@pytest.mark.parametrize("name, seeds", [(n, s) for n in ("shakespeare_speedrun", ABLATION, "shakespeare_char")
                                         for s in (-1, 0)] + [("shakespeare_char", 1)])
def test_seeds_that_are_not_a_count_are_one_line(tmp_path, name, seeds):
    """--seeds 0 is refused too (it ran the experiment's default number of seeds, as if left out); a seed study
    (shakespeare_char's) asks for at least 2 from the start, so that 0 does not lead to 1 and then to 2."""
    rc, err = reproduce(tmp_path, name, "--seeds", seeds)
    wanted = "at least 2 seeds (a seed study's spread needs 2)" if name == "shakespeare_char" else \
        "a positive number of seeds"
    assert f"--seeds {seeds}: give {wanted} or leave it out" in one_error_line(rc, err, "reproduce")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()


ANCHOR = "shakespeare_speedrun_torch"
PROFILE = "shakespeare_speedrun_profile"


def _damage_record(path, how):
    if how == "a list":
        path.write_text("[]", encoding="utf-8")
    elif how == "not UTF-8":
        path.write_bytes(b'{"command": "\xff"}')
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    else:                                                    # a key missing, deep in the record
        r = json.loads(path.read_text(encoding="utf-8"))
        r["runs"]["recipe"].pop("val_loss") if "runs" in r else r["profiles"][0].pop("step_seconds")
        path.write_text(json.dumps(r), encoding="utf-8")


def _anchor_record(results):
    """A record of the PyTorch anchor as run_torch_anchor writes it (the part itself needs torch)."""
    run = {"model_class": "TorchGPT", "steps": 10, "tokens_per_s": 100.0, "wall_seconds": 1.0, "val_loss": 2.0,
           "torch": "2.13.0", "threads": 2}
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{ANCHOR}.json").write_text(json.dumps({
        "name": ANCHOR, "description": "", "command": f"numformer reproduce {ANCHOR}", "commit": "abc1234",
        "date": "2026-01-01", "figures": {}, "targets": {}, "budget_minutes": 0.25, "seed": 0,
        "runs": {"recipe": run, "nanogpt_cpu": run}}), encoding="utf-8")


@pytest.mark.parametrize("how", ["a list", "not UTF-8", "truncated", "a key missing"])
def test_a_damaged_anchor_record_does_not_stop_another_part(ablation, commit, how):
    _anchor_record(ablation / "results")
    assert reproduce(ablation, "shakespeare_speedrun")[0] == 0        # the page gathering the parts
    path = ablation / "results" / f"{ANCHOR}.json"
    _damage_record(path, how)
    rc, err = reproduce(ablation, ABLATION, "--seeds", 2)
    assert rc == 0, err
    # one line from the page's reader (and one from the results index when the file is not a record at all)
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warnings and all(str(path) in w for w in warnings) and "Traceback" not in err
    assert len(err.splitlines()) == len(warnings)
    if how == "a key missing":
        assert "key 'runs.recipe.val_loss' is missing" in warnings[0]
    page = (ablation / "results" / "shakespeare_speedrun.md").read_text(encoding="utf-8")
    assert f"## {ANCHOR}\n\n{warnings[0][len('warning: '):]}" in page
    assert record(ablation)["rows"]                                      # the ablation's own record is written


@pytest.mark.parametrize("how", ["a list", "not UTF-8", "truncated", "a key missing"])
def test_a_damaged_profile_history_is_refused_before_profiling(tmp_path, commit, monkeypatch, how):
    import numformer.experiments.speedrun as speedrun

    monkeypatch.setattr(speedrun, "matmul_peak", lambda **kw: 1e9)
    assert reproduce(tmp_path, PROFILE)[0] == 0
    path = tmp_path / "results" / f"{PROFILE}.json"
    _damage_record(path, how)
    before = path.read_bytes()
    monkeypatch.setattr(speedrun, "profile_training_step", lambda *a, **k: pytest.fail("profiled"))
    line = one_error_line(*reproduce(tmp_path, PROFILE), "reproduce")
    assert str(path) in line and path.read_bytes() == before
    if how == "a key missing":
        assert "key 'profiles[0].step_seconds' is missing" in line


def test_a_damaged_seed_study_record_leaves_the_page_written(tmp_path, commit):
    assert reproduce(tmp_path, "shakespeare_char", "--seeds", 2)[0] == 0
    path = tmp_path / "results" / "shakespeare_char_seeds.json"
    r = json.loads(path.read_text(encoding="utf-8"))
    r["seeds"][1]["val_loss"] = "low"
    path.write_text(json.dumps(r), encoding="utf-8")
    shutil.rmtree(tmp_path / "runs")
    rc, err = reproduce(tmp_path, "shakespeare_char")
    assert rc == 0 and f"key 'seeds[1].val_loss' is a string, expected a number" in err
    page = (tmp_path / "results" / "shakespeare_char.md").read_text(encoding="utf-8")
    assert "The seed study could not be read" in page


# -- the class: every experiment that reuses a run ------------------------------------------------------------
# experiment -> its arguments. Each module of numformer.experiments that calls _runs.reusable_run has its
# experiments here (a new reuser fails test_every_reuser_is_tested until added). A seed study reuses its seeds'
# runs, not the experiment's own run (runs/NAME, replaced only with --overwrite): the test removes that one.
REUSERS = {
    ABLATION: ("--seeds", 1),
    "shakespeare_char": ("--seeds", 2),                 # the seed study (language_model.py)
    "shakespeare_char_llama": ("--seeds", 2),
    "gpt_to_llama": (),
}
SEED_STUDIES = ("shakespeare_char", "shakespeare_char_llama")


def test_every_reuser_is_tested():
    import ast
    from pathlib import Path

    import numformer.experiments as package
    from numformer.experiments import EXPERIMENTS, load_all

    load_all()
    reusing = {path.stem for path in Path(package.__file__).parent.glob("*.py") if path.name != "_runs.py"
               and any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "reusable_run"
                       for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))}
    # chat_pipeline's check (its plan, whose runs train in child processes) is tested in test_chat_pipeline.py
    assert reusing == {"speedrun", "language_model", "gpt_to_llama", "chat_pipeline"}
    assert "def test_a_base_run_of_another_commit_or_config_is_not_reused_and_named(" in \
        (Path(__file__).parent / "test_chat_pipeline.py").read_text(encoding="utf-8")
    reusing.discard("chat_pipeline")
    modules = {name: EXPERIMENTS[name].custom or EXPERIMENTS[name].seed_study for name in REUSERS}
    assert {f.__module__.rsplit(".", 1)[1] for f in modules.values()} == reusing


def _runs_of(root):
    return sorted(p.parent for p in (root / "runs").rglob("summary.json"))


def _reproduce_again(root, name, *args):
    if name in SEED_STUDIES:
        shutil.rmtree(root / "runs" / name, ignore_errors=True)
    return reproduce(root, name, *args)


# the two seed studies share language_model.py's code: one of them (and the llama ladder) in the slow run
SLOW_REUSERS = ("shakespeare_char_llama", "gpt_to_llama")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_REUSERS else n
                                  for n in sorted(REUSERS)])
def test_every_reused_run_is_checked_before_reuse(tmp_path, commit, name):
    """Each reuser, run again: reuses (or resumes) only runs of the same config trained by this same commit and
    finished (or, for a resumable study, with a checkpoint); a run of another commit, another config, or one
    that cannot be checked is refused by name before anything trains, and --overwrite trains it again."""
    args = REUSERS[name]
    assert reproduce(tmp_path, name, *args)[0] == 0
    assert _reproduce_again(tmp_path, name, *args)[0] == 0                  # the same commit: reused
    run_dir = _runs_of(tmp_path)[-1]
    kept = {name: (run_dir / name).read_bytes() for name in ("summary.json", "config.json")}
    for damage, reason in [("commit", "it was trained by commit def5678, whose src/ or configs/ differ from this commit abc1234"),
                           ("config", "its config.json differs from the config wanted (train.lr 0.5 -> "),
                           ("summary", "summary.json: key 'steps' is missing")]:
        for file, data in kept.items():                                   # the previous damage undone
            (run_dir / file).write_bytes(data)
        path = run_dir / ("config.json" if damage == "config" else "summary.json")
        obj = json.loads(path.read_text(encoding="utf-8"))
        if damage == "commit":
            obj["commit"] = "def5678"
        elif damage == "config":
            obj["train"]["lr"] = 0.5
        else:
            obj.pop("steps")
        path.write_text(json.dumps(obj), encoding="utf-8")
        if name in SEED_STUDIES:
            shutil.rmtree(tmp_path / "runs" / name, ignore_errors=True)
        before = snapshot(tmp_path / "runs")
        line = one_error_line(*reproduce(tmp_path, name, *args), "reproduce")
        assert f"{run_dir} (not reused: " in line and reason in line and "--overwrite" in line, line
        assert snapshot(tmp_path / "runs") == before
    assert reproduce(tmp_path, name, *args, "--overwrite")[0] == 0
    assert json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["commit"] == "abc1234"
