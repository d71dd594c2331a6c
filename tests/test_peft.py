"""LoRA adapters in PEFT's format (numformer.interop.peft): a numformer adapter loaded by peft.PeftModel and a PEFT
adapter loaded by numformer give the same logits (float64, 1e-9), with PEFT's exact key set, for Llama (fused q/k/v
rows of grouped-query attention) and GPT-2 (Conv1D, fan_in_fan_out, c_attn one fused adapter)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from numformer.interop import hf
from numformer.interop.peft import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, REFUSED, adapter_keys, load_adapter,
                                    read_adapter_config, save_adapter)
from numformer.lora import add_lora

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from conftest import interrupt_after_the_header  # noqa: E402
from test_interop_hf import make_hf  # noqa: E402
from test_llama_hf import _float64_arithmetic, make_llama  # noqa: E402

LLAMA = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=24,
             tie_word_embeddings=False, rope_theta=500.0)
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GPT2 = dict(n_embd=16, n_layer=2, n_head=4)
GPT2_TARGETS = ["c_attn", "c_proj", "c_fc"]
IDS = np.random.default_rng(0).integers(0, 300, (2, 9))


def base_models(tmp_path, family):
    """(numformer float64 model, transformers float64 model with float64 arithmetic) of one random base."""
    if family == "llama":
        folder, _ = make_llama(tmp_path, torch_dtype=torch.float64, **LLAMA)
    else:
        folder, _ = make_hf(tmp_path, torch_dtype=torch.float64, **GPT2)
    model, _ = hf.load_pretrained(folder, dtype=np.float64)
    tmodel = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    return model, (_float64_arithmetic(tmodel) if family == "llama" else tmodel)


def peft_logits(pmodel):
    with torch.no_grad():
        return pmodel(torch.from_numpy(IDS)).logits.numpy()


@pytest.mark.parametrize("family,targets", [("llama", LLAMA_TARGETS), ("gpt2", GPT2_TARGETS)])
@pytest.mark.parametrize("use_rslora", [False, True])
def test_numformer_adapter_loads_in_peft_with_the_same_logits(tmp_path, family, targets, use_rslora):
    model, tmodel = base_models(tmp_path, family)
    add_lora(model, r=4, alpha=12, target_modules=targets, use_rslora=use_rslora, rng=1)
    rng = np.random.default_rng(2)
    for name, p in model.named_parameters():
        if name.endswith("lora_B"):
            p.data[...] = 0.2 * rng.standard_normal(p.shape)
    save_adapter(model, tmp_path / "adapter")
    pmodel = peft.PeftModel.from_pretrained(tmodel, str(tmp_path / "adapter")).eval()
    stored = peft.utils.get_peft_model_state_dict(pmodel)
    assert set(stored) == set(adapter_keys(model))                       # PEFT's own key set, no adapter name
    expected_key = ("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight" if family == "llama" else
                    "base_model.model.transformer.h.1.attn.c_attn.lora_B.weight")
    assert expected_key in stored
    assert all(float(v.abs().max()) > 0 for k, v in stored.items())    # every B was read (none left at zero)
    saved = json.loads((tmp_path / "adapter" / ADAPTER_CONFIG).read_text())
    assert saved["fan_in_fan_out"] == (family == "gpt2") and saved["use_rslora"] == use_rslora
    np.testing.assert_allclose(model.eval()(IDS), peft_logits(pmodel), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("family,targets", [("llama", LLAMA_TARGETS[:2] + ["down_proj"]), ("gpt2", GPT2_TARGETS)])
def test_peft_adapter_loads_in_numformer_with_the_same_logits(tmp_path, family, targets):
    model, tmodel = base_models(tmp_path, family)
    torch.manual_seed(0)
    lcfg = peft.LoraConfig(r=3, lora_alpha=7, target_modules=targets, init_lora_weights=False,
                           fan_in_fan_out=family == "gpt2", task_type="CAUSAL_LM")
    pmodel = peft.get_peft_model(tmodel, lcfg).eval()
    pmodel.save_pretrained(tmp_path / "adapter")
    load_adapter(model, tmp_path / "adapter")
    assert model.lora_config["r"] == 3 and model.lora_config["alpha"] == 7
    np.testing.assert_allclose(model.eval()(IDS), peft_logits(pmodel), rtol=1e-9, atol=1e-9)


def test_an_all_linear_peft_adapter_loads_with_the_same_logits(tmp_path):
    """PEFT saves target_modules="all-linear" as the full paths of the modules (model.layers.0.self_attn.q_proj
    ...); numformer matches each by its last part, as PEFT matches names, and refused them before."""
    model, tmodel = base_models(tmp_path, "llama")
    torch.manual_seed(0)
    lcfg = peft.LoraConfig(r=2, lora_alpha=5, target_modules="all-linear", init_lora_weights=False,
                           task_type="CAUSAL_LM")
    pmodel = peft.get_peft_model(tmodel, lcfg).eval()
    pmodel.save_pretrained(tmp_path / "adapter")
    load_adapter(model, tmp_path / "adapter")
    assert sorted(model.lora_config["target_modules"]) == sorted(LLAMA_TARGETS)
    np.testing.assert_allclose(model.eval()(IDS), peft_logits(pmodel), rtol=1e-9, atol=1e-9)


def _adapter(tmp_path):
    model, _ = hf.load_pretrained(make_llama(tmp_path, **LLAMA)[0])
    save_adapter(add_lora(model, r=2), tmp_path / "adapter")
    return tmp_path / "adapter", hf.load_pretrained(tmp_path / "llama")[0]


def test_an_interrupted_adapter_save_leaves_the_previous_adapter_whole(tmp_path, monkeypatch):
    """The adapter's weights go a tensor at a time into a temporary file renamed into place, with PEFT's
    metadata: a save cut short after the header leaves the adapter that was there and no partial file."""
    from safetensors import safe_open

    from numformer.interop import peft as peft_format

    folder, model = _adapter(tmp_path)
    weights = folder / ADAPTER_WEIGHTS
    with safe_open(str(weights), framework="np") as f:
        assert f.metadata() == {"format": "pt"}
    before = weights.read_bytes()
    interrupt_after_the_header(monkeypatch, peft_format)
    with pytest.raises(KeyboardInterrupt):
        save_adapter(add_lora(model, r=3, rng=5), folder)
    assert weights.read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS]


@pytest.mark.parametrize("option,value", [("use_dora", True), ("rank_pattern", {"q_proj": 4}),
                                          ("alpha_pattern", {"q_proj": 4}), ("bias", "all"),
                                          ("modules_to_save", ["lm_head"]), ("layers_to_transform", [0]),
                                          ("alora_invocation_tokens", [42, 99]), ("kasa_config", {"beta": 1e-4}),
                                          ("velora_config", {"num_groups": 64}),
                                          ("monteclora_config", {"num_samples": 8}), ("use_bdlora", {"nblocks": 2}),
                                          ("kasa_config", {}), ("monteclora_config", {}), ("use_bdlora", {}),
                                          ("layers_to_transform", 0), ("bias", None), ("use_dora", 1),
                                          ("loftq_config", {"loftq_bits": 4, "loftq_iter": 1})])
def test_options_numformer_does_not_implement_are_refused_by_name(tmp_path, option, value):
    """aLoRA (PEFT applies it from the invocation tokens on), KaSA, VeLoRA, MonteCLoRA and BD-LoRA loaded as plain
    LoRA once, or were refused as keys or shapes of another base model: each is refused by its option's name. A
    variant's config {} is the variant with PEFT's default options, layers_to_transform 0 the first layer."""
    folder, model = _adapter(tmp_path)
    c = json.loads((folder / ADAPTER_CONFIG).read_text())
    (folder / ADAPTER_CONFIG).write_text(json.dumps({**c, option: value}))
    with pytest.raises(ValueError, match=f"does not implement the PEFT option\\(s\\) {option} = ") as e:
        load_adapter(model, folder)
    assert "\n" not in str(e.value)


def test_a_default_peft_adapter_loads_and_so_does_every_not_used_spelling(tmp_path):
    """PEFT writes each refused option as the first of its "not used" values (``REFUSED``); a default LoRA saved
    by PEFT loads, and its config still reads with each option set to any of those values, or left out as the
    PEFT releases before the option did."""
    model, tmodel = base_models(tmp_path, "llama")
    peft.get_peft_model(tmodel, peft.LoraConfig(task_type="CAUSAL_LM")).save_pretrained(tmp_path / "adapter")
    folder = tmp_path / "adapter"
    saved = json.loads((folder / ADAPTER_CONFIG).read_text())
    assert {k: saved.get(k) for k in REFUSED} == {k: off[0] for k, off in REFUSED.items()}
    load_adapter(model, folder)
    assert model.lora_config["r"] == 8 and sorted(model.lora_config["target_modules"]) == ["q_proj", "v_proj"]
    for option, off in REFUSED.items():
        without = {k: v for k, v in saved.items() if k != option}
        for config in (without, *({**without, option: value} for value in off)):
            (folder / ADAPTER_CONFIG).write_text(json.dumps(config))
            assert read_adapter_config(folder)["r"] == 8, (option, config.get(option, "absent"))


def test_a_peft_adapter_of_some_layers_is_refused_by_name(tmp_path):
    """PEFT writes layers_to_transform=0 (the first layer only) as 0: refused by that option, not as an adapter
    of another base model for its missing keys."""
    model, tmodel = base_models(tmp_path, "llama")
    lcfg = peft.LoraConfig(task_type="CAUSAL_LM", layers_to_transform=0)
    peft.get_peft_model(tmodel, lcfg).save_pretrained(tmp_path / "adapter")
    with pytest.raises(ValueError, match=r"does not implement the PEFT option\(s\) layers_to_transform = 0;"):
        load_adapter(model, tmp_path / "adapter")


@pytest.mark.parametrize("init", ["pissa", "pissa_niter_4", "olora", "corda"])
def test_an_init_peft_runs_again_on_the_base_weights_is_refused_by_name(tmp_path, init):
    """PEFT re-runs PiSSA / OLoRA / CorDA when it loads such an adapter, changing the base layers' weights (its logits
    then differ from the plain LoRA numformer loaded): refused, pointing to PEFT's conversion to plain LoRA."""
    folder, model = _adapter(tmp_path)
    c = json.loads((folder / ADAPTER_CONFIG).read_text())
    (folder / ADAPTER_CONFIG).write_text(json.dumps({**c, "init_lora_weights": init}))
    with pytest.raises(ValueError, match=f"init_lora_weights = '{init}': PEFT runs this initialisation again .* "
                                         f"path_initial_model_for_weight_conversion") as e:
        load_adapter(model, folder)
    assert "\n" not in str(e.value)
    for harmless in (True, False, "gaussian", "orthogonal", "eva", "mica"):   # PEFT loads these as plain LoRA
        (folder / ADAPTER_CONFIG).write_text(json.dumps({**c, "init_lora_weights": harmless}))
        load_adapter(hf.load_pretrained(tmp_path / "llama")[0], folder)


