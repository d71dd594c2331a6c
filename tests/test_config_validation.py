"""Up-front validation: every config key, given a value of the wrong type and a value out of its range, stops
`numformer train` before anything is written: exit code 2, one line naming the key, no run folder."""
from __future__ import annotations

import inspect
import json
import re

import pytest

from numformer.config import TRAIN_DEFAULTS, _train_keys
from numformer.data.base import DATA_KEYS, import_builtin_tasks
from numformer.keys import Key, check_section
from numformer.models import MODEL_TYPES, model_arguments, model_keys

from conftest import tiny_copy_toml

TINY = tiny_copy_toml(max_steps=4, batch_size=4, processes=1)


def _toml(value):
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def wrong_type(rule: Key):
    """A value of another type than the key's (as TOML text)."""
    return {int: '"abc"', float: '"abc"', bool: "1", str: "1", list: "1", dict: "1"}[rule.kind]


def out_of_range(rule: Key):
    """A value of the right type outside the key's range, or None when every value of the type is allowed."""
    if rule.choices is not None:
        return '["bogus"]' if rule.kind is list else '"bogus"'
    if rule.kind is float and rule.lo is None and rule.hi is None:
        return "inf"
    if rule.lo is not None:
        return _toml(rule.lo if rule.open[0] else (rule.lo - 1 if rule.kind is int else rule.lo - 0.5))
    if rule.hi is not None:
        return _toml(rule.hi if rule.open[1] else rule.hi + 1)
    if rule.kind is list and rule.item is not None:
        return '["x"]'
    return None


# Settings that make TINY train each model type (the copy task feeds a GPT or a Transformer, parity a classifier).
AS_MODEL = {"gpt": [], "transformer": ['model.type="transformer"'],
            "classifier": ['model.type="classifier"', 'data.task="parity"']}


def cases():
    """(section, key, TOML value, settings) for every key: its wrong type and its out-of-range value."""
    model_rules = model_keys()
    table = [("train", k, r, []) for k, r in _train_keys().items()]
    seen = set()
    for kind, settings in AS_MODEL.items():
        for k in model_arguments(kind):
            if k not in seen:
                seen.add(k)
                table.append(("model", k, model_rules[k], settings))
    table += [("data", k, DATA_KEYS[k], []) for k in ("length", "min_length", "full_length_fraction",
                                                       "test_lengths", "n_val", "n_test", "eval_batch_size", "vocab")]
    for section, key, rule, settings in table:
        yield pytest.param(section, key, wrong_type(rule), settings, id=f"{section}.{key}-type")
        bad = out_of_range(rule)
        if bad is not None:
            yield pytest.param(section, key, bad, settings, id=f"{section}.{key}-range")


CASES = list(cases())


@pytest.mark.parametrize("section,key,value,settings", CASES)
def test_every_key_is_checked_before_anything_is_written(tmp_path, cli_error, section, key, value, settings):
    cfg = tmp_path / "c.toml"
    cfg.write_text(TINY)
    out = tmp_path / "run"
    sets = [a for s in settings for a in ("--set", s)]
    line = cli_error("train", cfg, "--out", out, *sets, "--set", f"{section}.{key}={value}")
    assert f"[{section}] {key} = " in line
    assert not out.exists()


