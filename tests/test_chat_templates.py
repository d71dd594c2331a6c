"""Chat templates (``numformer.data.chat``): templates in the prompt formats of today's small chat models
rendered as transformers' ``apply_chat_template`` renders them, same string and same token ids.

The templates in tests/chat_templates/ are written for these tests (README.md there): each follows one
family's prompt format and uses the Jinja features the families' own templates use (macros, namespaces,
loop controls, tojson with indent, strftime_now, raise_exception, string methods, default variables).
Each test model folder holds a small byte-level BPE tokenizer (the tokenizers library) with the
template's special tokens, wrapped in transformers' ``PreTrainedTokenizerFast`` and saved with
``save_pretrained``: transformers reads it back with ``AutoTokenizer``, numformer with its own loaders.
"""
from __future__ import annotations

import copy
import json
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from numformer.data import chat
from numformer.data.chat import ChatFormat, apply_chat_template, generation_spans, read_chat_template
from numformer.interop.hf import load_tokenizer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

TEMPLATES = Path(__file__).parent / "chat_templates"
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|eom_id|>", "<|python_tag|>"]
CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# name: (template file, named special tokens, special tokens, added non-special tokens)
MODELS = {
    "llama-3": ("llama3.jinja", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, LLAMA_SPECIALS, []),
    "chatml-tools": ("chatml-tools.jinja", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, CHATML,
                     ["<tool_call>", "</tool_call>"]),
    "chatml-thinking": ("chatml-thinking.jinja", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, CHATML,
                        ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]),
    "gemma": ("gemma.jinja", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
              ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"], []),
    "chatml": ("chatml-default-system.jinja", {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                                               "unk_token": "<|endoftext|>", "pad_token": "<|im_end|>"}, CHATML, []),
}
CORPUS = ["You are a helpful assistant. Answer briefly.", "What is the capital of France? Paris is.",
          "Hello! How are you today? I am fine, thank you.", "Tell me a joke about numbers: 2 + 2 = 4.",
          "Cutting Knowledge Date: December 2023 Today Date: 26 Jul 2024", "Déjà vu — naïve café ☕ 東京"]


def tiny_tokenizer(specials, added, vocab_size=400):
    """A byte-level BPE trained on CORPUS, with ``specials`` as special and ``added`` as plain added tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok.add_tokens(added)
    return tok


def model_folder(tmp_path, name):
    """A tokenizer folder for MODELS[name] written by transformers; (folder, transformers' tokenizer read back)."""
    file, named, specials, added = MODELS[name]
    template = (TEMPLATES / file).read_text(encoding="utf-8")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer(specials, added), chat_template=template,
                                              **named)
    folder = tmp_path / name
    hf.save_pretrained(folder)
    return folder, transformers.AutoTokenizer.from_pretrained(folder)


SYSTEM_CHAT = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."},
               {"role": "user", "content": "Hello! How are you today?"},
               {"role": "assistant", "content": "I am fine, thank you. "},
               {"role": "user", "content": "  What is the capital of France?\n"}]
NO_SYSTEM = [{"role": "user", "content": "Tell me a joke about numbers."},
             {"role": "assistant", "content": "2 + 2 = 4."},
             {"role": "user", "content": "Déjà vu — naïve café ☕ 東京"},
             {"role": "assistant", "content": "Paris is."}]
THINKING = [{"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4."},
            {"role": "user", "content": "And 3 + 3?"},
            {"role": "assistant", "content": "6.", "reasoning_content": "Add again."},
            {"role": "user", "content": "Thanks!"}]
TOOLS = [{"type": "function", "function": {"name": "capital", "description": "The capital of a country",
                                           "parameters": {"type": "object", "properties": {
                                               "country": {"type": "string", "description": "Its name"}},
                                               "required": ["country"]}}}]
