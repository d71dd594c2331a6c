"""An error that names a missing optional dependency says how to install it from numformer's checkout (numformer
is not on PyPI: ``pip install "numformer[mpi]"`` would fetch nothing, or a stranger's package)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import one_error_line, src_env, tiny_text_toml
from numformer._install import MissingDependency, install_hint, require

SRC = Path(__file__).resolve().parents[1] / "src" / "numformer"


def test_the_hint_installs_the_checkouts_extra_or_the_package():
    assert install_hint("mpi", "mpi4py mpich") == \
        "pip install -e \".[mpi]\" in numformer's checkout (or pip install mpi4py mpich)"


def test_no_message_installs_numformer_from_an_index():
    found = [f"{path.relative_to(SRC)}:{n}" for path in sorted(SRC.rglob("*.py")) if path.name != "_install.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"numformer\[\w+\]", line)]
    assert not found, f"pip install 'numformer[extra]' fails (numformer is not on PyPI): use install_hint at {found}"


# -- a missing optional package is one error line, before anything runs ------------------------------------------
def test_a_missing_package_is_one_error_line_and_any_other_import_error_a_bug():
    from numformer.cli import error_message

    line = error_message(MissingDependency("BLEU needs sacrebleu, not installed: pip install ..."))
    assert line == "BLEU needs sacrebleu, not installed: pip install ..."
    assert error_message(ImportError("cannot import name 'x' from 'numformer.y'")) is None


def test_require_names_the_feature_the_missing_packages_and_their_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)               # not installed, as importlib sees it
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingDependency) as e:
        require(("numpy", "torch", "transformers"), "the feature")
    assert str(e.value) == ("the feature needs torch and transformers, not installed: pip install -e \".[test]\" in "
                            "numformer's checkout (or pip install torch==2.13.0 transformers)")
    require(("numpy",), "the feature")                            # installed: nothing raised, nothing imported


@pytest.mark.parametrize("argv, needs", [
    (["bench", "throughput", "--quick"], "numformer bench throughput needs torch"),
    (["bench", "generate", "hf-generate", "--quick"], "numformer bench hf-generate needs torch and transformers"),
    (["reproduce", "shakespeare_speedrun_torch", "--quick"],
     "numformer reproduce shakespeare_speedrun_torch needs torch and transformers")])
def test_a_part_or_experiment_without_its_reference_is_refused_before_it_runs(argv, needs, monkeypatch, tmp_path,
                                                                              run_cli):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(*argv, *(["--out", "res"] if argv[0] == "bench" else ["--results", "res", "--runs", "r"]))
    line = one_error_line(rc, err, argv[0])
    assert needs in line and "pip install -e \".[test]\"" in line and "torch==2.13.0" in line
    assert list(tmp_path.iterdir()) == []                         # nothing ran, nothing written (generate neither)


def test_byte_level_bpe_without_regex_is_one_error_line(tmp_path):
    """In a fresh process (this one may hold a compiled split pattern already), as the command line runs."""
    text = tmp_path / "small.txt"
    text.write_text("to be or not to be, that is the question\n" * 40, encoding="utf-8")
    cfg = tmp_path / "c.toml"
    cfg.write_text(tiny_text_toml(text).replace('block_size = 16', 'block_size = 16\ntokenizer = "bpe"\n'
                                                                   'vocab_size = 280'), encoding="utf-8")
    hidden = ("import sys; sys.modules['regex'] = None; from numformer.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", hidden, "train", str(cfg), "--out", str(tmp_path / "run"), "--quiet"],
                          capture_output=True, text=True, env=src_env(), timeout=120)
    line = one_error_line(done.returncode, done.stderr, "train")
    assert "byte-level BPE" in line and "needs regex" in line and "pip install -e \".[nlp]\"" in line
    assert not (tmp_path / "run").exists()


def test_every_declared_package_says_what_installs_it():
    """Each bench part's REQUIRES and each experiment's requires name packages of PROVIDED_BY (a name missing
    there would fail as a KeyError, reported as a bug, instead of saying what to install)."""
    from numformer._install import PROVIDED_BY
    from numformer.bench.runner import available_parts, load_part
    from numformer.experiments import EXPERIMENTS

    declared = {f"bench {p}": getattr(load_part(p), "REQUIRES", ()) for p in available_parts()}
    declared.update({f"reproduce {name}": exp.requires for name, exp in EXPERIMENTS.items()})
    unknown = {k: [m for m in v if m not in PROVIDED_BY] for k, v in declared.items()}
    assert not {k: v for k, v in unknown.items() if v}, unknown
    assert declared["bench tokenizer"] == ("tokenizers", "regex") and declared["bench mpi"] == ("mpi4py",)


def test_a_translation_run_without_sacrebleu_is_refused_before_it_trains(tmp_path):
    """BLEU is the task's test metric, computed after the last step: the task refuses to be built without it."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\ntype = "transformer"\nn_layers = 1\nn_heads = 2\nd_model = 16\n'
                   '[data]\ntask = "multi30k"\n[train]\nmax_steps = 2\nbatch_size = 4\nprocesses = 1\n',
                   encoding="utf-8")
    hidden = ("import sys; sys.modules['sacrebleu'] = None; from numformer.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", hidden, "train", str(cfg), "--out", str(tmp_path / "run"), "--quiet"],
                          capture_output=True, text=True, env=src_env(), timeout=120)
    line = one_error_line(done.returncode, done.stderr, "train")
    assert "the multi30k task (its test BLEU) needs sacrebleu" in line and "pip install -e \".[nlp]\"" in line
    assert not (tmp_path / "run").exists()