# The cases found by hand (issue 14), each a crash, a traceback or a silent misbehaviour before.
@pytest.mark.parametrize("setting,named", [
    ("train.log_every=0", "[train] log_every"), ("train.eval_batch_size=-1", "[train] eval_batch_size"),
    ("train.min_lr=-1", "[train] min_lr"), ("train.eps=0", "[train] eps"), ("train.eps=-1e-8", "[train] eps"),
    ("train.warmup_steps=-1", "[train] warmup_steps"), ("train.decay_steps=-5", "[train] decay_steps"),
    ("train.weight_decay=-0.1", "[train] weight_decay"), ("train.lr=inf", "[train] lr"),
    ("train.lr=nan", "[train] lr"), ("train.max_minutes=-1", "[train] max_minutes"),
    ("train.processes=1000", "[train] processes"), ("model.d_model=0", "[model] d_model"),
    ("model.n_layers=0", "[model] n_layers"), ("model.n_layers=-1", "[model] n_layers"),
    ("model.d_ff=0", "[model] d_ff"), ('model.d_ff="abc"', "[model] d_ff"), ("data.task=[1]", "[data] task"),
    ("model.type={a=1}", "[model] type"), ("model.n_heads=3", "[model] d_model = 16 must be divisible"),
    ("train.seed=-1", "[train] seed"), ("model.dropout=1.0", "[model] dropout"),
    ("data.task_module=nosuch_mod_f2", "[data] task_module = 'nosuch_mod_f2' cannot be imported"),
    # beyond 2**53 a count overflowed NumPy's integers: an OverflowError called a bug, or NumPy's words alone
    ("model.n_layers=99999999999999999999", "[model] n_layers = 99999999999999999999 is out of range"),
    ("train.batch_size=99999999999999999999", "[train] batch_size = 99999999999999999999 is out of range"),
    ("train.grad_accum=99999999999999999999", "at most 2**53"), ("train.seed=9007199254740993", "[train] seed"),
])
def test_cases_found_by_hand(tmp_path, cli_error, setting, named):
    cfg = tmp_path / "c.toml"
    cfg.write_text(TINY)
    line = cli_error("train", cfg, "--out", tmp_path / "run", "--set", setting)
    assert named in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("settings,named", [
    (["train.schedule=cosine", "train.min_lr=0.1", "train.lr=0.01"], "min_lr = 0.1 is above lr = 0.01"),
    (["train.schedule=noam"], "warmup_steps must be > 0 for the noam schedule"),
    (["train.processes=8", "train.batch_size=4"], "processes = 8 is more than batch_size = 4"),
    (["train.schedule=cosine", "train.warmup_steps=3", "train.decay_steps=2", "train.min_lr=1e-4"],
     "[train] decay_steps = 2 is not above warmup_steps = 3"),
    (["train.schedule=linear", "train.warmup_steps=3", "train.decay_steps=3"],
     "[train] decay_steps = 3 is not above warmup_steps = 3"),
])
def test_rules_between_keys(tmp_path, cli_error, settings, named):
    cfg = tmp_path / "c.toml"
    cfg.write_text(TINY)
    line = cli_error("train", cfg, "--out", tmp_path / "run", *[a for s in settings for a in ("--set", s)])
    assert named in line


@pytest.mark.parametrize("setting", ["model.d_model=0", "model.n_layers=-1", 'model.d_ff="abc"'])
def test_params_checks_the_model_section_too(tmp_path, cli_error, setting):
    cfg = tmp_path / "c.toml"
    cfg.write_text(TINY)
    assert setting.split("=")[0].split(".")[1] in cli_error("params", cfg, "--set", setting)


def test_every_key_has_a_rule():
    """The tables cover every key a config can hold: [train], every model type's arguments, every task's
    [data] keys (by name, or by the type of their default)."""
    assert set(_train_keys()) == set(TRAIN_DEFAULTS)
    rules = model_keys()
    for kind in MODEL_TYPES:
        assert set(model_arguments(kind)) <= set(rules), kind
    for name, task in import_builtin_tasks().items():
        check_section("data", dict(task.data_keys), DATA_KEYS, task.data_keys)   # the defaults pass
    for kind in MODEL_TYPES:
        defaults = {k: d for k, d in model_arguments(kind).items() if d is not inspect.Parameter.empty}
        check_section("model", defaults, rules, model_arguments(kind))


def test_saved_config_is_checked_like_a_toml_config(tmp_path, cli_error, run_cli):
    cfg = tmp_path / "c.toml"
    cfg.write_text(TINY)
    run = tmp_path / "run"
    assert run_cli("train", cfg, "--out", run, "--quiet")[0] == 0
    saved = json.loads((run / "config.json").read_text())
    saved["train"]["dtype"] = "float16"
    (run / "config.json").write_text(json.dumps(saved))
    assert "config.json: [train] dtype = 'float16' is not allowed" in cli_error("eval", run)
    saved["train"]["dtype"] = "float32"
    saved["model"]["n_heads"] = 8                 # every shape the same, another model
    (run / "config.json").write_text(json.dumps(saved))
    assert "config.json was edited: it says [model] n_heads 8, but the run's checkpoint" in cli_error("eval", run)
    (run / "checkpoint.safetensors").unlink()     # the weights alone say it too
    assert "was trained with another [model] config than config.json (n_heads 2 -> 8)" in cli_error("eval", run)
    del saved["model"]["n_heads"]
    saved["model"]["n_head"] = 2
    (run / "config.json").write_text(json.dumps(saved))
    assert "unknown key(s) ['n_head'] in [model]" in cli_error("eval", run)


