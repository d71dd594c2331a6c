"""``numformer chat`` on today's small-model families (tiny random models built by transformers, the chat
templates of tests/chat_templates written for these tests): Llama 3.x (llama3 RoPE, the Llama 3 header format,
<|eot_id|>), Qwen3 (q/k norms, ChatML with the thinking switch, <|im_end|>) and Gemma 3 (<start_of_turn> /
model, <end_of_turn>). Each reply is transformers' greedy generation on the same rendered chat, cut at the
end-of-turn token; the command fed from a pipe answers each line."""
from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest

from numformer.data.chat import ChatFormat, ChatSession, stop_token_ids
from numformer.interop import hf

from test_chat_templates import model_folder

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=24, max_position_embeddings=256)
FAMILIES = {  # template: (config class, its keywords, the end-of-turn tokens of generation_config.json)
    "llama-3": ("LlamaConfig", dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                                                     "rope_theta": 500000.0}, tie_word_embeddings=True),
                ["<|end_of_text|>", "<|eot_id|>"]),
    "chatml-thinking": ("Qwen3Config", dict(head_dim=6, tie_word_embeddings=True), ["<|im_end|>"]),
    "gemma": ("Gemma3TextConfig", dict(head_dim=6, query_pre_attn_scalar=6, sliding_window=8,
                                       layer_types=["sliding_attention", "full_attention"]),
              ["<eos>", "<end_of_turn>"]),
}
LINES = ["Hello! How are you today?", "What is the capital of France?"]


def family_chat_folder(tmp_path, template):
    folder, hf_tok = model_folder(tmp_path, template)
    cls, kw, stops = FAMILIES[template]
    config = getattr(transformers, cls)(vocab_size=len(hf_tok), **SMALL, **kw, pad_token_id=None,
                                        bos_token_id=hf_tok.bos_token_id, eos_token_id=hf_tok.eos_token_id)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():                                  # norm weights away from their start: each one counts
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(folder)
    stop_ids = hf_tok.convert_tokens_to_ids(stops)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": stop_ids, "do_sample": False}))
    return folder, hf_tok, stop_ids


def transformers_replies(folder, hf_tok, stop_ids, lines, max_new_tokens):
    """transformers' greedy replies (float64) to each line in turn, the history growing as a chat's."""
    from test_llama_hf import _float64_arithmetic

    tmodel = _float64_arithmetic(transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64)
                                 .eval())
    messages, replies = [], []
    for line in lines:
        messages.append({"role": "user", "content": line})
        ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True,
                                         return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = tmodel.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stop_ids,
                                  pad_token_id=stop_ids[0], attention_mask=torch.ones_like(ids))
        reply = hf_tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply})
    return replies


@pytest.mark.parametrize("template", sorted(FAMILIES))
def test_chat_replies_are_transformers_greedy_replies_and_the_command_answers_each_line(tmp_path, template, run_cli,
                                                                                    monkeypatch):
    folder, hf_tok, stop_ids = family_chat_folder(tmp_path, template)
    model, tokenizer = hf.load_pretrained(folder, dtype=np.float64)
    fmt = ChatFormat.from_folder(folder)
    assert set(stop_ids) <= set(stop_token_ids(folder, tokenizer, fmt))
    session = ChatSession(model, tokenizer, fmt, greedy=True, max_new_tokens=12,
                          stop_tokens=stop_token_ids(folder, tokenizer, fmt))
    ours = [session.send(line) for line in LINES]
    assert ours == transformers_replies(folder, hf_tok, stop_ids, LINES, 12) and all(ours)
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(LINES) + "\n"))
    rc, out, err = run_cli("chat", folder, "--max-new-tokens", "12")     # float32, greedy from generation_config
    model32, _ = hf.load_pretrained(folder)
    session32 = ChatSession(model32, tokenizer, fmt, greedy=True, max_new_tokens=12,
                            stop_tokens=stop_token_ids(folder, tokenizer, fmt))
    assert rc == 0 and "Traceback" not in err
    assert out == "".join(session32.send(line) + "\n" for line in LINES)