CASES = [  # (model, conversation, add_generation_prompt, extra template variables, tools)
    *[(m, SYSTEM_CHAT, True, {}, None) for m in MODELS],
    *[(m, NO_SYSTEM, False, {}, None) for m in MODELS],
    *[(m, SYSTEM_CHAT[:2], False, {}, None) for m in MODELS],
    ("llama-3", SYSTEM_CHAT, True, {"date_string": "01 Feb 2025"}, None),
    ("llama-3", SYSTEM_CHAT, True, {"date_string": "01 Feb 2025"}, TOOLS),
    ("llama-3", SYSTEM_CHAT, True, {"tools_in_user_message": False}, TOOLS),
    ("chatml-tools", SYSTEM_CHAT, True, {}, TOOLS),
    ("chatml-tools", NO_SYSTEM[:1], True, {}, None),
    ("chatml-thinking", THINKING, True, {}, None),
    ("chatml-thinking", THINKING, True, {"enable_thinking": False}, None),
    ("chatml-thinking", THINKING, True, {"enable_thinking": True}, None),
    ("chatml-thinking", [SYSTEM_CHAT[0], *THINKING], False, {"enable_thinking": False}, TOOLS),
    ("gemma", SYSTEM_CHAT[:1] + NO_SYSTEM, True, {}, None),
    ("chatml", NO_SYSTEM[:3], True, {}, None),
]