# -- a misspelt name gets the closest valid one -------------------------------------------------------------------
def _sections():
    """(section, valid keys, rules, defaults) for [train], each model type's [model] and each task's [data]."""
    yield "train", set(TRAIN_DEFAULTS), _train_keys(), None
    for kind in MODEL_TYPES:
        yield "model", set(model_arguments(kind)), model_keys(), model_arguments(kind)
    for name, task in import_builtin_tasks().items():
        yield "data", set(task.data_keys), DATA_KEYS, task.data_keys


def _typo(key):
    """The key with its last letter dropped, or (short keys) one letter doubled: a slip of the keyboard."""
    return key[:-1] if len(key) > 4 else key + key[-1]


def test_every_unknown_key_of_every_section_gets_the_closest_valid_one():
    """The class (issue 36: model.n_layer was refused without the obvious n_layers): in every section, a key
    one letter off one of its valid keys is refused with a suggestion, the key itself or another as close."""
    import difflib

    for where, valid, rules, defaults in _sections():
        for key in sorted(valid):
            typo = _typo(key)
            if typo in valid:
                continue
            with pytest.raises(ValueError) as e:
                check_section(where, {typo: 1}, rules, defaults)
            suggested = re.search(r"\(did you mean '(\w+)'\?\)", str(e.value))
            assert suggested, (where, typo, str(e.value))
            best = difflib.SequenceMatcher(None, typo, key).ratio()
            assert suggested[1] in valid and difflib.SequenceMatcher(None, typo, suggested[1]).ratio() >= best


@pytest.mark.parametrize("config, says", [
    ({"model": {"n_layer": 2}, "data": {"task": "copy"}}, "(did you mean 'n_layers'?)"),
    ({"trian": {}, "data": {"task": "copy"}}, "unknown section(s) ['trian'] (did you mean 'train'?)"),
    ({"data": {"task": "cpy"}}, "task = 'cpy' is not a known task (did you mean 'copy'?)"),
    ({"model": {"type": "gtp"}, "data": {"task": "copy"}}, "type = 'gtp' is not a model type (did you mean 'gpt'?)"),
    ({"train": {"optimizer": "adamq"}, "data": {"task": "copy"}}, "is not allowed (did you mean 'adam'?)"),
    ({"train": {"no_decay": ["bias", "norms"]}, "data": {"task": "copy"}}, "is not allowed (did you mean 'norm'?)"),
    ({"train": {"schedule": "cosin"}, "data": {"task": "copy"}}, "(did you mean 'cosine'?)"),
    ({"train": {"steps": 5}, "data": {"task": "copy"}},                     # a part of names, not a typo of 'eps'
     "(did you mean 'max_steps' or 'decay_steps' or 'warmup_steps'?)"),
    ({"data": {"task": "copy", "lenght": 4, "n_vall": 3}},
     "(did you mean 'length' for 'lenght', 'n_val' for 'n_vall'?)"),
])
def test_misspelt_sections_tasks_types_and_choices_get_the_closest_name(config, says):
    from numformer.config import resolve_config

    with pytest.raises(ValueError) as e:
        resolve_config(config, build_task=False)
    assert says in str(e.value)


@pytest.mark.parametrize("config, says", [
    ({"train": {"block_size": 128}, "data": {"task": "text"}},      # before: did you mean 'batch_size'?
     "block_size is a [data] key, not a [train] one: write it under [data] (on the command line: --set "
     "data.block_size=128)"),
    ({"data": {"task": "text", "batch_size": 8}},                   # before: did you mean 'block_size'?
     "batch_size is a [train] key, not a [data] one: write it under [train] (on the command line: --set "
     "train.batch_size=8)"),
    ({"train": {"n_layers": 2}, "data": {"task": "copy"}},          # before: no hint at all
     "n_layers is a [model] key, not a [train] one"),
    ({"model": {"lr": 0.1}, "data": {"task": "copy"}}, "lr is a [train] key, not a [model] one"),
    ({"model": {"norm_first": True, "schedule": "cosine"}, "data": {"task": "copy"}},
     '--set train.schedule="cosine"'),
])
def test_a_key_written_in_another_section_is_answered_with_its_section(config, says):
    """The likeliest slip, a key under the wrong header (or --set section): the error names the key's section
    rather than a near name of the wrong one."""
    from numformer.config import resolve_config

    with pytest.raises(ValueError) as e:
        resolve_config(config, build_task=False)
    assert says in str(e.value)


