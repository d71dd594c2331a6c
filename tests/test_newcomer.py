"""What a newcomer meets first: the model presets, the progress lines, and labels that say what they show
(eval's split, the test figures at the end of training, a resumed run's times, --help, quick reports)."""
from __future__ import annotations

import io
import json

import pytest

from numformer.cli import main
from numformer.config import resolve_config
from numformer.models import MODEL_PRESETS, model_arguments
from numformer.train.progress import PlainProgress, clock

TINY_GPT = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
            "data": {"task": "text", "block_size": 8},
            "train": {"max_steps": 6, "batch_size": 4, "eval_every": 3, "eval_batches": 1, "log_every": 1,
                      "processes": 1}}


def write_toml(path, config):
    def value(v):
        return json.dumps(v) if not isinstance(v, bool) else str(v).lower()

    path.write_text("\n".join(f"[{section}]\n" + "\n".join(f"{k} = {value(v)}" for k, v in keys.items()) + "\n"
                              for section, keys in config.items()), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------- presets
def test_the_default_preset_is_small_and_base_is_the_paper():
    data = {"task": "copy", "length": 4}
    small, _ = resolve_config({"model": {"type": "transformer"}, "data": data})
    assert {k: small["model"][k] for k in ("d_model", "n_heads", "n_layers", "d_ff")} == {
        "d_model": 128, "n_heads": 4, "n_layers": 2, "d_ff": 512}
    assert "preset" not in small["model"]          # the resolved config records the sizes themselves
    base, _ = resolve_config({"model": {"type": "transformer", "preset": "base", "n_layers": 3}, "data": data})
    assert (base["model"]["d_model"], base["model"]["d_ff"], base["model"]["n_layers"]) == (512, 2048, 3)
    with pytest.raises(ValueError, match=r"preset = 'huge' is not a preset of the transformer model; choose one "
                                         r"of \['base', 'big', 'small'\]"):
        resolve_config({"model": {"type": "transformer", "preset": "huge"}, "data": data}, build_task=False)


def test_presets_name_constructor_arguments_and_small_gpt_and_classifier_are_the_constructors():
    for kind, presets in MODEL_PRESETS.items():
        valid = model_arguments(kind)
        for values in presets.values():
            assert set(values) <= set(valid)
    for kind in ("gpt", "classifier"):        # their constructors' defaults are already small
        valid = model_arguments(kind)
        assert all(valid[k] == v for k, v in MODEL_PRESETS[kind]["small"].items())


def test_the_training_reference_lists_every_preset():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "training.md").read_text()
    for kind, presets in MODEL_PRESETS.items():
        for name, v in presets.items():
            layers = v["n_layers"] if kind != "transformer" else f"{v['n_layers']} + {v['n_layers']}"
            d_ff = v["d_ff"] or 4 * v["d_model"]
            row = f"| {layers} | {v['n_heads']} | {v['d_model']} | {d_ff} | {v['dropout']} |"
            line = next((ln for ln in page.splitlines() if ln.startswith(f"| `{kind}` | `{name}`")), None)
            assert line is not None and row in line, (kind, name, row, line)


def test_preset_and_init_from_exclude_each_other(tmp_path):
    with pytest.raises(ValueError, match="preset and init_from exclude each other"):
        resolve_config({"model": {"preset": "small", "init_from": str(tmp_path)}, "data": {"task": "text"}},
                       build_task=False)


# --------------------------------------------------------------------------------------------- progress
def test_plain_progress_lines_show_step_loss_speed_and_time_left():
    out = io.StringIO()
    bar = PlainProgress(total=100, initial=0, stream=out)
    for step in range(1, 101):
        bar.set_postfix(loss=f"{5 - step / 50:.4f}", lr="1e-3", tok_s="1,234")
        bar.update(1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 9                                  # every tenth of the run, not at the end
    assert lines[0].startswith("step 10/100: train loss 4.8000, 1,234 tokens/s, 0:0")
    assert lines[0].endswith(" left")
    assert clock(3725) == "1:02:05" and clock(65) == "1:05"


def test_train_prints_progress_lines_when_not_a_terminal_and_nothing_when_quiet(tmp_path, capsys):
    cfg = write_toml(tmp_path / "c.toml", TINY_GPT)
    assert main(["train", str(cfg), "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "step 3/6: train loss " in err and " tokens/s, " in err and " left" in err
    assert main(["train", str(cfg), "--out", str(tmp_path / "run"), "--overwrite", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------------------------ labels
def test_eval_test_split_of_a_text_run_says_it_is_the_validation_text(tmp_path, capsys):
    cfg = write_toml(tmp_path / "c.toml", TINY_GPT)
    assert main(["train", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--split", "test"]) == 0
    assert "(val split: a text task has no test split)" in capsys.readouterr().out
    assert main(["eval", str(tmp_path / "run"), "--split", "test", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["split"] == "val"


def test_resumed_summary_labels_both_times(tmp_path, capsys):
    cfg = write_toml(tmp_path / "c.toml", {**TINY_GPT, "train": {**TINY_GPT["train"], "max_steps": 3}})
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run)]) == 0
    assert "(all parts of the resumed run)" not in capsys.readouterr().err
    assert main(["train", "--resume", "--out", str(run), "--set", "train.max_steps=6"]) == 0
    err = capsys.readouterr().err
    assert "s of training steps (all parts of the resumed run)" in err and "s wall time of this part" in err


def test_classification_training_ends_with_the_test_figures(tmp_path, capsys):
    rows = "".join(f"{i},{'good fine great' if i % 2 else 'bad poor awful'} film,{i % 2}\n" for i in range(60))
    (tmp_path / "t.csv").write_text("id,text,label\n" + rows, encoding="utf-8")
    cfg = write_toml(tmp_path / "c.toml", {
        "model": {"type": "classifier", "d_model": 16, "n_heads": 2},
        "data": {"task": "classification", "path": str(tmp_path / "t.csv"), "min_freq": 1},
        "train": {"max_steps": 4, "batch_size": 8, "eval_every": 2, "processes": 1, "eval_metrics": False}})
    assert main(["train", str(cfg), "--out", str(tmp_path / "run")]) == 0
    assert "Test split: loss " in capsys.readouterr().err
    test = json.loads((tmp_path / "run" / "summary.json").read_text())["test"]
    assert set(test) >= {"test_loss", "test_accuracy"}


@pytest.mark.parametrize("command, words", [
    ("classify", "your own classification data"),
    ("import-hf", "make a run folder from a Hugging Face"), ("export", "Llama")])     # families: test_family_lists
def test_help_strings_name_what_the_commands_take(command, words, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert words in " ".join(capsys.readouterr().out.split())


def test_help_shows_a_required_argument_as_required(capsys):
    """`numformer train --help` shows --out RUN_DIR as required, as the usage line of its errors does."""
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    usage = " ".join(capsys.readouterr().out.split("\n\n")[0].split())
    assert " --out RUN_DIR " in usage and "[--out RUN_DIR]" not in usage


def test_quick_reproduce_report_says_it_is_the_quick_run(tmp_path):
    results = tmp_path / "results"
    assert main(["reproduce", "copy", "--quick", "--results", str(results), "--runs", str(tmp_path / "runs"),
                 "--quiet"]) == 0
    report = (results / "copy.md").read_text()
    assert report.startswith("# copy (quick run)")
    assert "This is the `--quick` version" in report and "data.length=8" in report
