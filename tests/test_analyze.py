"""numformer analyze: a report folder (report.md + every figure as a non-empty PNG) for tiny trained runs of
each model family, and one clear error line for each bad input."""
from __future__ import annotations

import re
import shutil

import pytest

from numformer.cli import main
from numformer.experiments.runner import find_config

TINY = ["model.n_layers=1", "model.d_model=16", "model.n_heads=2", "train.max_steps=4", "train.eval_every=2",
        "train.checkpoint_every=4", "train.warmup_steps=0"]

COPY_TRANSFORMER = """
[model]
type = "transformer"
n_layers = 1
n_heads = 2
d_model = 16
d_ff = 32
positional = "learned"
[data]
task = "copy"
length = 6
n_val = 40
n_test = 40
[train]
max_steps = 4
eval_every = 2
checkpoint_every = 4
batch_size = 8
"""

PARITY_CLASSIFIER = """
[model]
type = "classifier"
n_layers = 1
n_heads = 2
d_model = 16
pooling = "first"
[data]
task = "parity"
length = 8
n_val = 40
n_test = 40
[train]
max_steps = 4
eval_every = 2
checkpoint_every = 4
batch_size = 8
"""


def train(args):
    assert main(["train", *args, "--quiet"]) == 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    sets = [x for item in TINY + ["data.block_size=16", "train.eval_batches=2"] for x in ("--set", item)]
    train([str(find_config("shakespeare_char")), "--out", str(base / "char"), *sets])
    for name, text in (("copy", COPY_TRANSFORMER), ("parity", PARITY_CLASSIFIER)):
        (base / f"{name}.toml").write_text(text)
        train([str(base / f"{name}.toml"), "--out", str(base / name)])
    return base


def check_report(report_dir, groups, split="validation"):
    md = (report_dir / "report.md").read_text()
    linked = re.findall(r"\]\(([^)]+\.png)\)", md)
    for png in ["model_diagram.png", "head_ablation.png", "position_importance.png", "loss.png", "lr.png",
                "wavelengths.png", *[f"attention_{g}.png" for g in groups], *[f"head_stats_{g}.png" for g in groups]]:
        assert png in linked, png
    assert any(p.startswith("positional_") for p in linked)
    for png in linked:
        assert (report_dir / png).stat().st_size > 1000, png
    for png in report_dir.glob("*.png"):                  # nothing written that is empty
        assert png.stat().st_size > 1000, png.name
    assert f"Ablation metric: the run's {split} loss" in md
    return md


def test_char_lm_with_text(runs, capsys):
    assert main(["analyze", str(runs / "char"), "--text", "To be, or not"]) == 0
    out = capsys.readouterr().out
    assert f"report written to {runs / 'char' / 'report' / 'report.md'}" in out
    md = check_report(runs / "char" / "report", ["self"])
    assert "`To be, or not`" in md and "Input: from --text" in md


def test_char_lm_default_example(runs, tmp_path):
    """No --text: the task's validation example; newlines are shown escaped, so the markdown stays intact."""
    assert main(["analyze", str(runs / "char"), "--out", str(tmp_path / "r"), "--no-occlusion"]) == 0
    md = check_report(tmp_path / "r", ["self"])
    assert "example of the `val` split" in md
    assert "occlusion" not in md.split("## Position importance")[1].split("##")[0].lower().replace(
        "occlusion=", "")


def test_transformer_greedy_target_and_given_target(runs, tmp_path):
    assert main(["analyze", str(runs / "copy"), "--src", "012345", "--out", str(tmp_path / "g")]) == 0
    md = check_report(tmp_path / "g", ["encoder", "decoder", "cross"])
    assert "the model's own greedy translation" in md
    assert main(["analyze", str(runs / "copy"), "--src", "0 1 2", "--tgt", "0 1 2", "--out", str(tmp_path / "t"),
                 "--no-ablation", "--no-occlusion"]) == 0
    md = (tmp_path / "t" / "report.md").read_text()
    assert "`tgt` (4 tokens): `<bos> 0 1 2`" in md and "## Head ablation" not in md


def test_classifier_default_example(runs, tmp_path):
    assert main(["analyze", str(runs / "parity"), "--out", str(tmp_path / "c"), "--split", "test"]) == 0
    md = check_report(tmp_path / "c", ["self"], split="test")
    assert "EncoderClassifier" in md and "the `test` split" in md


def one_error(capsys, argv, pattern):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("numformer analyze: error: ")
    assert re.search(pattern, err), err


def test_an_out_folder_that_cannot_be_written_is_named_before_the_work(runs, tmp_path, capsys, monkeypatch):
    """A read-only place for the report (simulated: tests run as root, whom permissions do not stop) is one line
    before the model is loaded (before: every section was computed, then the write failed)."""
    import errno
    import tempfile

    from numformer.analysis import run_report

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    monkeypatch.setattr(run_report, "load_model", never)
    out = tmp_path / "new" / "report"
    one_error(capsys, ["analyze", str(runs / "char"), "--out", str(out)],
              re.escape(f"--out {out} cannot be written ({tmp_path}: Read-only file system); choose another --out"))
    assert not (tmp_path / "new").exists()


def test_errors(runs, tmp_path, capsys):
    one_error(capsys, ["analyze", str(tmp_path / "missing")], "does not exist.*numformer train")
    bare = tmp_path / "bare"
    shutil.copytree(runs / "char", bare, ignore=shutil.ignore_patterns("report"))
    for f in ("model.safetensors", "checkpoint.safetensors"):
        (bare / f).unlink()
    one_error(capsys, ["analyze", str(bare)], "has no saved weights.*--resume cannot continue it.*--overwrite")
    one_error(capsys, ["analyze", str(runs / "char"), "--text", ""], "has no tokens after tokenization")
    one_error(capsys, ["analyze", str(runs / "copy"), "--src", "   "], "has no tokens after tokenization")
    one_error(capsys, ["analyze", str(runs / "copy"), "--src", "12x"], "'x' is not in the run's vocabulary")
    one_error(capsys, ["analyze", str(runs / "char"), "--tgt", "hello"], "--tgt is for encoder-decoder Transformer")
    one_error(capsys, ["analyze", str(runs / "parity"), "--src", "0101"], "--src is for encoder-decoder")
    one_error(capsys, ["analyze", str(runs / "copy"), "--tgt", "012"], "--tgt needs --src")
    assert not (bare / "report").exists()
