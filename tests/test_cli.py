"""The numformer command: its listing, the parameter report and its errors."""
from __future__ import annotations

import pytest

from numformer.cli import main


def test_plain_numformer_lists_the_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: numformer")
    for command in ("train", "generate", "reproduce", "exercises", "import-hf"):
        assert f"\n    {command}" in out, command


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



def _total(out):
    return int(next(line for line in out.splitlines() if line.startswith("total")).split()[-1].replace(",", ""))


def _built_total(config_path):
    """The parameter count of the model of a config whose task is built (its data read)."""
    from numformer.config import load_config, resolve_config
    from numformer.models import build_model

    return build_model(resolve_config(load_config(config_path))[0]["model"]).num_parameters()


@pytest.mark.parametrize("task,model,extra,embedding", [
    ("imdb", "classifier", 'tokenizer = "bpe"\nvocab_size = 16000\nmax_len = 512', 16000 * 16),
    ("agnews", "classifier", "vocab_size = 5000", 5000 * 16),
    ("multi30k", "transformer", "joint_vocab = true\nvocab_size = 8000", 8000 * 16),
])
def test_params_of_a_builtin_dataset_reads_no_data(run_cli, tmp_path, monkeypatch, task, model, extra, embedding):
    """The sizes of IMDB, AG News and Multi30k come from [data] alone: the data path need not even exist."""
    import numformer.data

    def no_data(*args, **kwargs):
        raise AssertionError("params built the task")

    monkeypatch.setattr(numformer.data, "make_task", no_data)
    cfg = tmp_path / f"{task}.toml"
    cfg.write_text(f'[model]\ntype = "{model}"\nd_model = 16\nn_heads = 2\nn_layers = 1\nd_ff = 32\n'
                   f'[data]\ntask = "{task}"\npath = "no/such/folder"\n{extra}\n')
    rc, out, err = run_cli("params", cfg)
    assert rc == 0, err
    assert "no data read" in out and "the most the tokenizer holds" in out
    assert f"{embedding:,}" in out                   # the token embedding, at the configured cap


def test_params_without_data_equals_the_built_model(run_cli, tmp_path):
    """Where the vocabulary built reaches its cap, the count without data is the trained model's exactly."""
    from test_data_loaders import write_imdb_tarball

    tarball = write_imdb_tarball(tmp_path / "imdb.tar.gz")
    cfg = tmp_path / "imdb.toml"
    cfg.write_text(f'[model]\ntype = "classifier"\nd_model = 16\nn_heads = 2\nn_layers = 1\nd_ff = 32\n'
                   f'[data]\ntask = "imdb"\npath = "{tarball}"\nvocab_size = 6\nmin_freq = 1\nval_size = 1\n')
    rc, out, err = run_cli("params", cfg)
    assert rc == 0, err
    assert _total(out) == _built_total(cfg)


def test_params_of_the_default_corpus_and_of_a_text_file(run_cli, tmp_path):
    """Tiny Shakespeare's 65 characters are known; a user's text file is read to count its characters."""
    rc, out, _ = run_cli("params", "configs/shakespeare_char.toml")
    assert rc == 0 and "no data read" in out and _total(out) == _built_total("configs/shakespeare_char.toml")
    (tmp_path / "t.txt").write_text("abcabc" * 50)
    cfg = tmp_path / "t.toml"
    cfg.write_text(f'[model]\ntype = "gpt"\nd_model = 16\nn_heads = 2\nn_layers = 1\n'
                   f'[data]\ntask = "text"\npath = "{tmp_path / "t.txt"}"\nblock_size = 8\n')
    rc, out, _ = run_cli("params", cfg)
    assert rc == 0 and "sizes from the text task's data" in out and _total(out) == _built_total(cfg)
