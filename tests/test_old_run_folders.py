"""Run folders written before models were described by a GPTConfig (tests/fixtures/old_runs: a GPT-2-style and a
Llama-style GPT trained 3 steps in float64 by numformer at commit 7b092cd, Muon for the second) still load, generate
and resume; resumed here to step 6 they give the weights and losses that the old code's own resume gave.

float64, compared to 1e-12: the fixtures were made on one CPU and the tests run on others, and BLAS picks its kernels
per CPU (OpenBLAS's Haswell and SkylakeX kernels sum in different orders). In float32 that moves a loss in its 8th
digit, so float32 bit equality would test the CPU, not the code; in float64 the CPUs agree to ~1e-15, and any change
of what the code computes (a missing step, a reset moment, another learning rate) shows far above 1e-12."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import numformer
from numformer.train import load_config_json, load_model

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "old_runs"


@pytest.fixture(params=["gpt", "llama"])
def old_run(request, tmp_path):
    run = tmp_path / request.param
    shutil.copytree(FIXTURES / request.param, run)
    return request.param, run


def test_an_old_run_folder_loads_as_it_was_written(old_run):
    name, run = old_run
    saved = json.loads((run / "config.json").read_text())["model"]
    assert "head_dim" not in saved and "layers" not in saved             # written before those keys existed
    model = load_model(run)
    again, tokenizer = numformer.load(run)
    for (n, p), (_, q) in zip(model.named_parameters(), again.named_parameters()):
        assert np.array_equal(p.data, q.data), n
    assert tokenizer is not None
    assert model.config.n_layers == saved["n_layers"] and model.config.layers[0].n_heads == saved["n_heads"]
    assert load_config_json(run)["model"]["type"] == "gpt"


def test_an_old_run_folder_resumes_as_the_old_code_did(old_run, run_cli):
    from safetensors.numpy import load_file

    name, run = old_run
    rc, _, err = run_cli("train", "--resume", "--out", run, "--set", "train.max_steps=6", "--quiet")
    assert rc == 0, err
    expected = json.loads((FIXTURES / f"{name}_resumed_metrics.json").read_text())
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for key in ("train_loss", "val_loss"):
        got = {str(m["step"]): m[key] for m in lines if key in m and m["step"] > 3}
        assert got.keys() == expected[key].keys(), key
        for step, value in expected[key].items():
            assert got[step] == pytest.approx(value, rel=1e-12, abs=0), (key, step)
    want = load_file(str(FIXTURES / f"{name}_resumed_model.safetensors"))
    got = load_file(str(run / "model.safetensors"))
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == np.float64 and got[k].shape == want[k].shape, k
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-15, err_msg=k)


def test_an_old_run_folder_generates_and_fine_tunes(old_run, run_cli, tmp_path):
    name, run = old_run
    rc, out, err = run_cli("generate", run, "--prompt", "1", "--max-new-tokens", "3", "--greedy")
    assert rc == 0, err
    toml = tmp_path / "ft.toml"
    toml.write_text(f'[model]\ninit_from = "{run}"\n[data]\ntask = "copy"\nlength = 4\nn_val = 16\nn_test = 16\n'
                    f'[train]\nmax_steps = 1\nbatch_size = 4\nprocesses = 1\n')
    rc, _, err = run_cli("train", toml, "--out", tmp_path / "ft", "--quiet")
    assert rc == 0, err
