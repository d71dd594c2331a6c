"""Regression tests of the analysis tools' defects found by a user trial: each test fails on the code
before its fix (tiny float64 models, seconds)."""
from __future__ import annotations

import numpy as np

from numformer import analysis as A
from numformer.models import GPT


def test_allowed_reflects_each_layers_sliding_window():
    # layer 0 slides over 3 keys, layer 1 attends to everything (Gemma 2's alternating layers)
    model = GPT(20, 16, n_layers=2, n_heads=2, d_model=8, rng=0, dtype=np.float64,
                layers=[{"sliding_window": 3}, {}]).eval()
    for block in model.blocks:              # zero q/k projections: uniform over the allowed keys
        block.self_attn.qkv_proj.weight.data[:16] = 0
    maps = A.attention_maps(model, np.arange(8))
    allowed = maps.allowed["self"][:, 0, 0]
    i, j = np.arange(8)[:, None], np.arange(8)[None, :]
    np.testing.assert_array_equal(allowed[0], (j <= i) & (i - j < 3))
    np.testing.assert_array_equal(allowed[1], j <= i)
    entropy = A.head_statistics(maps)["self"]["normalized_entropy"]
    np.testing.assert_allclose(entropy, 1.0, atol=1e-9)


def _tiny_gpt():
    return GPT(20, 16, n_layers=2, n_heads=2, d_model=8, rng=0, dtype=np.float64)


def _check_dla_adds_up(model):
    ids = np.arange(7)[None]
    logits = model(ids)
    dla = A.direct_logit_attribution(model, ids, tokens=3, baseline_tokens=5)
    np.testing.assert_allclose(dla.total(), dla.logit, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dla.logit, logits[:, -1, 3] - logits[:, -1, 5], rtol=1e-6, atol=1e-9)


def test_direct_logit_attribution_includes_a_lora_adapter_on_o_proj():
    from numformer.lora import add_lora

    model = _tiny_gpt()
    add_lora(model, r=2, alpha=4, target_modules=["o_proj"], rng=0)
    for name, p in model.named_parameters():        # a trained adapter: B no longer zero
        if "lora_B" in name:
            p.data[...] = np.random.default_rng(1).normal(0, 0.5, p.data.shape)
    _check_dla_adds_up(model.eval())


def test_direct_logit_attribution_reads_a_quantized_models_dequantized_weights():
    from numformer.quantize.layer import quantize_model

    model = _tiny_gpt()
    quantize_model(model, bits=8)
    _check_dla_adds_up(model.eval())


