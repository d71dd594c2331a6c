"""Supervised fine-tuning data: encode_chat's assistant labels equal transformers' assistant mask, the masked
loss equals transformers' with -100 labels, and [data] task = "chat" trains (full and LoRA) from a base run."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

from numformer import ops
from numformer.data.chat import ChatFormat, encode_chat
from numformer.data.chat_tasks import ChatTask, pad_examples, read_conversations, record_messages
from numformer.data.tokenizers import ByteLevelBPE

TEMPLATES = Path(__file__).parent / "chat_templates"
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CONVERSATIONS = [
    [{"role": "user", "content": "Is this review positive or negative? A wonderful film."},
     {"role": "assistant", "content": "positive"}],
    [{"role": "system", "content": "Answer briefly."},
     {"role": "user", "content": "Write a negative review about a boat."},
     {"role": "assistant", "content": "The boat sank, and so did the film. Dull."},
     {"role": "user", "content": "Shorter, é ü?"},
     {"role": "assistant", "content": "Dull. ¡Très!"}],
]
CORPUS = " ".join(m["content"] for c in CONVERSATIONS for m in c) + " user assistant system review film"


def tokenizer():
    return ByteLevelBPE.train([CORPUS] * 4, 330, special_tokens=SPECIALS)


def hf_tokenizer(tmp_path, tok, template):
    transformers = pytest.importorskip("transformers")
    (tmp_path / "tokenizer.json").write_text(tok.to_hf_json())
    t = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    t.chat_template = template
    return t


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_encode_chat_equals_transformers_ids_and_assistant_mask(tmp_path, conversation):
    """The labels found by rendering up to each turn (template without generation tags) are the tokens
    transformers marks with return_assistant_tokens_mask on the same template with {% generation %} tags."""
    template = (TEMPLATES / "chatml-default-system.jinja").read_text()
    tagged = template.replace(
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}",
        "{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['role'] == 'assistant' %}{% generation %}"
        "{{ message['content'] + '<|im_end|>\n' }}{% endgeneration %}{% else %}"
        "{{ message['content'] + '<|im_end|>\n' }}{% endif %}")
    assert tagged != template
    tok = tokenizer()
    t = hf_tokenizer(tmp_path, tok, tagged)
    ref = t.apply_chat_template(conversation, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, labels = encode_chat((tok, ChatFormat(template)), conversation)
    assert ids == list(ref["input_ids"])
    assert labels == [i if m else -100 for i, m in zip(ids, ref["assistant_masks"])]
    assert sum(m for m in ref["assistant_masks"]) > 0
    assert encode_chat((tok, ChatFormat(template)), conversation, train_on="all") == (ids, ids)


def test_masked_loss_equals_transformers_with_minus_100_labels(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from numformer.interop import hf
    tok = tokenizer()
    config = transformers.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, intermediate_size=24,
                                      max_position_embeddings=128)
    torch.manual_seed(0)
    tmodel = transformers.LlamaForCausalLM(config).double().eval()
    tmodel.save_pretrained(tmp_path / "llama")
    model, _ = hf.load_pretrained(tmp_path / "llama", dtype=np.float64)
    examples = [encode_chat((tok, ChatFormat.default()), c) for c in CONVERSATIONS]
    batch = pad_examples(examples, pad_id=0)
    ours, _ = ops.cross_entropy_forward(model(batch.inputs["idx"]), batch.targets)
    T = max(len(ids) for ids, _ in examples)                       # transformers shifts the labels itself
    input_ids = torch.zeros((2, T), dtype=torch.long)
    labels = torch.full((2, T), -100)
    mask = torch.zeros((2, T), dtype=torch.long)
    for row, (ids, lab) in enumerate(examples):
        input_ids[row, :len(ids)], labels[row, :len(ids)], mask[row, :len(ids)] = (
            torch.tensor(ids), torch.tensor(lab), 1)
    with torch.no_grad():
        ref = tmodel(input_ids=input_ids, attention_mask=mask, labels=labels).loss.item()
    assert abs(ours - ref) < 1e-5 * abs(ref)       # transformers' rotary angles are float32 whatever the dtype


def test_alpaca_and_messages_records(tmp_path):
    assert record_messages({"instruction": "Add 2 and 3.", "input": "", "output": "5"}) == [
        {"role": "user", "content": "Add 2 and 3."}, {"role": "assistant", "content": "5"}]
    assert record_messages({"instruction": "Sum:", "input": "2, 3", "output": "5"})[0]["content"] == "Sum:\n\n2, 3"
    with pytest.raises(ValueError, match=r"record 0 is neither"):
        record_messages({"prompt": "x"})


def chat_error(tmp_path, records, name="c.json", **config):
    """The one-line error of ChatTask on ``records`` (written as a JSON list to ``name``), checked to name the file."""
    path = tmp_path / name
    path.write_text(json.dumps(records))
    with pytest.raises(ValueError) as e:
        ChatTask({"path": str(path), "val_size": 0, "block_size": 64, **config}, 0, tokenizer().to_dict())
    message = str(e.value)
    assert str(path) in message and "\n" not in message
    return message


GOOD = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "how are"}]}


def test_a_chat_file_with_a_utf8_bom_is_read(tmp_path):
    """A byte order mark (Windows' Notepad, PowerShell's Out-File -Encoding utf8) was "not valid JSON (Unexpected
    UTF-8 BOM ...); JSON lines hold one value per line", for a JSON list too; Python's json.loads of the bytes and
    numformer's read_text take it."""
    for name, text in [("a.json", json.dumps([GOOD] * 2)), ("b.jsonl", json.dumps(GOOD) + "\n" + json.dumps(GOOD))]:
        (tmp_path / name).write_text(text, encoding="utf-8-sig")
        assert read_conversations(tmp_path / name) == [GOOD["messages"]] * 2