@pytest.mark.parametrize("targets,says", [
    (["q_proj", "lm_head"], r"adapter_config.json: target_modules \['lm_head'\] are not layers numformer puts "
                            r"adapters on; it loads adapters of \['q_proj'"),
    (["c_attn"], r"the adapter blocks.0.self_attn.c_attn has no llama module: a llama model's adapters target")])
def test_an_adapter_on_layers_the_model_lacks_names_its_config_file(tmp_path, targets, says):
    folder, model = _adapter(tmp_path)
    c = json.loads((folder / ADAPTER_CONFIG).read_text())
    (folder / ADAPTER_CONFIG).write_text(json.dumps({**c, "target_modules": targets}))
    with pytest.raises(ValueError, match=says) as e:
        load_adapter(model, folder)
    assert "\n" not in str(e.value)


def test_an_adapter_of_a_gated_feed_forward_on_gpt2_names_its_config_file(tmp_path):
    folder, _ = _adapter(tmp_path)
    c = json.loads((folder / ADAPTER_CONFIG).read_text())
    (folder / ADAPTER_CONFIG).write_text(json.dumps({**c, "target_modules": ["gate_proj"]}))
    gpt2, _ = base_models(tmp_path, "gpt2")
    with pytest.raises(ValueError, match=r"^the adapter .*adapter_config.json does not fit this model: .*"
                                         r"\['gate_proj'\] match no layer of this GPT"):
        load_adapter(gpt2, folder)


