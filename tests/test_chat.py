"""``numformer chat`` and ``ChatSession``: a tiny random Llama saved with transformers, with SmolLM2's chat
template (ChatML) and a small byte-level BPE tokenizer (tests/test_chat_templates.py), fed from a pipe."""
from __future__ import annotations

import argparse
import io
import json
import re
import sys

import numpy as np
import pytest

from numformer.commands.chat import load_chat_model, sampling_settings
from numformer.data.chat import ChatFormat, ChatSession, _Reply, stop_token_ids
from numformer.data.tokenizers import CharTokenizer
from numformer.decoding import generate

from conftest import one_error_line
from test_chat_templates import model_folder, without_jinja2  # noqa: F401 -- without_jinja2: a fixture

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SYSTEM = "You are a helpful assistant."


def chat_folder(tmp_path, max_positions=256, seed=0):
    """A random Llama (SmolLM2's architecture, tiny) with SmolLM2's tokenizer files and chat template."""
    folder, hf_tok = model_folder(tmp_path, "chatml")
    config = transformers.LlamaConfig(vocab_size=len(hf_tok), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=max_positions, tie_word_embeddings=True,
                                      bos_token_id=hf_tok.convert_tokens_to_ids("<|im_start|>"),
                                      eos_token_id=hf_tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def session_for(folder, **kw):
    model, tokenizer, folder = load_chat_model(folder)
    fmt = ChatFormat.from_folder(folder)
    kw.setdefault("stop_tokens", stop_token_ids(folder, tokenizer, fmt))
    return ChatSession(model, tokenizer, fmt, **{"system": SYSTEM, "greedy": True, "max_new_tokens": 6, **kw})


def chat(run_cli, monkeypatch, folder, lines, *flags, system=SYSTEM):
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    return run_cli("chat", folder, *(["--system", system] if system else []), *flags)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return chat_folder(tmp_path_factory.mktemp("chat"))


def test_chat_answers_each_line_from_a_pipe(folder, run_cli, monkeypatch):
    rc, out, err = chat(run_cli, monkeypatch, folder, "Hello there!\n\n  \nWhat is the capital of France?\n",
                        "--greedy", "--max-new-tokens", "6")
    session = session_for(folder)
    first, second = session.send("Hello there!"), session.send("What is the capital of France?")
    assert rc == 0 and out == first + "\n" + second + "\n" and first and second
    assert "Traceback" not in err and "no chat template" not in err
    assert [m["role"] for m in session.messages()] == ["system", "user", "assistant", "user", "assistant"]


def test_reply_is_the_greedy_generation_up_to_the_stop_token(folder, run_cli, monkeypatch):
    """The reply's tokens are generate's (same prompt, greedy, KV cache) up to the first stop token, which
    may come from generation_config.json's eos_token_id list (as Llama 3's <|eot_id|>, Gemma's <end_of_turn>)."""
    session = session_for(folder, stop_tokens=[], max_new_tokens=12)
    prompt = session.format.encode(session.tokenizer, [{"role": "system", "content": SYSTEM},
                                                       {"role": "user", "content": "Hi"}], True)
    tokens = generate(session.model, prompt, 12, greedy=True)[len(prompt):].tolist()
    stop = tokens[3]
    k = tokens.index(stop)
    expected = session.tokenizer.decode(tokens[:k], skip_special=True)
    assert session.send("Hi") == session.tokenizer.decode(tokens, skip_special=True)     # no stop: all 12
    assert session_for(folder, stop_tokens=[stop], max_new_tokens=12).send("Hi") == expected
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop, 1], "do_sample": False}))
    try:
        model, tokenizer, _ = load_chat_model(folder)
        assert stop in stop_token_ids(folder, tokenizer, ChatFormat.from_folder(folder))
        rc, out, err = chat(run_cli, monkeypatch, folder, "Hi\n", "--max-new-tokens", "12")   # greedy: do_sample false
        assert rc == 0 and out == expected + "\n"
    finally:
        (folder / "generation_config.json").unlink()