@pytest.mark.parametrize("role, hint", [("gpt", '"gpt" is ShareGPT\'s "assistant"'), ("bot", "bot"),
                                        ("Assistant", 'roles are lowercase: "assistant"'),
                                        ("human", '"human" is ShareGPT\'s "user"')])
def test_an_unknown_role_is_refused_naming_the_file_the_record_and_the_roles(tmp_path, role, hint):
    """A role the templates do not know ("gpt", "bot", "Assistant") was accepted: with the assistant's turn under
    it the conversation had no assistant token and was left out in silence ("3 without an assistant token in the
    context left out"), or, every record so, the error blamed block_size."""
    messages = [{"role": "user", "content": "hello"}, {"role": role, "content": "how are"}]
    message = chat_error(tmp_path, [GOOD, GOOD, {"messages": messages}])
    assert f'record 2, messages[1]: role "{role}"' in message
    assert hint in message and '"system", "user", "assistant"' in message and "block_size" not in message


@pytest.mark.parametrize("record, says", [
    ({"instruction": "Add", "input": 5, "output": "6"}, 'record 1: "input" is the number 5, not a string'),
    ({"instruction": ["Add"], "input": "", "output": "6"}, 'record 1: "instruction" is a JSON list, not a string'),
    ({"instruction": "Add", "output": None}, 'record 1: "output" is null, not a string'),
    ({"instruction": "Add", "input": "2"}, 'record 1 has no "output"'),
    ({"messages": [{"role": "user", "content": 5}]}, 'record 1, messages[0]: "content" is the number 5'),
    ({"messages": [{"role": "user", "content": "hi"}, "yo"]}, "record 1, messages[1] is a JSON string, not a message"),
    ({"messages": [{"content": "hi"}]}, 'record 1, messages[0] has no "role"'),
    ({"messages": {"role": "user", "content": "hi"}}, 'record 1: "messages" is a JSON object, not a list'),
    ([GOOD], "record 1 is a JSON list, not an object"),
])
def test_a_field_of_the_wrong_type_is_one_line_naming_the_file_the_record_and_the_field(tmp_path, record, says):
    """``"input": 5`` was "internal error (AttributeError)"; other fields of the wrong type the message "neither
    {"messages": ...} nor an Alpaca record", naming no field."""
    message = chat_error(tmp_path, [GOOD, record])
    assert says in message, message


@pytest.mark.parametrize("messages, says", [
    ([], 'record 1: "messages" is an empty list'),
    ([{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "hi"},
      {"role": "assistant", "content": "yo"}], "record 1 starts with the assistant's message"),
])
def test_a_conversation_that_cannot_be_learned_names_the_file_and_the_record(tmp_path, messages, says):
    """An empty conversation, or one that starts with the assistant's turn, was "a conversation is a non-empty
    list of messages", naming neither file nor record."""
    message = chat_error(tmp_path, [GOOD, {"messages": messages}])
    assert says in message, message


def test_a_conversation_without_an_assistant_message_is_refused_unless_train_on_all(tmp_path):
    """It was left out in silence, counted as "without an assistant token in the context" (every record so, an
    error blaming block_size); with train_on = "all" every token takes the loss, so it is kept."""
    user_only = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}
    message = chat_error(tmp_path, [GOOD, user_only])
    assert "record 1 of" in message and "has no assistant message, so no token takes the loss" in message
    assert 'set [data] train_on = "all"' in message and "block_size" not in message
    task = ChatTask({"path": str(tmp_path / "c.json"), "val_size": 0, "block_size": 64, "train_on": "all"}, 0,
                    tokenizer().to_dict())
    assert len(task.examples) == 2


