"""A Hugging Face model's side files (tokenizer_config.json with its special tokens and chat template,
chat_template.jinja, generation_config.json) go with it: into the run folder import-hf writes and into the runs
fine-tuned from it (their tokenizer.json keeps them), to ``numformer chat``, and out again through ``export``,
where transformers reads them as it read the original. import-hf and export dropped them: a Llama 3 Instruct
import chatted in numformer's plain format, and its export had no end token and GPT-2's special tokens."""
from __future__ import annotations

import json

import pytest

from numformer.commands.chat import sampling_settings
from numformer.data.chat import ChatFormat, model_eos_ids
from numformer.interop.sources import load

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_chat import _args  # noqa: E402
from test_chat_templates import model_folder  # noqa: E402

MESSAGES = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {"role": "user", "content": "Hello! How are you today?"}]


def cli(*argv):
    from numformer.cli import main
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    """A tiny random Llama 3 Instruct-like folder: three end ids, <|eot_id|> the tokenizer's eos_token, a
    chat template, sampling settings; (folder, transformers' tokenizer, the end ids)."""
    folder, hf_tok = model_folder(tmp_path_factory.mktemp("side"), "llama-3")
    ids = hf_tok.convert_tokens_to_ids
    eos = [ids("<|end_of_text|>"), ids("<|eom_id|>"), ids("<|eot_id|>")]
    config = transformers.LlamaConfig(vocab_size=len(hf_tok), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=128, bos_token_id=ids("<|begin_of_text|>"),
                                      eos_token_id=eos)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "eos_token_id": eos,
         "bos_token_id": ids("<|begin_of_text|>")}))
    return folder, hf_tok, eos


def test_an_imported_run_chats_and_stops_as_its_model(llama3, tmp_path):
    folder, hf_tok, eos = llama3
    run = tmp_path / "run"
    assert cli("import-hf", folder, "--out", run, "--block-size", 32) == 0
    theirs, ours = load(folder)[1], load(run)[1]
    assert ours.eos_id == hf_tok.convert_tokens_to_ids("<|eot_id|>") and sorted(ours.eos_ids) == sorted(eos)
    for tokenizer, where in ((theirs, folder), (ours, run)):
        fmt = ChatFormat.from_folder(where, tokenizer=tokenizer)
        assert not fmt.is_default
        assert fmt.render(MESSAGES, True) == hf_tok.apply_chat_template(MESSAGES, tokenize=False,
                                                                         add_generation_prompt=True)
        assert model_eos_ids(where, tokenizer) == sorted(eos)
        assert sampling_settings(_args(), where, tokenizer)[0] == {"greedy": False, "temperature": 0.6,
                                                                   "top_k": 50, "top_p": 0.9}


def test_export_writes_the_side_files_transformers_reads(llama3, tmp_path):
    folder, hf_tok, eos = llama3
    run, out = tmp_path / "run", tmp_path / "exported"
    assert cli("import-hf", folder, "--out", run, "--block-size", 32) == 0
    assert cli("export", run, "--out", out) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == eos and config["bos_token_id"] == hf_tok.convert_tokens_to_ids(
        "<|begin_of_text|>")
    for name in ("tokenizer_config.json", "generation_config.json"):
        assert json.loads((out / name).read_text()) == json.loads((folder / name).read_text())
    exported = transformers.AutoTokenizer.from_pretrained(out)
    assert (exported.bos_token, exported.eos_token) == ("<|begin_of_text|>", "<|eot_id|>")
    assert exported.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == \
        hf_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert transformers.GenerationConfig.from_pretrained(out).eos_token_id == eos