def test_chat_quantized_to_int8(folder, run_cli, monkeypatch, cli_error):
    """`--quantize int8` replies from int8 weights: the same replies as a session over the quantized model, and
    the report of what was quantized on stderr; --group-size alone is refused."""
    from numformer.quantize import QuantizedLinear, quantize_model

    rc, out, err = chat(run_cli, monkeypatch, folder, "Hello there!\n", "--greedy", "--max-new-tokens", "6",
                        "--quantize", "int8", "--group-size", "16")
    session = session_for(folder)
    quantize_model(session.model, group_size=16)
    assert isinstance(session.model.blocks[0].self_attn.qkv_proj, QuantizedLinear)
    assert rc == 0 and out == session.send("Hello there!") + "\n" and "int8 (groups of 16)" in err
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\n"))
    assert "add --quantize int8" in cli_error("chat", folder, "--group-size", "16")


def test_reset_and_quit(folder, run_cli, monkeypatch):
    rc, out, err = chat(run_cli, monkeypatch, folder, "Hello\n/reset\nHello\n/quit\nnever answered\n", "--greedy")
    fresh = session_for(folder, max_new_tokens=512).send("Hello")
    assert rc == 0 and out == fresh + "\n" + fresh + "\n" and "cleared" in err
    session = session_for(folder)
    session.send("Hello")
    before = session.format.render(session.messages() + [{"role": "user", "content": "Hello"}], True)
    session.reset()
    assert session.messages() == [{"role": "system", "content": SYSTEM}]
    assert before != session.format.render(session.messages() + [{"role": "user", "content": "Hello"}], True)


def test_history_is_trimmed_to_the_context_keeping_the_system_prompt(tmp_path, run_cli, monkeypatch):
    small = chat_folder(tmp_path, max_positions=96)
    session = session_for(small, max_new_tokens=8)
    dropped = 0
    for i in range(6):
        before = len(session.history)
        session.send(f"Tell me a joke about numbers, number {i}.")
        dropped += session.dropped
        assert len(session.history) == before + 2 - 2 * session.dropped        # whole turns are dropped
        ids = session.format.encode(session.tokenizer, session.messages()[:-1], True)
        assert len(ids) <= 96 - 8
        assert session.messages()[0]["role"] == "system" and session.messages()[1]["role"] == "user"
    assert dropped > 0 and session.history[-2]["content"] == "Tell me a joke about numbers, number 5."
    lines = "".join(f"Tell me a joke about numbers, number {i}.\n" for i in range(6))
    rc, out, err = chat(run_cli, monkeypatch, small, lines + "word " * 200 + "\nHi\n", "--greedy",
                        "--max-new-tokens", "8")
    assert "dropped the" in err and "oldest turn" in err
    assert [line for line in err.splitlines() if line.startswith("numformer chat: error: ")] == \
        [next(line for line in err.splitlines() if "more than the model's context of 96" in line)]
    assert rc == 2 and out.count("\n") >= 7           # the long message failed; the next one was answered


def test_reply_never_streams_a_stop_string_or_half_of_one():
    tok = CharTokenizer(sorted(set("Hello\nUser: x!")))
    pieces = []
    reply = _Reply(tok, stop_tokens=[], stop_strings=("\nUser:",), stream=pieces.append)
    ended = [reply.add(i) for i in tok.encode("Hello!\nUser: x")]
    assert ended.index(True) == len("Hello!\nUser:") - 1
    assert reply.finish() == "Hello!" and "".join(pieces) == "Hello!"
    assert pieces[-1] == "!" and "\n" not in "".join(pieces)
    held = _Reply(tok, stop_tokens=[], stop_strings=("\nUser:",), stream=None)
    for i in tok.encode("Hello\nUs"):
        held.add(i)
    assert held.shown == len("Hello") and held.finish() == "Hello\nUs"