def test_a_template_that_refuses_a_conversation_names_the_file_and_the_record(tmp_path):
    """The chat template's own refusal (``raise_exception``) named no record; a template that is not valid Jinja
    is said once, naming the file, not as the first record's fault."""
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}"
                        "{% endif %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}assistant: {% endif %}")
    records = [GOOD, {"messages": [{"role": "system", "content": "x"}] + GOOD["messages"]}]
    message = chat_error(tmp_path, records, chat_template=str(template))
    assert "record 1 of" in message and "the chat template refused the conversation: no system role" in message
    template.write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(ValueError, match=r"^\[data\] chat_template .*t\.jinja: the chat template is not valid Jinja"):
        ChatTask({"path": str(tmp_path / "c.json"), "chat_template": str(template)}, 0, tokenizer().to_dict())


def test_json_lines_split_at_line_feeds_only(tmp_path):
    """U+2028, U+0085 and a form feed are valid unescaped in a JSON string: a JSON-lines file breaks at "\\n"."""
    record = {"messages": [{"role": "user", "content": "a\u2028b\x85c\x0cd"}, {"role": "assistant", "content": "e"}]}
    (tmp_path / "odd.jsonl").write_text(json.dumps(record, ensure_ascii=False) + "\r\n" + json.dumps(record) + "\n",
                                        encoding="utf-8")
    assert read_conversations(tmp_path / "odd.jsonl") == [record["messages"]] * 2


def test_every_line_reader_of_the_data_files_splits_at_line_feeds_only(tmp_path):
    """The same class in the datasets' readers: JSON-lines tables, TSV pairs and parallel text files keep a
    sentence holding U+2028, U+0085 or a form feed on its line (a split there would break a record or shift
    every later pair)."""
    from numformer.data.files import read_lines, read_pairs, read_table

    odd = "a\u2028b\x85c\x0cd"
    (tmp_path / "t.jsonl").write_text(json.dumps({"text": odd, "label": 1}, ensure_ascii=False) + "\r\n"
                                      + json.dumps({"text": "e", "label": 0}) + "\n", encoding="utf-8")
    columns, rows = read_table(tmp_path / "t.jsonl")
    assert [r["text"] for _, r in rows] == [odd, "e"]
    (tmp_path / "p.tsv").write_text(f"{odd}\tx\r\ny\tz\n", encoding="utf-8")
    assert read_pairs(tmp_path / "p.tsv") == ([odd, "y"], ["x", "z"])
    (tmp_path / "l.txt").write_text(f"{odd}\nlast", encoding="utf-8")
    assert read_lines(tmp_path / "l.txt") == [odd, "last"]


def write_data(tmp_path):
    lines = [json.dumps({"messages": c}) for c in CONVERSATIONS] * 6
    alpaca = [{"instruction": "Is this review positive or negative?", "input": "A wonderful film.",
               "output": "positive"}] * 6
    (tmp_path / "chat.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "alpaca.json").write_text(json.dumps(alpaca))
    return tmp_path / "chat.jsonl", tmp_path / "alpaca.json"


def test_chat_task_batches_take_the_loss_on_assistant_tokens(tmp_path):
    chat, alpaca = write_data(tmp_path)
    tok = tokenizer()
    task = ChatTask({"path": str(chat), "val_size": 2, "block_size": 64}, seed=0, tokenizer_state=tok.to_dict())
    batch = task.train_batch(4, np.random.default_rng(0))
    for x, y in zip(batch.inputs["idx"], batch.targets):
        counted = tok.decode([int(t) for t in y if t != -100])
        assert counted.strip().rstrip("\n") and "User:" not in counted       # the replies only
    assert ChatTask({"path": str(alpaca), "val_size": 1}, 0, tok.to_dict()).eval_size("val") == 1
    with pytest.raises(ValueError, match="set \\[model\\] init_from"):
        ChatTask({"path": str(chat)}, 0, None)


def test_chat_data_errors_name_the_file_and_the_record(tmp_path):
    """An empty file says it holds no records (not "none of the 0 records has an assistant token"), and
    characters the base model's character tokenizer lacks name the file and the record, and ask for the data
    to change: a fine-tune keeps its base's tokenizer, so "rebuild the tokenizer" is no fix."""
    from numformer.data.tokenizers import CharTokenizer

    chars = CharTokenizer.from_text("User: Assistant: hello there, how are you?\n")
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(ValueError, match=r"empty\.json holds no records; give a JSON or JSON-lines file"):
        ChatTask({"path": str(tmp_path / "empty.json")}, 0, chars.to_dict())
    records = [{"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "how are"}]},
               {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "<b>\"yo\""}]}]
    (tmp_path / "odd.json").write_text(json.dumps(records))
    with pytest.raises(ValueError) as error:
        ChatTask({"path": str(tmp_path / "odd.json"), "val_size": 0}, 0, chars.to_dict())
    message = str(error.value)
    assert f"record 1 of {tmp_path / 'odd.json'} has 4 character(s) that the base model's tokenizer" in message
    assert "'\"<>b'" in message and "remove them from the data" in message and "rebuild" not in message