def test_wrong_keys_are_refused_never_left_at_zero(tmp_path):
    from safetensors.numpy import load_file, save_file
    folder, model = _adapter(tmp_path)
    tensors = load_file(str(folder / ADAPTER_WEIGHTS))
    renamed = {k.replace("lora_A.weight", "lora_A.default.weight"): v for k, v in tensors.items()}
    save_file(renamed, str(folder / ADAPTER_WEIGHTS))
    with pytest.raises(ValueError, match=r"does not fit this model's adapters: missing \['base_model.model.model"):
        load_adapter(model, folder)


def test_a_key_list_cut_short_says_how_many_it_holds(tmp_path):
    """Every key renamed (2 layers, q_proj and v_proj: 8 keys): the error shows 4 of each list and says so."""
    from safetensors.numpy import load_file, save_file
    folder, model = _adapter(tmp_path)
    tensors = load_file(str(folder / ADAPTER_WEIGHTS))
    save_file({k.replace(".weight", ".default.weight"): v for k, v in tensors.items()}, str(folder / ADAPTER_WEIGHTS))
    with pytest.raises(ValueError, match=r"missing \[.*\] \(4 of 8 shown\), unexpected \[.*\] \(4 of 8 shown\)"):
        load_adapter(model, folder)
    save_file({**tensors, "base_model.model.extra.lora_A.weight": np.zeros((2, 2), np.float32)},
              str(folder / ADAPTER_WEIGHTS))
    with pytest.raises(ValueError, match=r"missing \[\], unexpected \['base_model.model.extra.lora_A.weight'\] \(is"):
        load_adapter(hf.load_pretrained(tmp_path / "llama")[0], folder)


