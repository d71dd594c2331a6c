"""The chat pipeline's measurements by generation: sentiment classification (the generated label against the
review's), reviews written on request judged by numformer's own IMDB classifier, the implicit reward of DPO on
held-out pairs, and a ``numformer chat`` session fed from a pipe.

Replies are generated in batches of left-padded prompts (``decoding.generate`` with ``attention_mask``: each row
continues as its prompt alone would) with the key/value cache, and end at the tokenizer's end-of-text token
(``_chat_data.END``) or at a turn marker of the default format (``data.chat.DEFAULT_STOP_STRINGS``). A share
comes with its 95% Wilson score interval (``wilson``).
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..data.chat import DEFAULT_STOP_STRINGS, ChatFormat
from ..data.chat_tasks import PreferenceTask, sequence_logprobs
from ..decoding import generate
from ..train.inference import classify_texts
from ._chat_data import LABELS, classify_messages, write_messages


def wilson(k, n, z=1.96):
    """The 95% Wilson score interval (lo, hi) of a share of k successes in n trials ((0, 1) for n = 0)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def share(k, n):
    """{"share", "n", "ci95"} of k successes in n."""
    lo, hi = wilson(k, n)
    return {"share": k / n if n else None, "n": int(n), "ci95": [round(lo, 4), round(hi, 4)]}


def left_pad(rows, pad_id):
    """((B, T) ids left-padded with ``pad_id``, (B, T) mask: 1 for the real tokens)."""
    T = max(len(r) for r in rows)
    ids = np.full((len(rows), T), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), T), dtype=np.int64)
    for b, r in enumerate(rows):
        ids[b, T - len(r):], mask[b, T - len(r):] = r, 1
    return ids, mask


def reply_text(tokenizer, new_ids, eos_id):
    """The text of generated ids up to the end-of-text token, cut at a turn marker, stripped."""
    new_ids = list(new_ids)
    if eos_id in new_ids:
        new_ids = new_ids[:new_ids.index(eos_id)]
    text = tokenizer.decode(new_ids)
    ends = [i for i in (text.find(s) for s in DEFAULT_STOP_STRINGS) if i >= 0]
    return (text[:min(ends)] if ends else text).strip()


def generate_replies(model, tokenizer, prompts, max_new_tokens, batch, sampling, rng=None):
    """The reply to each prompt (token ids ending with the generation prompt), in batches of prompts of
    similar length (sorted, so that little is padded); returns the texts in the prompts' order."""
    eos = tokenizer.eos_id
    order = np.argsort([len(p) for p in prompts], kind="stable")
    out = [None] * len(prompts)
    for start in range(0, len(order), batch):
        rows = order[start:start + batch]
        ids, mask = left_pad([prompts[i] for i in rows], eos)
        seq = generate(model, ids, max_new_tokens, attention_mask=mask, stop_tokens=eos, rng=rng, **sampling)
        for b, i in enumerate(rows):
            out[i] = reply_text(tokenizer, seq[b, ids.shape[1]:], eos)
    return out


def parse_label(reply):
    """The label a reply names (its first word: 0 negative, 1 positive), or None."""
    words = reply.lower().split()
    word = words[0].strip(".,!:;\"'") if words else ""
    return LABELS.index(word) if word in LABELS else None