def test_a_model_without_a_template_gets_the_default_format(tmp_path, run_cli, monkeypatch):
    """A run folder (here imported from a GPT-2 folder without a chat template): numformer's plain format,
    said once on stderr; the reply ends at the tokenizer's eos."""
    from test_interop_hf import TEXT, make_hf, save_tokenizer

    folder, _ = make_hf(tmp_path, n_embd=16, n_layer=1, n_head=2)
    save_tokenizer(folder)
    (tmp_path / "text.txt").write_text(TEXT * 3)
    assert run_cli("import-hf", folder, "--out", tmp_path / "run", "--data", tmp_path / "text.txt",
                   "--block-size", 32)[0] == 0
    rc, out, err = chat(run_cli, monkeypatch, tmp_path / "run", "It is a truth\n", "--max-new-tokens", "5",
                        "--seed", "1", system=None)
    assert rc == 0 and out.endswith("\n") and err.count("no chat template") == 1, err
    model, tokenizer, run = load_chat_model(tmp_path / "run")
    fmt = ChatFormat.from_folder(run)
    assert fmt.is_default and stop_token_ids(run, tokenizer, fmt) == [tokenizer.eos_id]


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    """A character-level run trained here (4 steps, a context of 64 characters): no chat template."""
    from conftest import tiny_text_toml
    from numformer.cli import main
    from numformer.data.text import read_corpus

    root = tmp_path_factory.mktemp("char")
    (root / "small.txt").write_text(read_corpus("")[:3000])
    (root / "text.toml").write_text(tiny_text_toml(str(root / "small.txt")))
    assert main(["train", str(root / "text.toml"), "--out", str(root / "run"), "--quiet",
                 "--set", "data.block_size=64"]) == 0
    return root / "run"


def test_a_character_level_run_trained_here_chats_in_the_default_format(char_run, run_cli, monkeypatch):
    rc, out, err = chat(run_cli, monkeypatch, char_run, "Speak, hear me.\n", "--max-new-tokens", "20",
                        "--seed", "0", system=None)
    assert rc == 0 and "no chat template" in err and len(out) > 1, err
    model, tokenizer, run = load_chat_model(char_run)
    session = ChatSession(model, tokenizer, ChatFormat.from_folder(run), max_new_tokens=20, rng=0)
    assert session.send("Speak, hear me.") + "\n" == out
    with pytest.raises(ValueError, match="written in the chat format, cannot be encoded: 1 character.*'G'"):
        session.send("Good morrow")
    assert len(session.history) == 2                    # the failed message is not kept


def _args(**kw):
    return argparse.Namespace(**{"temperature": None, "top_k": None, "top_p": None, "greedy": False, **kw})


def test_sampling_follows_the_flags_then_generation_config(tmp_path):
    assert sampling_settings(_args(), tmp_path)[0] == {"temperature": 1.0, "top_k": None, "top_p": None,
                                                    "greedy": False}
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6,
                                                                 "top_p": 0.9, "top_k": 20}))
    assert sampling_settings(_args(), tmp_path)[0] == {"temperature": 0.6, "top_k": 20, "top_p": 0.9, "greedy": False}
    assert sampling_settings(_args(temperature=0.8), tmp_path)[0]["top_p"] is None
    assert sampling_settings(_args(top_k=5), tmp_path)[0] == {"temperature": 1.0, "top_k": 5, "top_p": None,
                                                           "greedy": False}
    assert sampling_settings(_args(greedy=True), tmp_path)[0]["greedy"]
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6}))       # no do_sample
    assert sampling_settings(_args(), tmp_path)[0]["greedy"]


def test_unset_sampling_values_of_generation_config_take_transformers_defaults(tmp_path):
    GenerationConfig = pytest.importorskip("transformers").GenerationConfig
    if not hasattr(GenerationConfig, "_get_default_generation_params"):
        pytest.skip("this transformers fills in generate()'s defaults elsewhere")
    for written, top_k in (({"do_sample": True}, 50), ({"do_sample": True, "top_k": None, "top_p": None}, 50),
                           ({"do_sample": True, "top_k": 0, "temperature": 0.7}, None)):
        (tmp_path / "generation_config.json").write_text(json.dumps(written))
        settings = sampling_settings(_args(), tmp_path)[0]
        # what transformers' generate() fills in for the values the file leaves unset
        filled = GenerationConfig.from_dict(written)
        filled.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
        assert settings == {"temperature": filled.temperature, "top_k": top_k, "top_p": filled.top_p, "greedy": False}
        assert (filled.top_k or None) == top_k


