"""LoRA adapters (numformer.lora): names as Hugging Face's, the fused q/k/v rows of grouped-query attention,
PEFT's initialisation, frozen base weights, gradients, merge_lora, the [lora] config section and exact resume."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from numformer.gradcheck import check_gradients
from numformer.lora import TARGET_MODULES, add_lora, lora_adapters, merge_lora
from numformer.models import GPT
from numformer.train import Trainer, resolve_config

from conftest import assert_gradcheck
from test_train import checkpoint_arrays, config, read_metrics


def llama_like(dtype=np.float64, seed=0):
    return GPT(vocab_size=23, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2, block_size=16, positional="rope",
               activation="swiglu", norm="rms", bias=False, rng=seed, dtype=dtype)


def gpt2_like(dtype=np.float64, seed=0):
    return GPT(vocab_size=23, d_model=24, n_layers=2, n_heads=4, block_size=16, positional="learned",
               activation="gelu_tanh", norm="layer", rng=seed, dtype=dtype)


def randomize_adapters(model, seed=1):
    rng = np.random.default_rng(seed)
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data[...] = rng.standard_normal(p.shape) * 0.3


IDS = np.random.default_rng(0).integers(0, 23, (2, 7))


def test_adapters_are_named_as_hugging_face_names_the_projections():
    model = add_lora(llama_like(), r=4, alpha=8,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    shapes = {n: p.shape for n, p in model.named_parameters() if "lora_" in n}
    head = 24 // 4
    assert shapes["blocks.0.self_attn.q_proj.lora_A"] == (4, 24)        # A (r, in)
    assert shapes["blocks.0.self_attn.q_proj.lora_B"] == (4 * head, 4)  # B (out, r): the query rows
    assert shapes["blocks.1.self_attn.k_proj.lora_B"] == (2 * head, 4)  # key and value rows: n_kv_heads high
    assert shapes["blocks.1.self_attn.v_proj.lora_B"] == (2 * head, 4)
    assert shapes["blocks.0.self_attn.o_proj.lora_B"] == (24, 4)
    assert shapes["blocks.1.ff.down_proj.lora_A"] == (4, model.config.layers[0].d_ff)
    assert {n.rsplit(".", 2)[1] for n in shapes} == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                      "up_proj", "down_proj"}
    assert len(shapes) == 2 * 2 * 7
    base = {n for n, _ in llama_like().named_parameters()}
    assert base == {n for n, _ in model.named_parameters()} - set(shapes)   # the base keeps its names


def test_gpt2_names_c_attn_is_one_adapter_on_the_fused_rows():
    model = add_lora(gpt2_like(), r=2, target_modules=["c_attn", "c_proj", "c_fc"])
    shapes = {n: p.shape for n, p in model.named_parameters() if "lora_" in n}
    assert shapes["blocks.0.self_attn.c_attn.lora_B"] == (3 * 24, 2)
    assert shapes["blocks.0.self_attn.c_proj.lora_B"] == (24, 2)
    assert shapes["blocks.0.ff.c_proj.lora_A"] == (2, 4 * 24)
    assert shapes["blocks.1.ff.c_fc.lora_B"] == (4 * 24, 2)


def test_each_fused_adapter_changes_its_own_rows_only():
    model = add_lora(llama_like(), r=3, target_modules=["k_proj"])
    randomize_adapters(model)
    attn = model.blocks[0].self_attn
    x = np.random.default_rng(2).standard_normal((2, 5, 24))
    base = attn.qkv_proj._base(x)                                         # the frozen layer alone
    delta = attn.qkv_proj(x) - base
    head = 6
    assert np.all(delta[..., :4 * head] == 0) and np.all(delta[..., 6 * head:] == 0)   # q and v rows untouched
    assert np.abs(delta[..., 4 * head:6 * head]).max() > 1e-3


def test_initialised_as_peft_does_and_the_model_unchanged():
    torch = pytest.importorskip("torch")
    model = llama_like()
    before = model(IDS)
    add_lora(model, r=16, alpha=32, target_modules=["q_proj", "v_proj"], rng=0)
    np.testing.assert_array_equal(model(IDS), before)                     # B = 0: ΔW = 0
    A = np.concatenate([a.lora_A.data.ravel() for _, a, _, _ in lora_adapters(model)])
    bound = 1 / math.sqrt(24)                                            # kaiming_uniform(a=√5) on (r, in)
    assert np.abs(A).max() <= bound and np.abs(A).max() > 0.9 * bound
    t = torch.empty(16, 24, dtype=torch.float64)
    torch.nn.init.kaiming_uniform_(t, a=math.sqrt(5))                     # what PEFT's reset_lora_parameters draws
    assert abs(float(t.abs().max()) - bound) < 0.1 * bound
    assert all(np.all(a.lora_B.data == 0) for _, a, _, _ in lora_adapters(model))
    assert {a.scaling for _, a, _, _ in lora_adapters(model)} == {2.0}
    rs = add_lora(llama_like(), r=16, alpha=32, use_rslora=True)
    assert {a.scaling for _, a, _, _ in lora_adapters(rs)} == {32 / 4}   # α / √r


@pytest.mark.parametrize("training", [False, True])
def test_the_adapters_take_the_models_mode(training):
    """An eval() model stays deterministic with adapters of dropout 0.5 (PEFT's from_pretrained gives an eval
    model); a model in training mode applies their dropout."""
    model = llama_like().train(training)
    add_lora(model, r=4, alpha=8, target_modules=["q_proj", "v_proj"], dropout=0.5, rng=0)
    randomize_adapters(model)
    layers = [m for _, m in model.named_modules() if "lora" in type(m).__name__.lower()]
    assert layers and all(m.training == training for m in layers)
    first, second = model(IDS), model(IDS)
    assert np.array_equal(first, second) != training
    model.eval()
    np.testing.assert_array_equal(model(IDS), model(IDS))


def test_base_frozen_and_gradients_reach_the_adapters_only():
    model = add_lora(llama_like(), r=2, target_modules=["q_proj", "v_proj", "down_proj"])
    randomize_adapters(model)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    logits = model(IDS)
    model.backward(np.ones_like(logits))
    for name, p in model.named_parameters():
        assert (p.grad is not None) == ("lora_" in name), name


@pytest.mark.parametrize("targets", [["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"], ["c_attn", "c_fc"]])
def test_lora_model_gradcheck(targets):
    model = add_lora(llama_like() if targets[0] == "q_proj" else gpt2_like(), r=2, target_modules=targets,
                     dropout=0.0)
    randomize_adapters(model)
    R = np.random.default_rng(3).standard_normal((2, 7, 23))
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    picked = dict(list(params.items())[:4] + list(params.items())[-2:])

    def backward(dy):
        model.zero_grad()
        model(IDS)
        model.backward(dy)
        return {n: p.grad for n, p in picked.items()}

    assert_gradcheck(check_gradients(lambda: model(IDS), backward, {n: p.data for n, p in picked.items()}))
    del R


@pytest.mark.parametrize("make,targets", [(llama_like, ["q_proj", "v_proj", "o_proj", "up_proj"]),
                                          (gpt2_like, ["c_attn", "c_proj"])])
def test_merge_lora_keeps_the_logits_and_the_base_names(make, targets):
    model = add_lora(make(), r=3, alpha=5, target_modules=targets)
    randomize_adapters(model)
    adapted = model(IDS)
    merge_lora(model)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in make().named_parameters()]
    np.testing.assert_allclose(model(IDS), adapted, rtol=1e-10, atol=1e-10)
    assert all(p.requires_grad for p in model.parameters())
    add_lora(model, r=2)                                                 # merged: adapters may be added again


@pytest.mark.parametrize("options,message", [
    ({"target_modules": ["q_proj", "qkv"]}, r"unknown layer name\(s\) \['qkv'\]; valid names: \['q_proj'"),
    ({"r": 0}, r"r = 0 should be an integer >= 1"),
    ({"alpha": -1}, r"alpha = -1 should be a number > 0"),
    ({"dropout": 1.0}, r"dropout = 1.0 should be in \[0, 1\)"),
    ({"target_modules": ["c_attn", "q_proj"]}, "overlaps q_proj"),
    ({"target_modules": ["o_proj", "c_proj"]}, r"o_proj overlaps c_proj: both adapt self_attn\.out_proj"),
    ({"target_modules": ["v_proj", "c_attn"]}, r"v_proj overlaps c_attn: both adapt the value rows of self_attn"),
    ({"target_modules": ["c_fc"]}, r"match no layer of this GPT; its layers answer to \['q_proj'"),
])
def test_bad_options_are_one_line_naming_the_valid_ones(options, message):
    with pytest.raises(ValueError, match=message) as e:
        add_lora(llama_like(), **options)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("targets", [["o_proj", "c_proj"], ["c_proj", "o_proj"], ["c_attn", "k_proj"]])
def test_two_names_reaching_the_same_rows_are_refused(targets):
    """Two adapters on one layer's rows (o_proj and GPT-2's c_proj both on out_proj) are refused as c_attn with
    q_proj is; names on different rows of the fused q/k/v matrix, or on different layers, are not."""
    with pytest.raises(ValueError, match=f"{targets[0]} overlaps {targets[1]}"):
        add_lora(gpt2_like(), target_modules=targets)
    add_lora(llama_like(), target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"])
    add_lora(gpt2_like(), target_modules=["c_attn", "c_proj", "c_fc"])


@pytest.mark.parametrize("unload", ["unload_lora", "merge_lora"])
def test_removing_the_adapters_gives_back_the_trainable_flags_of_before(unload):
    """A parameter frozen before add_lora stays frozen after unload_lora (and merge_lora); the others trainable
    again, also a base parameter whose flag was changed while the adapters were on."""
    import numformer.lora

    model = gpt2_like()
    model.tok_emb.weight.requires_grad = False
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    add_lora(model, r=2, target_modules=["c_attn", "c_fc"])
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    model.tok_emb.weight.requires_grad = True                           # unfrozen while the adapters are on
    getattr(numformer.lora, unload)(model)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before
    assert not model.tok_emb.weight.requires_grad and model.blocks[0].norm1.weight.requires_grad
    add_lora(model, r=2)                                                # recorded afresh: the same flags again
    numformer.lora.unload_lora(model)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before


def lora_config(**lora):
    c = config(max_steps=30)
    c["model"].update(n_heads=4, n_kv_heads=2, positional="rope", activation="swiglu", norm="rms", dropout=0.0)
    c["lora"] = {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj", "down_proj"], **lora}
    return c


@pytest.mark.parametrize("lora,message", [
    ({"r": 0}, r"\[lora\] r = 0 is out of range; r must be an integer >= 1"),
    ({"target_modules": ["attn"]}, r"\[lora\] target_modules = \['attn'\] is not allowed \(did you mean 'c_attn'\?\); "
                                   r"target_modules must be a list of strings with entries among \['q_proj'"),
    ({"rank": 4}, r"unknown key\(s\) \['rank'\] in \[lora\]"),
])
def test_bad_lora_section_is_one_line(lora, message):
    c = lora_config(**lora)
    with pytest.raises(ValueError, match=message) as e:
        resolve_config(c)
    assert "\n" not in str(e.value)
    if "target_modules" in lora:                                        # every valid name listed
        assert all(repr(name) in str(e.value) for name in TARGET_MODULES)


def test_lora_run_trains_the_adapters_only_and_resumes_bit_exact(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    trainer = Trainer(lora_config(), straight, quiet=True)
    base = {n: p.data.copy() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    trainer.train()
    for n, p in trainer.model.named_parameters():
        if "lora_" not in n:
            np.testing.assert_array_equal(p.data, base[n], err_msg=n)    # frozen: unchanged by training
    assert any(np.abs(p.data).max() > 0 for n, p in trainer.model.named_parameters() if n.endswith("lora_B"))
    saved = checkpoint_arrays(straight)
    adapters = sorted(v.shape for k, v in saved.items() if "lora_" in k)
    assert sorted(v.shape for k, v in saved.items() if k.endswith(".exp_avg")) == adapters   # AdamW's moments:
    assert sum(k.startswith("optim/") for k in saved) == 2 * len(adapters) == 12              # the adapters' only
    assert json.loads((straight / "config.json").read_text())["lora"]["r"] == 4

    Trainer(lora_config(), resumed, quiet=True).train(stop_after=20)
    Trainer(None, resumed, resume=True, quiet=True).train()
    a, b = checkpoint_arrays(straight), checkpoint_arrays(resumed)
    assert set(a) == set(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    assert [r.get("train_loss") for r in read_metrics(straight)] == [r.get("train_loss") for r in read_metrics(resumed)]


def test_a_lora_run_s_first_line_counts_what_it_trains(tmp_path):
    """The start line gives the total and the trained count (the adapters; the base is frozen), as `params`."""
    from numformer.train.build import describe_run

    trainer = Trainer(lora_config(), tmp_path / "run", quiet=True)
    total = trainer.model.num_parameters()
    trained = sum(p.size for p in trainer.model.parameters() if p.requires_grad)
    line = describe_run(trainer.model, total, trainer.task, trainer.config)
    assert 0 < trained < total and f"with {total:,} parameters ({trained:,} trained, the rest frozen);" in line
    assert "PEFT" not in line                           # Llama's names on a Llama-style base: it exports
    fused = Trainer(lora_config(target_modules=["c_attn"]), tmp_path / "fused", quiet=True)
    note = describe_run(fused.model, fused.model.num_parameters(), fused.task, fused.config).splitlines()[-1]
    assert note.startswith("note: this run will not export as a PEFT adapter: the adapter ")
    assert "numformer export --merge" in note and '"q_proj"' in note


def test_a_case_only_typo_in_target_modules_suggests_that_name():
    from numformer.keys import did_you_mean

    assert did_you_mean(["Q_proj"], ["q_proj", "v_proj"]) == " (did you mean 'q_proj'?)"


def test_a_lora_run_loads_with_its_adapters(tmp_path):
    from numformer.train.run import load_model
    trainer = Trainer(lora_config(), tmp_path / "run", quiet=True)
    trainer.train()
    model = load_model(tmp_path / "run")
    assert model.lora_config["target_modules"] == ["q_proj", "v_proj", "down_proj"]
    ids = np.array([[1, 2, 3, 4]])
    np.testing.assert_array_equal(model(ids), trainer.model.eval()(ids))


def test_a_run_fine_tuning_a_lora_run_starts_from_its_merged_weights(tmp_path):
    """init_from a LoRA run (its weights hold the adapters): the new run's model is the LoRA model merged, with
    the same logits, and may carry adapters of its own."""
    from numformer.lora import merge_lora
    from numformer.train.run import load_model

    Trainer(lora_config(), tmp_path / "lora", quiet=True).train()
    merged = merge_lora(load_model(tmp_path / "lora"))
    for lora in (None, {"r": 2, "alpha": 4, "dropout": 0.0, "target_modules": ["o_proj"]}):
        c = lora_config()
        c["model"]["init_from"] = str(tmp_path / "lora")
        c["train"]["max_steps"] = 1
        del c["lora"]
        if lora:
            c["lora"] = lora
        trainer = Trainer(c, tmp_path / f"next_{lora is not None}", quiet=True)
        start = trainer.model.state_dict()
        for name, value in merged.state_dict().items():
            np.testing.assert_array_equal(start[name], value, err_msg=name)
        ids = np.array([[1, 2, 3, 4]])
        np.testing.assert_allclose(trainer.model.eval()(ids), load_model(tmp_path / "lora")(ids),   # float32: the
                                   rtol=1e-5, atol=1e-6)                  # merge rounds W + s·BA once


def test_lora_without_init_from_is_warned_about(tmp_path, capsys):
    """[lora] on a model trained from scratch trains adapters on a random frozen base: the run says so at its
    start (and not when [model] init_from names the model to fine-tune)."""
    Trainer(lora_config(), tmp_path / "scratch").train(stop_after=1)
    warning = "warning: [lora] adapters without [model] init_from train on a random, frozen base"
    assert warning in capsys.readouterr().err
    base = lora_config()
    del base["lora"]
    Trainer(base, tmp_path / "base", quiet=True).train(stop_after=1)
    tuned = lora_config()
    tuned["model"]["init_from"] = str(tmp_path / "base")
    Trainer(tuned, tmp_path / "tuned").train(stop_after=1)
    assert "warning" not in capsys.readouterr().err