def test_a_boolean_spelled_as_python_writes_it_says_how_toml_does(run_cli, tmp_path):
    """--set model.norm_first=True reads as the string 'True' (TOML's booleans are lowercase): the error says so."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(TINY)
    rc, _, err = run_cli("train", cfg, "--out", tmp_path / "r", "--set", "model.norm_first=True")
    assert rc == 2 and err.strip().endswith(
        "[model] norm_first = 'True' should be a boolean (TOML writes true and false in lowercase)")


def test_a_data_size_written_in_model_says_where_it_goes(tmp_path):
    """--set model.block_size=128 on a GPT: [model]'s block_size is the data's, so the error says to give it as
    [data] block_size (before: only 'remove them from [model]', to a user who had edited no file)."""
    from numformer.config import resolve_config

    with pytest.raises(ValueError) as e:
        resolve_config({"model": {"type": "gpt", "block_size": 128}, "data": {"task": "text", "block_size": 8}})
    assert str(e.value).endswith("remove them from [model]; block_size is a [data] key: write it there "
                                 "(--set data.block_size=128)")


@pytest.mark.parametrize("warmup, warned", [(100, True), (4, True), (3, False)])
def test_a_warmup_longer_than_the_run_is_warned_about(tmp_path, run_cli, warmup, warned):
    """warmup_steps >= max_steps: one warning line (not an error: --quick runs cut max_steps on purpose)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(TINY)
    rc, out, err = run_cli("train", cfg, "--out", tmp_path / "run", "--set", "train.schedule=cosine",
                           "--set", f"train.warmup_steps={warmup}")
    lines = [line for line in (out + err).splitlines() if line.startswith("warning: [train] warmup_steps")]
    assert rc == 0 and len(lines) == int(warned), out + err
    if warned:
        assert f"warmup_steps = {warmup} is not below max_steps = 4" in lines[0]
        assert f"at lr {1e-3 * 4 / (warmup + 1):.3g} instead of lr = 0.001" in lines[0]


def test_make_schedule_refuses_a_decay_that_ends_before_the_warmup():
    from numformer.optim import make_schedule

    with pytest.raises(ValueError, match="decay_steps = 2 is not above warmup_steps = 3"):
        make_schedule("cosine", 1e-3, warmup_steps=3, max_steps=10, min_lr=1e-4, decay_steps=2)
    assert make_schedule("cosine", 1e-3, warmup_steps=3, max_steps=2)(1) == pytest.approx(5e-4)  # a cut run


def test_a_time_budget_does_not_read_decay_steps_so_no_rule_ties_it_to_the_warmup():
    """Under budget_minutes the decay is planned by time: the config check and the trainer's schedule agree
    that decay_steps below warmup_steps is no error (the trainer used to refuse what the config accepted)."""
    import tomllib

    from numformer.config import apply_overrides, resolve_config
    from numformer.optim import train_schedule

    settings = ["train.budget_minutes=1.0", "train.max_steps=100000", "train.warmup_steps=50",
                "train.decay_steps=20", "train.schedule=cosine"]
    config, _ = resolve_config(apply_overrides(tomllib.loads(TINY), settings))
    assert train_schedule(config["train"]) is not None


@pytest.mark.parametrize("top, says", [
    ("lr = 1e-3\n", "'lr' above the first [section]: a config is a table of sections [model], [data] and [train]; "
                    "lr belongs in [train]: move it below its section's header"),
    ("n_layers = 2\npath = 'x.txt'\n", "'n_layers', 'path' above the first [section]"),
    ("lrr = 1\n", "lrr is no key of any section (a typo?)"),
])
def test_keys_above_the_first_section_are_named_with_their_section(tmp_path, cli_error, top, says):
    cfg = tmp_path / "c.toml"
    cfg.write_text(top + TINY, encoding="utf-8")
    line = cli_error("train", cfg, "--out", tmp_path / "run")
    assert says in line
    if "n_layers" in top:
        assert "n_layers belongs in [model]; path belongs in [data]: move each" in line
    assert not (tmp_path / "run").exists()