@pytest.mark.parametrize("model, conversation, generation, variables, tools", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rendered_text_and_ids_equal_transformers(tmp_path, model, conversation, generation, variables, tools):
    folder, hf = model_folder(tmp_path, model)
    kw = dict(add_generation_prompt=generation, tools=tools, **variables)
    expected = hf.apply_chat_template(copy.deepcopy(conversation), tokenize=False, **kw)
    expected_ids = hf.apply_chat_template(copy.deepcopy(conversation), tokenize=True, return_dict=False, **kw)
    template, tokens = read_chat_template(folder)
    text = apply_chat_template(conversation, template, generation, tools=tools, special_tokens=tokens, **variables)
    assert text == expected
    fmt = ChatFormat.from_folder(folder, variables)
    assert fmt.render(conversation, generation) == expected or tools is not None
    ids = load_tokenizer(folder).encode(text)
    assert ids == list(expected_ids)
    assert len(ids) > 10 and any(i >= 0 for i in ids)


def test_the_conversations_exercise_the_templates(tmp_path):
    """The cases are not vacuous: each model's markers, the default system prompts, the thinking switch."""
    def render(model, conversation, **kw):
        folder, hf = model_folder(tmp_path / f"{model}-{len(kw)}", model)
        return hf.apply_chat_template(conversation, tokenize=False, **kw)

    assert render("gemma", SYSTEM_CHAT, add_generation_prompt=True).startswith(
        "<bos><start_of_turn>user\nYou are a helpful assistant. Answer briefly.\n\nHello!")
    assert "<start_of_turn>model\nI am fine, thank you.<end_of_turn>" in render("gemma", SYSTEM_CHAT)
    assert render("chatml-tools", NO_SYSTEM).startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")
    assert "You are a small helpful assistant." in render("chatml", NO_SYSTEM)
    assert render("chatml-thinking", THINKING, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render("chatml-thinking", THINKING, add_generation_prompt=True).endswith("<|im_start|>assistant\n")
    assert "Today Date: 01 Feb 2025" in render("llama-3", SYSTEM_CHAT, date_string="01 Feb 2025")


def test_strftime_now_is_the_date_of_the_day(tmp_path, monkeypatch):
    """The Llama 3 format dates its system prompt with strftime_now: both renderers on the same fixed clock."""
    class Clock(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2025, 3, 9, 12, 0, 0)

    import transformers.utils.chat_template_utils as tu

    monkeypatch.setattr(tu, "datetime", Clock)
    monkeypatch.setattr(chat, "datetime", Clock)
    tu._compile_jinja_template.cache_clear()
    folder, hf = model_folder(tmp_path, "llama-3")
    expected = hf.apply_chat_template(SYSTEM_CHAT, tokenize=False, add_generation_prompt=True)
    assert "Today Date: 09 Mar 2025" in expected
    assert ChatFormat.from_folder(folder).render(SYSTEM_CHAT, True) == expected


def test_gemma_refuses_roles_that_do_not_alternate_as_transformers(tmp_path):
    folder, hf = model_folder(tmp_path, "gemma")
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(Exception, match="must alternate"):
        hf.apply_chat_template(bad, tokenize=False)
    with pytest.raises(ValueError, match="the chat template refused the conversation: Conversation roles must alt"):
        ChatFormat.from_folder(folder).render(bad)


TOY = ("{% for m in messages %}{{ m.role }}:{{ m.content }}|{% if m.thinking is defined %}t={{ m.thinking }}|"
       "{% endif %}{% if m.name is defined %}name={{ m.name }}{% endif %}{% endfor %}\n    {% if true %}\n"
       "indented\n    {% endif %}\n{{ bos_token }}{{ extra | tojson }}{{ {'é': [1, 2]} | tojson(indent=2) }}"
       "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
       "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}{{ dict(a=1) }}"
       "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
       "{% endif %}{% endfor %}")


def test_environment_features_equal_transformers(tmp_path):
    """tojson (non-ASCII kept, indent), loop controls, namespace, dict, None values dropped, reasoning aliases,
    {% generation %} spans, kwargs over special tokens."""
    folder, hf = model_folder(tmp_path, "chatml")
    conversation = [{"role": "user", "content": "x", "name": None},
                    {"role": "assistant", "content": "yz", "reasoning": "r"},
                    {"role": "assistant", "content": "w"}]
    expected = hf.apply_chat_template(copy.deepcopy(conversation), chat_template=TOY, tokenize=False,
                                      extra={"k": "ü"}, bos_token="B")
    got = apply_chat_template(conversation, TOY, special_tokens={"bos_token": "<|im_start|>"}, extra={"k": "ü"},
                              bos_token="B")
    assert got == expected and '"ü"' in got and "t=r|" in got and "name=" not in got and "|indented\nB" in got
    text, spans = generation_spans(conversation, TOY, extra={"k": "ü"})
    masks = hf.apply_chat_template(copy.deepcopy(conversation), chat_template=TOY, tokenize=True,
                                   return_assistant_tokens_mask=True, extra={"k": "ü"})
    assert [text[a:b] for a, b in spans] == ["yz", "w"] and text.endswith("yzw") and sum(masks["assistant_masks"])


def test_namespace_refuses_underscore_names():
    with pytest.raises(Exception, match="underscore"):
        apply_chat_template([{"role": "user", "content": "x"}], "{% set ns = namespace(_x=1) %}{{ ns }}")


def test_folder_forms_equal_transformers(tmp_path):
    """tokenizer_config.json with a template string, a list of named templates or an object of them by name (which
    transformers keeps as it is), chat_template.jinja plus additional_chat_templates/ (which win over
    tokenizer_config.json), special_tokens_map.json (legacy)."""
    folder, _ = model_folder(tmp_path, "chatml")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    source = (folder / "chat_template.jinja").read_text()
    variants = {
        "string": {"chat_template": source},
        "named": {"chat_template": [{"name": "default", "template": source},
                                    {"name": "short", "template": "{{ messages[-1]['content'] }}!"}]},
        "by_name": {"chat_template": {"default": source, "short": "{{ messages[-1]['content'] }}!"}},
    }
    for name, extra in variants.items():
        other = tmp_path / name
        shutil.copytree(folder, other)
        (other / "chat_template.jinja").unlink()
        (other / "tokenizer_config.json").write_text(json.dumps({**config, **extra}))
        hf = transformers.AutoTokenizer.from_pretrained(other)
        template, tokens = read_chat_template(other)
        assert template == hf.chat_template and tokens == hf.special_tokens_map, name
    template, _ = read_chat_template(tmp_path / "named")
    assert apply_chat_template(NO_SYSTEM, template, template_name="short") == "Paris is.!"
    extra_dir = folder / "additional_chat_templates"
    extra_dir.mkdir()
    (extra_dir / "tool_use.jinja").write_text("tools: {{ tools | length }}")
    (config_path).write_text(json.dumps({**config, "chat_template": "ignored", "bos_token": "<s>"}))
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": {"content": "<|im_start|>"}}))
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    template, tokens = read_chat_template(folder)
    assert template == hf.chat_template and set(template) == {"default", "tool_use"}
    assert tokens == hf.special_tokens_map and tokens["bos_token"] == "<|im_start|>"
    assert apply_chat_template(NO_SYSTEM, template, tools=TOOLS) == \
        hf.apply_chat_template(NO_SYSTEM, tools=TOOLS, tokenize=False) == "tools: 1"
    assert apply_chat_template(NO_SYSTEM, template) == hf.apply_chat_template(NO_SYSTEM, tokenize=False)


def test_clear_errors():
    with pytest.raises(ValueError, match="not valid Jinja"):
        apply_chat_template([{"role": "user", "content": "x"}], "{% for %}")
    with pytest.raises(ValueError, match="non-empty list"):
        apply_chat_template([], "x")
    with pytest.raises(ValueError, match="none is called 'default'"):
        apply_chat_template([{"role": "user", "content": "x"}], {"a": "x", "b": "y"})
    with pytest.raises(ValueError, match="no chat template"):
        apply_chat_template([{"role": "user", "content": "x"}], None)
    with pytest.raises(ValueError, match=r"the chat template is a int \(5\), not a string"):   # was Jinja's TypeError
        apply_chat_template([{"role": "user", "content": "x"}], 5)
    with pytest.raises(ValueError, match="JSON schemas"):
        apply_chat_template([{"role": "user", "content": "x"}], "x", tools=[print])


@pytest.fixture
def without_jinja2(monkeypatch):
    """Importing jinja2 fails from here on (and no template compiled before is reused)."""
    import builtins

    real_import = builtins.__import__

    def no_jinja(name, *args, **kwargs):
        if name.startswith("jinja2"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_jinja)
    chat.compile_chat_template.cache_clear()
    yield
    chat.compile_chat_template.cache_clear()


def test_missing_jinja2_is_one_clear_error(without_jinja2):
    with pytest.raises(ValueError, match=r"needs jinja2, which is not installed: pip install -e \"\.\[chat\]\" in "
                                         r"numformer's checkout"):
        apply_chat_template([{"role": "user", "content": "x"}], "{{ 1 }}")


@pytest.fixture
def default_format_by_jinja():
    """Conversations and what Jinja renders of them with DEFAULT_TEMPLATE, without and with the prompt."""
    conversations = [[{"role": "system", "content": "Be kind."}, {"role": "user", "content": " Hi \n"}],
                     [{"role": "USER", "content": "é, 🙂"}, {"role": "assistant", "content": "Hello.", "x": None},
                      {"role": "user", "content": None}],
                     [{"role": "assistant", "content": ["a", 1]}, {"content": "no role"}]]
    jinja_rendered = [chat.compile_chat_template(chat.DEFAULT_TEMPLATE).render(
        messages=chat._messages(c), add_generation_prompt=g) for c in conversations for g in (False, True)]
    assert jinja_rendered[1] == "System: Be kind.\n\nUser: Hi\n\nAssistant:"
    return conversations, jinja_rendered


def test_the_default_format_needs_no_jinja2_and_renders_as_jinja_does(default_format_by_jinja, without_jinja2):
    conversations, jinja_rendered = default_format_by_jinja
    assert [apply_chat_template(c, chat.DEFAULT_TEMPLATE, g) for c in conversations for g in (False, True)] \
        == jinja_rendered
    assert ChatFormat.default().render(conversations[0], True) == jinja_rendered[1]
    assert generation_spans(conversations[0], chat.DEFAULT_TEMPLATE) == (jinja_rendered[0], [])


def test_default_format_for_models_without_a_template(tmp_path):
    fmt = ChatFormat.from_folder(tmp_path)          # an empty folder: no template
    assert fmt.is_default and fmt.stop_strings
    text = fmt.render([{"role": "system", "content": "Be kind."}, {"role": "user", "content": " Hi "}], True)
    assert text == "System: Be kind.\n\nUser: Hi\n\nAssistant:"