def test_a_hugging_face_model_without_generation_config_is_greedy_as_in_transformers(tmp_path):
    """transformers' do_sample defaults to False: a model folder with no generation_config.json answers
    greedily there; a run folder of numformer's samples at temperature 1, as numformer generate does."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert sampling_settings(_args(), tmp_path)[0]["greedy"]
    assert not sampling_settings(_args(temperature=0.7), tmp_path)[0]["greedy"]


@pytest.mark.parametrize("written, says", [
    ({"do_sample": True, "top_p": 0}, "top_p = 0 must be a number in (0, 1]"),
    ({"do_sample": True, "top_k": -1}, "top_k = -1 must be an integer >= 0"),
    ({"do_sample": True, "top_k": 3.5}, "top_k = 3.5 must be an integer >= 0"),
    ({"do_sample": True, "temperature": 0}, "temperature = 0 must be a number > 0 when do_sample is true"),
    ({"do_sample": "yes"}, "do_sample = 'yes' must be true or false (a JSON boolean)"),   # transformers samples
    ({"do_sample": 1, "temperature": 0.7}, "do_sample = 1 must be true or false (a JSON boolean)")])
def test_a_bad_sampling_value_in_generation_config_names_the_file(tmp_path, written, says):
    (tmp_path / "generation_config.json").write_text(json.dumps(written))
    with pytest.raises(ValueError, match=f"generation_config.json: {re.escape(says)}; fix the file"):
        sampling_settings(_args(), tmp_path)
    assert sampling_settings(_args(greedy=True), tmp_path)[0]["greedy"]     # a flag replaces the file


def test_generation_settings_numformer_does_not_apply_are_named(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "repetition_penalty": 1.05,
                                                                 "no_repeat_ngram_size": 0, "top_k": 20}))
    assert sampling_settings(_args(), tmp_path)[1] == ["repetition_penalty = 1.05"]


def test_template_flags(folder, tmp_path, run_cli, monkeypatch, cli_error):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}{{ suffix }}")
    rc, out, err = chat(run_cli, monkeypatch, folder, "Hi\n", "--greedy", "--max-new-tokens", "4",
                        "--chat-template", template, "--template-var", 'suffix="::"')
    session = session_for(folder, max_new_tokens=4)
    session.format = ChatFormat(template.read_text(), session.format.special_tokens, {"suffix": "::"})
    assert rc == 0 and out == session.send("Hi") + "\n"
    assert session.format.render(session.messages()[:2], True) == SYSTEM + "Hi::"
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\n"))
    assert "--template-var 'oops': write KEY=VALUE" in cli_error("chat", folder, "--template-var", "oops")
    assert "--top-p must be a number in (0, 1], got 0.0" in cli_error("chat", folder, "--top-p", "0")
    assert "--max-new-tokens must be at least 1" in cli_error("chat", folder, "--max-new-tokens", "0")


def test_a_template_that_renders_nothing_is_one_error_at_start(folder, tmp_path, run_cli, monkeypatch):
    """It was generate's "empty prompt: give at least one token id" once per message; now one line, before the
    model loads, that names the template and --chat-template. A template empty for one message only says the
    same for that message; one that writes only the messages' text is not refused for the empty probe message."""
    template = tmp_path / "empty.jinja"
    template.write_text("{% if false %}x{% endif %}")
    _never_loads(monkeypatch)
    rc, out, err = chat(run_cli, monkeypatch, folder, "Hello there!\nHow are you?\n", "--chat-template", template)
    line = one_error_line(rc, err, "chat")
    assert "the chat template rendered an empty prompt" in line and "--chat-template FILE" in line and out == ""
    monkeypatch.undo()
    session = session_for(folder, system=None)
    session.format = ChatFormat("", session.format.special_tokens)
    with pytest.raises(ValueError, match="the chat template rendered an empty prompt"):
        session.check()
    session.format = ChatFormat("{% for m in messages %}{{ m.content }}{% endfor %}", session.format.special_tokens)
    session.check()
    session.format = ChatFormat("{% if messages[-1].content != 'x' %}hi{% endif %}", session.format.special_tokens)
    session.check()
    with pytest.raises(ValueError, match="the chat template rendered an empty prompt"):
        session.send("x")
    assert session.history == [] and session.send("y") is not None