def test_export_names_every_file_it_writes_and_overwrites_them(llama3, tmp_path, capsys):
    """The side files export writes are its own: the line it prints names each, and --overwrite into the same
    folder replaces them. Before, the line left out generation_config.json, chat_template.jinja and
    special_tokens_map.json, and --overwrite refused them as files export does not write."""
    import shutil

    from numformer.commands.export import EXPORT_FILES

    folder = tmp_path / "model"
    shutil.copytree(llama3[0], folder)
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>",
                                                                "eos_token": "<|eot_id|>"}))
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages[0]['content'] }}")
    run, out = tmp_path / "run", tmp_path / "exported"
    assert cli("import-hf", folder, "--out", run, "--block-size", 32) == 0
    expected = ["additional_chat_templates/tool_use.jinja", "chat_template.jinja", "config.json",
                "generation_config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json",
                "tokenizer_config.json"]
    for again in ([], ["--overwrite"]):
        capsys.readouterr()
        assert cli("export", run, "--out", out, *again) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.startswith(f"wrote {out}: {', '.join(expected)}; load it with ")
        files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
        assert files == expected and {f for f in files if "/" not in f} <= set(EXPORT_FILES)
    assert transformers.AutoTokenizer.from_pretrained(out).chat_template["tool_use"] == \
        "{{ messages[0]['content'] }}"


def test_export_hf_writes_no_file_but_side_files(llama3, tmp_path):
    """export_hf writes only files --overwrite knows as an export's: a tokenizer given another file's name (in
    Python, not read from a run, whose tokenizer.json is checked) is refused before anything is written."""
    from numformer.interop.hf import export_hf

    model, tok = load(llama3[0])
    tok.files = {**tok.files, "notes.txt": "mine"}
    with pytest.raises(TypeError, match="files is not an object of a Hugging Face model's side files"):
        export_hf(model, tmp_path / "out", tok)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("with_template", [True, False])
def test_a_fine_tuned_run_keeps_the_template_it_learned(llama3, tmp_path, with_template):
    """[data] chat_template's text goes into the run's tokenizer.json (numformer chat on the run used the plain
    format); without it the run learns the plain format, and the base model's template is dropped."""
    from numformer.train import Trainer

    folder, hf_tok, _ = llama3
    template = tmp_path / "template.jinja"
    template.write_text(hf_tok.chat_template, encoding="utf-8")
    data = tmp_path / "chats.json"
    data.write_text(json.dumps([{"messages": MESSAGES + [{"role": "assistant", "content": "I am fine."}]}] * 6))
    config = {"model": {"init_from": str(folder)},
              "data": {"task": "chat", "path": str(data), "chat_template": str(template) if with_template else "",
                       "block_size": 96},
              "train": {"max_steps": 1, "batch_size": 2, "processes": 1, "eval_every": 1}}
    Trainer(config, tmp_path / "sft", quiet=True).train()
    tokenizer = load(tmp_path / "sft")[1]
    fmt = ChatFormat.from_folder(tmp_path / "sft", tokenizer=tokenizer)
    assert fmt.is_default != with_template
    if with_template:
        assert fmt.template == hf_tok.chat_template


def test_a_tokenizer_json_naming_a_file_elsewhere_is_refused(llama3, tmp_path):
    """export writes the side files by their names: an edited tokenizer.json may not name a path outside them."""
    from numformer.data.tokenizers import tokenizer_from_dict

    folder = llama3[0]
    run = tmp_path / "run"
    assert cli("import-hf", folder, "--out", run, "--block-size", 32) == 0
    state = json.loads((run / "tokenizer.json").read_text())
    for name in ("../../escaped.json", "additional_chat_templates/../../x.jinja", "config.json"):
        bad = {**state, "files": {**state["files"], name: {"a": 1}}}
        with pytest.raises(TypeError, match="files is not an object of a Hugging Face model's side files"):
            tokenizer_from_dict(bad)
    good = {**state, "files": {**state["files"], "additional_chat_templates/tool-use.jinja": "{{ 1 }}"}}
    assert "additional_chat_templates/tool-use.jinja" in tokenizer_from_dict(good).files


def test_a_chat_template_file_that_is_not_utf8_is_refused_naming_it(tmp_path):
    """chat_template.jinja with a byte that is not UTF-8: transformers' tokenizer refuses the file, so numformer
    does too, in one line naming it (before: the byte was replaced and the template rendered otherwise)."""
    from numformer.data.tokenizers.pretrained import side_files

    (tmp_path / "chat_template.jinja").write_bytes(b"{{ messages[0]['content'] }}\xff")
    with pytest.raises(ValueError) as e:
        side_files(tmp_path)
    assert str(e.value) == (f"{tmp_path / 'chat_template.jinja'} is not UTF-8 text (invalid start byte at byte 28); "
                            f"restore it, or give a template with --chat-template FILE")