@pytest.mark.parametrize("lora", [False, True])
def test_chat_fine_tuning_from_a_base_run(tmp_path, lora):
    from numformer.cli import main
    chat, _ = write_data(tmp_path)
    (tmp_path / "t.txt").write_text(CORPUS * 20)
    tiny = ["--set", "model.n_layers=1", "--set", "model.d_model=16", "--set", "train.processes=1", "--quiet"]
    assert main(["train", "configs/shakespeare_char.toml", "--out", str(tmp_path / "base"), "--set",
                 f"data.path={tmp_path / 't.txt'}", "--set", "data.tokenizer=bpe", "--set", "data.vocab_size=300",
                 "--set", "data.block_size=96", "--set", "train.max_steps=2", *tiny]) == 0
    cfg = tmp_path / "sft.toml"
    cfg.write_text(f'[model]\ninit_from = "{tmp_path / "base"}"\n[data]\ntask = "chat"\npath = "{chat}"\n'
                   f'block_size = 96\nval_size = 2\n[train]\nmax_steps = 30\nbatch_size = 4\nlr = 1e-2\n'
                   f'eval_every = 30\nprocesses = 1\n' + ('[lora]\nr = 4\nalpha = 8\n' if lora else ''))
    assert main(["train", str(cfg), "--out", str(tmp_path / "sft"), "--quiet"]) == 0
    metrics = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    losses = [m["train_loss"] for m in metrics if "train_loss" in m]
    assert losses[-1] < losses[0]
    saved = json.loads((tmp_path / "sft" / "config.json").read_text())
    assert saved["data"]["train_on"] == "assistant" and ("lora" in saved) == lora


def test_the_chat_pages_configs_train_and_export_a_peft_adapter(tmp_path):
    """docs/tutorials/chat-model.md's sft.toml and dpo.toml, on a small Llama-style base and small data files:
    both train, and the DPO LoRA run exports as a PEFT adapter with its base."""
    import re

    from numformer.cli import main
    from test_dpo import write_pairs

    page = (Path(__file__).resolve().parents[1] / "docs" / "tutorials" / "chat-model.md").read_text(encoding="utf-8")
    sft_toml, dpo_toml = re.findall(r"```toml\n(.*?)```", page, re.S)
    assert 'task = "chat"' in sft_toml and 'objective = "dpo"' in dpo_toml and "[lora]" in dpo_toml
    chat, _ = write_data(tmp_path)
    (tmp_path / "t.txt").write_text(CORPUS * 200)
    one = ["--set", "train.processes=1", "--quiet"]
    assert main(["train", "configs/shakespeare_speedrun.toml", "--out", str(tmp_path / "runs" / "imdb_lm"),
                 "--set", f"data.path={tmp_path / 't.txt'}", "--set", "data.tokenizer=bpe", "--set",
                 "data.vocab_size=300", "--set", "model.n_layers=1", "--set", "model.d_model=16", "--set",
                 "model.d_ff=48", "--set", "data.block_size=256", "--set", "train.budget_minutes=0", "--set", "train.max_steps=2", *one]) == 0
    (tmp_path / "sft.toml").write_text(sft_toml, encoding="utf-8")
    (tmp_path / "dpo.toml").write_text(dpo_toml, encoding="utf-8")
    short = ["--set", "train.max_steps=2", "--set", "train.eval_every=2", "--set", "data.val_size=2", *one]
    with contextlib.chdir(tmp_path):                     # the pages' run folders are relative: runs/imdb_lm, ...
        assert main(["train", "sft.toml", "--out", "runs/sft", "--set", f"data.path={chat}", *short]) == 0
        assert main(["train", "dpo.toml", "--out", "runs/dpo", "--set", f"data.path={write_pairs(tmp_path)}",
                     *short]) == 0
        assert main(["export", "runs/dpo", "--out", "dpo_adapter"]) == 0
    adapter = json.loads((tmp_path / "dpo_adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert (tmp_path / "dpo_adapter" / "base" / "config.json").is_file()
