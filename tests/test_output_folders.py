"""Every folder numformer writes is written only when it is new or empty, or with --overwrite (issue 36): run
folders, an experiment's run folders (per seed, per row, beside it), export folders and results folders. An
overwritten export folder holds only the new export's files. Each refusal is one line and changes nothing."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from conftest import one_error_line, tiny_text_toml


def snapshot(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -- export --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """An imported run whose tokenizer has a Hugging Face form (its export writes tokenizer.json and
    tokenizer_config.json) and a character-level run (its export writes neither)."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from numformer.cli import main
    from numformer.data.text import read_corpus
    from numformer.interop.hf import export_hf
    from numformer.models import GPT

    root = tmp_path_factory.mktemp("export")
    text = read_corpus("")[:3000]
    (root / "small.txt").write_text(text)
    hf = root / "hf"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainer=trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    export_hf(GPT(vocab_size=tok.get_vocab_size(), block_size=32, d_model=16, n_heads=2, n_layers=1,
                  rng=np.random.default_rng(0)), hf)
    tok.save(str(hf / "tokenizer.json"))
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
    assert {p.name for p in (tmp_path / "bpe").iterdir()} == set(EXPORT_FILES)


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


@pytest.mark.parametrize("foreign", ["README.md", "sub/notes.txt", "generation_config.json"])
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