# -- LoRA runs on the command line: export (adapter, --merge), generate --adapter -------------------------------
def cli(*argv):
    from numformer.cli import main
    return main([str(a) for a in argv])


def test_lora_run_exports_as_a_peft_adapter_or_merged_and_generates_with_adapter(tmp_path, capsys):
    from test_interop_hf import TEXT, hf_logits
    from numformer.train import load_model
    (tmp_path / "t.txt").write_text(TEXT)
    tiny = ["--set", "model.n_layers=1", "--set", "model.d_model=16", "--set", f"data.path={tmp_path / 't.txt'}",
            "--set", "data.block_size=8", "--set", "train.processes=1", "--quiet"]
    assert cli("train", "configs/shakespeare_char.toml", "--out", tmp_path / "base", "--set", "train.max_steps=2",
               *tiny) == 0
    assert cli("train", "configs/shakespeare_char.toml", "--out", tmp_path / "lora", "--set", "train.max_steps=3",
               "--set", f"model.init_from={tmp_path / 'base'}", "--set", "lora.r=2", "--set", "train.lr=0.05",
               "--set", 'lora.target_modules=["c_attn", "c_fc"]', *tiny) == 0
    model = load_model(tmp_path / "lora")
    idx = np.array([[1, 2, 3, 4, 5]])
    assert cli("export", tmp_path / "lora", "--out", tmp_path / "adapter") == 0
    assert {"adapter_config.json", "adapter_model.safetensors", "base"} <= {p.name for p in
                                                                         (tmp_path / "adapter").iterdir()}
    assert "peft.PeftModel.from_pretrained" in capsys.readouterr().out
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "adapter" / "base").eval()
    pmodel = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        np.testing.assert_allclose(pmodel(torch.from_numpy(idx)).logits.numpy(), model(idx), rtol=1e-4, atol=1e-5)
    assert cli("export", tmp_path / "lora", "--merge", "--out", tmp_path / "merged") == 0
    np.testing.assert_allclose(hf_logits(tmp_path / "merged", idx), model(idx), rtol=1e-4, atol=1e-5)
    capsys.readouterr()
    args = ("--prompt", "It is a", "--max-new-tokens", 12, "--greedy")
    assert cli("generate", tmp_path / "base", "--adapter", tmp_path / "adapter", *args) == 0
    with_adapter = capsys.readouterr().out
    assert cli("generate", tmp_path / "lora", *args) == 0
    assert capsys.readouterr().out == with_adapter                    # the run itself = base + its adapter
    assert cli("generate", tmp_path / "lora", "--adapter", tmp_path / "adapter", *args) == 2
    assert "is a LoRA run" in capsys.readouterr().err
