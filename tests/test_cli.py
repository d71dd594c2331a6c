"""The numformer command: parameter report and its errors."""
from __future__ import annotations

from numformer.cli import main


def test_params_command(capsys):
    assert main(["params", "configs/paper_base.toml", "--set", "model.src_vocab_size=100",
                 "--set", "model.tgt_vocab_size=100"]) == 0
    out = capsys.readouterr().out
    assert "3,150,336" in out and "4,199,936" in out and "total" in out


def test_params_bad_key(capsys, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\ntype = "gpt"\nvocab_size = 10\nblock_size = 8\nn_layer = 2\n')
    assert main(["params", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "unknown key(s) ['n_layer']" in err and "n_layers" in err


def test_params_missing_file(capsys):
    assert main(["params", "no/such.toml"]) == 2
    assert "does not exist" in capsys.readouterr().err