def test_analyze_on_a_hugging_face_folder_says_what_it_is_and_which_command_reads_it(tmp_path, capsys):
    import json

    from numformer.cli import main

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["X"],
                                                      "hidden_size": 8}), encoding="utf-8")
    assert main(["analyze", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "is a Hugging Face checkpoint, not a numformer run folder" in err
    assert "numformer import-hf" in err and "numformer explore" in err and "a typo" not in err


def test_analyze_split_test_on_a_text_run_is_refused_naming_its_splits(tmp_path, capsys, monkeypatch):
    from numformer.analysis import run_report
    from numformer.cli import main
    from numformer.experiments.runner import find_config

    tiny = ["model.n_layers=1", "model.d_model=16", "model.n_heads=2", "train.max_steps=2",
            "train.eval_every=2", "train.checkpoint_every=2", "train.warmup_steps=0",
            "data.block_size=16", "train.eval_batches=1"]
    sets = [x for item in tiny for x in ("--set", item)]
    run = tmp_path / "char"
    assert main(["train", str(find_config("shakespeare_char")), "--out", str(run), *sets, "--quiet"]) == 0
    capsys.readouterr()

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the split was checked")

    monkeypatch.setattr(run_report, "load_model", no_model)     # refused before the slow part
    assert main(["analyze", str(run), "--split", "test", "--no-ablation", "--no-occlusion"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "has no test split, only train and val; use --split val" in err


def _raises_one_line(fn, pattern):
    import pytest

    with pytest.raises(ValueError, match=pattern) as info:
        fn()
    assert "\n" not in str(info.value)


def test_bad_arguments_of_the_analysis_api_are_one_clear_value_error():
    model = _tiny_gpt().eval()
    ids = np.array([1, 2, 3, 4])
    _raises_one_line(lambda: A.direct_logit_attribution(model, ids, tokens=999), r"tokens 999 .*\[0, 20\)")
    _raises_one_line(lambda: A.direct_logit_attribution(model, ids, tokens=3, baseline_tokens=-1),
                     r"baseline_tokens -1 .*\[0, 20\)")
    _raises_one_line(lambda: A.direct_logit_attribution(model, ids, tokens=3, position=10),
                     r"position 10 is outside the input's 4 positions")
    _raises_one_line(lambda: A.activation_patching(model, ids, ids[::-1].copy(), A.LogitDifference(999, 1)),
                     r"LogitDifference's answer 999 .*\[0, 20\)")
    _raises_one_line(lambda: A.gradient_x_input(model, ids, target=999), r"target token 999 .*\[0, 20\)")
    _raises_one_line(lambda: A.attention_maps(model, ids).plot("cross"),
                     r"no attention group 'cross' .*\['self'\]")
    _raises_one_line(lambda: A.head_statistics({"self": np.ones((1, 1, 2, 4, 4))}),
                     r"AttentionMaps .* got a dict")
    _raises_one_line(lambda: A.head_scores(model, batch=1), r"seq_len <= 8")


def test_more_bad_arguments_of_the_analysis_api_are_one_clear_value_error():
    model = _tiny_gpt().eval()
    ids = np.array([[1, 2, 3, 4]])
    _raises_one_line(lambda: A.attribution_patching(model, ids, ids[:, ::-1].copy(), A.LogitDifference(99, 2)),
                     r"LogitDifference's answer 99 .*\[0, 20\)")
    _raises_one_line(lambda: A.attribution_patching(model, ids, ids[:, ::-1].copy(), A.LogitDifference(1, 99)),
                     r"LogitDifference's wrong 99 .*\[0, 20\)")
    _raises_one_line(lambda: A.attribution_patching(model, ids, ids, A.LogitDifference(1, 2, position=10)),
                     r"LogitDifference's position 10 is outside the input's 4 positions")
    _raises_one_line(lambda: A.LogitDifference([1, 2, 3], 2)(np.zeros((2, 4, 20))),
                     r"answer must be one token id or one per batch row \(2\), got shape \(3,\)")
    _raises_one_line(lambda: A.ablate_heads(model, [("self", 0, 1.5)]).__enter__(),
                     r"the head of \('self', 0, 1.5\) must be an integer index")
    _raises_one_line(lambda: A.ablate_heads(model, [("self", "0", 1)]).__enter__(),
                     r"the layer of \('self', '0', 1\) must be an integer index")
    assert all(m.head_mask is None for _, m in A.attention_modules(model)["self"])
    _raises_one_line(lambda: A.head_scores(model, seq_len=4, batch=0), r"batch must be an integer >= 1, got 0")
    _raises_one_line(lambda: A.head_scores(model, seq_len=1), r"seq_len must be an integer >= 2, got 1 \(with one "
                                                                r"token repeated, the induction target is the current")
    scores = A.head_scores(model, seq_len=4, batch=1)
    _raises_one_line(lambda: scores.top("inductin"), r"no head score 'inductin'.*did you mean 'induction'")
    _raises_one_line(lambda: scores.plot("copying"), r"no head score 'copying'; the scores are previous_token")
    _raises_one_line(lambda: A.direct_logit_attribution(model, np.vstack([ids, ids]), tokens=[1, 2, 3]),
                     r"tokens must be one token id or one per batch row \(2\), got shape \(3,\)")


def test_the_ablation_metric_text_says_a_fixed_sample_spread_over_the_split():
    from numformer.analysis import run_report

    class Task:
        def describe(self):
            return "a task"

    _, _, text = run_report._ablation_metric(Task(), None, {"train": {"batch_size": 64}}, "val")
    assert "fixed sample of 4 × 32 sequences spread over the `val` split" in text
    assert "first" not in text


def test_the_report_names_the_occlusion_id_and_why():
    from numformer.analysis import report

    model = _tiny_gpt()                                 # a char-like GPT: no <unk>, no padding id
    words = report._occlusion_ids(model, None, lambda ids: ["\n" if i == 0 else str(i) for i in ids])
    assert words.startswith("id 0 (`'\\n'`)") and "no `<unk>` and no padding id" in words
    assert "a real token" in words
    assert report._occlusion_ids(model, 7) == "id 7"
