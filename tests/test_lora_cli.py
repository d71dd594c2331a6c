"""LoRA runs on the command line: `numformer params` counts the model as training builds it (adapters listed,
trainable count), and `numformer export` of adapters a GPT-2-family base has no module for says what to do."""
from __future__ import annotations

import json

import pytest

from numformer.config import apply_overrides, load_config, resolve_config
from numformer.train.build import build_trained_model

from conftest import tiny_copy_toml

LORA = ["--set", "lora.r=4", "--set", "lora.alpha=8"]          # the default targets: q_proj and v_proj


def _row(out, label):
    """The count on the line starting with ``label``."""
    line = next(line for line in out.splitlines() if line.startswith(label))
    return int(line[len(label):].split()[0].replace(",", ""))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """(config, run folder) of a 2-step LoRA run with adapters on Llama's names (q_proj, v_proj) of a GPT-2-like
    model (learned positions), trained without init_from."""
    from numformer.cli import main

    root = tmp_path_factory.mktemp("lora")
    cfg = root / "copy.toml"
    cfg.write_text(tiny_copy_toml(model={"n_layers": 2}, max_steps=2, batch_size=4, eval_every=2, processes=1))
    assert main(["train", str(cfg), "--out", str(root / "run"), "--quiet", *LORA]) == 0
    return cfg, root / "run"


def test_params_counts_the_adapters_as_training_builds_the_model(run_cli, lora_run):
    cfg, run = lora_run
    config, _ = resolve_config(apply_overrides(load_config(cfg), [a for a in LORA if a != "--set"]))
    trained = build_trained_model(config, 0, "float32", resume=False)
    total, trainable = trained.num_parameters(), sum(p.size for p in trained.parameters() if p.requires_grad)
    assert 0 < trainable < total
    for source, overrides in ((cfg, LORA), (run, [])):                  # a config with [lora], and the run
        rc, out, err = run_cli("params", source, *overrides)
        assert rc == 0, err
        assert _row(out, "total") == total
        assert _row(out, "trainable") == trainable
        assert _row(out, "LoRA adapters (r = 4, alpha = 8)") == trainable
        assert _row(out, "  self_attn.q_proj (2 layers)") + _row(out, "  self_attn.v_proj (2 layers)") == trainable
        assert _row(out, "      q_proj") == 2 * 4 * 16                    # the first layer's adapter, in the table
    assert json.loads((run / "summary.json").read_text())["parameters"] == total
    rc, out, _ = run_cli("params", cfg)                                 # without [lora]: nothing frozen
    assert rc == 0 and "trainable" not in out and "LoRA" not in out and _row(out, "total") < total


def test_export_of_adapters_gpt2_has_no_module_for_says_merge_or_gpt2_names(cli_error, run_cli, lora_run, tmp_path):
    _, run = lora_run
    line = cli_error("export", run, "--out", tmp_path / "adapter")
    assert "has no gpt2 module" in line and "target ['q_proj', 'v_proj']" in line
    assert "numformer export --merge" in line and 'target_modules = ["c_attn", "c_proj", "c_fc"]' in line
    assert not (tmp_path / "adapter").exists()                           # nothing left behind
    rc, out, err = run_cli("export", run, "--merge", "--out", tmp_path / "merged")  # what the error advises
    assert rc == 0, err
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    before = {p.name: p.read_bytes() for p in (tmp_path / "merged").iterdir()}
    assert "numformer export --merge" in cli_error("export", run, "--out", tmp_path / "merged", "--overwrite")
    assert {p.name: p.read_bytes() for p in (tmp_path / "merged").iterdir()} == before   # refused before clearing