def timed(fn):
    """(fn(), wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def classify_by_generation(model, tokenizer, reviews, indices, room, head, batch, examples=4):
    """Accuracy of the label the model generates (greedy) for the reviews ``indices`` (each fitted to the
    context as in training), with its interval, the replies that name no label, the time per review, and a
    few examples."""
    fmt = ChatFormat.default()
    prompts = [fmt.encode(tokenizer, classify_messages(reviews.fitted(i, room, head)), add_generation_prompt=True)
               for i in indices]
    longest = max(len(tokenizer.encode(" " + label)) for label in LABELS) + 1
    replies, wall, cpu = timed(lambda: generate_replies(model, tokenizer, prompts, longest, batch, {"greedy": True}))
    predicted = [parse_label(r) for r in replies]
    right = sum(p == reviews.labels[i] for p, i in zip(predicted, indices))
    return {**share(right, len(indices)), "accuracy": right / len(indices),
            "no_label": sum(p is None for p in predicted), "seconds": round(wall, 1),
            "ms_per_review": 1000 * wall / len(indices), "cpu_ms_per_review": 1000 * cpu / len(indices),
            "prompt_tokens": float(np.mean([len(p) for p in prompts])),
            "examples": [{"review": int(i), "label": LABELS[reviews.labels[i]], "reply": r}
                         for i, r in list(zip(indices, replies))[:examples]]}


def write_on_request(model, tokenizer, requests, settings, seed):
    """The reviews the model writes for ``requests`` [(label, topic)], sampled with ``settings``
    (max_new_tokens, temperature, top_k, eval_batch) and a generator seeded with ``seed``."""
    fmt = ChatFormat.default()
    prompts = [fmt.encode(tokenizer, write_messages(label, topic), add_generation_prompt=True)
               for label, topic in requests]
    sampling = {"temperature": settings["temperature"], "top_k": settings["top_k"]}
    return timed(lambda: generate_replies(model, tokenizer, prompts, settings["max_new_tokens"],
                                          settings["eval_batch"], sampling, np.random.default_rng(seed)))


def judged_share(classifier_run, texts, requested, examples=4):
    """The share of ``texts`` that the classifier run judges as the ``requested`` label (an empty text counts
    as not), with its interval and a few examples."""
    written = [i for i, t in enumerate(texts) if t.strip()]
    judged = {i: r for i, r in zip(written, classify_texts(classifier_run, [texts[i] for i in written]))} \
        if written else {}
    hits = [i in judged and _positive(judged[i]["label"]) == bool(requested[i]) for i in range(len(texts))]
    per_label = {LABELS[k]: share(sum(h for h, r in zip(hits, requested) if r == k), requested.count(k))["share"]
                 for k in (0, 1)}
    return {**share(sum(hits), len(texts)), "by_request": per_label, "empty": len(texts) - len(written),
            "mean_words": float(np.mean([len(t.split()) for t in texts])),
            "examples": [{"requested": LABELS[requested[i]], "text": texts[i],
                          "judged": judged[i]["label"] if i in judged else None,
                          "p": judged[i]["probability"] if i in judged else None}
                         for i in _spread_examples(requested, examples)]}


def _positive(name):
    return str(name).lower().startswith("pos")


def _spread_examples(requested, n):
    """The first n/2 requests of each label."""
    return [i for k in (1, 0) for i in [j for j, r in enumerate(requested) if r == k][:n // 2]]


def pair_preferences(policy, reference, tokenizer_state, pairs_path, block_size):
    """On the preference pairs of ``pairs_path``: the share whose implicit reward prefers the chosen reply
    (log π − log π_ref larger for it; the reference model scored as the policy gives every pair a margin of
    0, a tie) and the share each model itself prefers the chosen reply (log-probability)."""
    task = PreferenceTask({"path": str(pairs_path), "block_size": block_size, "val_size": 0}, 0, tokenizer_state)
    rows = np.arange(len(task.examples))
    ref = sequence_logprobs(reference, task, rows)
    pol = ref if policy is reference else sequence_logprobs(policy, task, rows)
    margin = (pol[:, 0] - ref[:, 0]) - (pol[:, 1] - ref[:, 1])
    n = len(rows)
    return {"reward_accuracy": share(int(np.sum(margin > 0)), n), "ties": int(np.sum(margin == 0)),
            "mean_margin": float(np.mean(margin)),
            "policy_prefers_chosen": share(int(np.sum(pol[:, 0] > pol[:, 1])), n),
            "reference_prefers_chosen": share(int(np.sum(ref[:, 0] > ref[:, 1])), n)}


def chat_transcript(run_dir, lines, settings, seed, timeout=900):
    """(the command, its stdout) of ``numformer chat RUN`` fed ``lines`` on stdin."""
    args = ["chat", str(run_dir), "--seed", str(seed), "--temperature", str(settings["temperature"]),
            "--top-k", str(settings["top_k"]), "--max-new-tokens", str(settings["max_new_tokens"])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                                       os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "numformer.cli", *args], input="".join(s + "\n" for s in lines),
                          capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"numformer chat failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return "numformer " + " ".join(args), proc.stdout