@pytest.mark.parametrize("written", [5, [], [{"name": "default"}], ["{{ messages }}"], {"default": 5}])
def test_a_chat_template_in_tokenizer_config_that_is_not_a_string_names_the_file(folder, tmp_path, run_cli,
                                                                                   monkeypatch, written):
    """tokenizer_config.json's chat_template 5 was a Jinja TypeError reported as a bug in numformer (a list entry
    without "template", a KeyError): one line naming the file and key; --chat-template FILE then chats."""
    import shutil

    other = tmp_path / "model"
    shutil.copytree(folder, other)
    (other / "chat_template.jinja").unlink()
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": written}))
    rc, out, err = chat(run_cli, monkeypatch, other, "Hi\n", "--greedy", "--max-new-tokens", "2")
    line = one_error_line(rc, err, "chat")
    assert f"{other / 'tokenizer_config.json'}: chat_template = {written!r} must be a string" in line
    assert "--chat-template FILE" in line and out == ""
    (tmp_path / "t.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    rc, out, err = chat(run_cli, monkeypatch, other, "Hi\n", "--greedy", "--max-new-tokens", "2",
                        "--chat-template", tmp_path / "t.jinja")
    assert rc == 0 and out and "error" not in err


def test_stop_tokens_of_a_folder(tmp_path):
    _, hf_tok = model_folder(tmp_path, "chatml-thinking")
    folder = tmp_path / "chatml-thinking"
    end = hf_tok.convert_tokens_to_ids("<|im_end|>")
    (folder / "config.json").write_text(json.dumps({"eos_token_id": [end, 10**9]}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    tokenizer = load_tokenizer_only(folder, json.loads((folder / "config.json").read_text()))
    assert stop_token_ids(folder, tokenizer, ChatFormat.from_folder(folder)) == sorted({end, 7})


def load_tokenizer_only(folder, hf_config):
    from numformer.interop.hf import load_tokenizer
    return load_tokenizer(folder, hf_config)


def test_session_rng_is_one_generator_for_the_whole_session(folder):
    a, b = session_for(folder, greedy=False, rng=3), session_for(folder, greedy=False, rng=3)
    assert [a.send("Hi"), a.send("Hi")] == [b.send("Hi"), b.send("Hi")]
    assert isinstance(a.rng, np.random.Generator)


# -- what would fail every message fails once, at start ---------------------------------------------------------
def _never_loads(monkeypatch):
    import numformer.commands.chat as command

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the error")
    monkeypatch.setattr(command, "load_chat_model", load)


def test_a_missing_jinja2_is_one_error_at_start(folder, run_cli, monkeypatch, without_jinja2):
    """Not one error per message after the model loaded: one line before it loads, naming the extra to install;
    a session (as for an hf:ID source, whose folder is known once the model is loaded) says it before a message."""
    session = session_for(folder)
    with pytest.raises(ValueError, match=r"needs jinja2, which is not installed: pip install -e \"\.\[chat\]\" in "
                                         r"numformer's checkout"):
        session.check()
    _never_loads(monkeypatch)
    rc, out, err = chat(run_cli, monkeypatch, folder, "Hello there!\nHow are you?\n", "--greedy")
    line = one_error_line(rc, err, "chat")
    assert 'pip install -e ".[chat]"' in line and "(or pip install jinja2)" in line and out == ""


def test_a_system_prompt_the_model_cannot_take_is_one_error_at_start(char_run, run_cli, monkeypatch):
    lines = "Speak, hear me.\nSpeak again.\n"
    rc, out, err = chat(run_cli, monkeypatch, char_run, lines, "--max-new-tokens", "3", system="Ωmega speaks")
    line = one_error_line(rc, err, "chat")
    assert "the system prompt, written in the chat format, cannot be encoded" in line and "'Ω'" in line
    assert "remove them" in line and out == ""                   # what to do: the tokenizer's own advice
    rc, out, err = chat(run_cli, monkeypatch, char_run, lines, "--max-new-tokens", "3", system="speak " * 20)
    line = one_error_line(rc, err, "chat")
    assert "the system prompt makes a prompt of" in line and "before any message" in line and "context of 64" in line
    assert out == ""
    rc, out, err = chat(run_cli, monkeypatch, char_run, lines, "--max-new-tokens", "3", "--greedy", system="speak")
    assert rc == 0 and out and "error" not in err                # replies (sampled text may hold newlines)


def test_max_new_tokens_0_is_refused_with_the_reason_before_the_model_loads(folder, cli_error, monkeypatch, capsys):
    """generate takes 0 (the prompt alone); a reply of 0 tokens is always empty, so chat refuses it and says why."""
    from numformer.cli import main

    _never_loads(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\n"))
    assert "--max-new-tokens must be at least 1 for chat (a reply of 0 tokens is always empty), got 0" in \
        cli_error("chat", folder, "--max-new-tokens", "0")
    assert "--max-new-tokens must be at least 1 for chat" in cli_error("chat", folder, "--max-new-tokens", "-1")
    with pytest.raises(SystemExit):
        main(["chat", "--help"])
    assert "at least 1 (default 512" in " ".join(capsys.readouterr().out.split())


# -- Ctrl-C ----------------------------------------------------------------------------------------------------------
class FakeTerminal(io.StringIO):
    """Typed lines: stdin that says it is a terminal (input() then reads it and writes its prompt to stdout)."""

    def isatty(self):
        return True


def interrupt_the_first_reply(monkeypatch, after=3):
    """Make ChatSession's generate raise KeyboardInterrupt (Ctrl-C) after streaming ``after`` tokens of its first
    reply; later replies run normally. Returns the prompts (token ids) of the calls."""
    import numformer.data.chat as chat_module

    prompts = []

    def interrupted(model, ids, n, stream=None, **kwargs):
        prompts.append(list(ids))
        if len(prompts) > 1:
            return generate(model, ids, n, stream=stream, **kwargs)
        count = []

        def stream_then_interrupt(token):
            if stream(token):
                return True
            count.append(token)
            if len(count) == after:
                raise KeyboardInterrupt
        return generate(model, ids, n, stream=stream_then_interrupt, **kwargs)
    monkeypatch.setattr(chat_module, "generate", interrupted)
    return prompts


def test_an_interrupted_send_keeps_the_reply_so_far(folder, monkeypatch):
    session = session_for(folder, max_new_tokens=12)
    full = session_for(folder, max_new_tokens=12).send("Hello")
    prompts, pieces = interrupt_the_first_reply(monkeypatch), []
    with pytest.raises(KeyboardInterrupt):
        session.send("Hello", stream=pieces.append)
    partial = "".join(pieces)
    assert partial and full.startswith(partial) and len(partial) < len(full)
    assert session.history == [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": partial}]
    session.send("Again")                                          # the next message follows the partial reply
    assert prompts[1] == session.format.encode(session.tokenizer, session.messages()[:-1], True)
    monkeypatch.setattr(session.format, "encode", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):                         # before generation: nothing is kept
        session.send("Never answered")
    assert len(session.history) == 4


def test_ctrl_c_in_a_terminal_stops_the_reply_and_the_chat_goes_on(folder, run_cli, monkeypatch):
    """In a terminal, Ctrl-C while a reply streams stops it and gives the prompt back (the printed part of the
    reply stays in the conversation); from a pipe it ends the chat, as any command (exit code 130)."""
    prompts = interrupt_the_first_reply(monkeypatch)
    monkeypatch.setattr(sys, "stdin", FakeTerminal("Hello\nAgain\n"))
    rc, out, err = run_cli("chat", folder, "--system", SYSTEM, "--greedy", "--max-new-tokens", "8")
    assert rc == 0 and "(stopped;" in err and "Traceback" not in err, err
    assert out.startswith("> ") and out.endswith("> ")                  # the prompt is back after each reply
    partial, second = out[2:-2].split("\n> ")
    second = second.removesuffix("\n")
    session = session_for(folder, max_new_tokens=8)
    assert partial and session.send("Hello").startswith(partial)
    session.history[-1]["content"] = partial
    assert prompts[1] == session.format.encode(session.tokenizer, session.messages() + [
        {"role": "user", "content": "Again"}], True)
    assert second == session.send("Again")
    prompts = interrupt_the_first_reply(monkeypatch)
    rc, out, err = chat(run_cli, monkeypatch, folder, "Hello\nAgain\n", "--greedy", "--max-new-tokens", "8")
    assert rc == 130 and len(prompts) == 1 and out == partial                          # piped: the chat ends
