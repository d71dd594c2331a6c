"""The main job as an experiment: ``numformer reproduce shakespeare_char``.

Trains ``configs/shakespeare_char.toml`` (nanoGPT's CPU configuration, what
``make run`` trains) and records the loss on the whole validation text after
2000 steps, bits per character, the wall time, and a sample continuing
"ROMEO:" (seed 0), next to the learning curve and the attention maps.
"""
from __future__ import annotations

import math

from . import register
from .runner import Experiment, Target

PROMPT = "ROMEO:"
SAMPLE_TOKENS = 300

WHY = ("nanoGPT's `shakespeare_char` CPU configuration: 4 pre-LN layers, 4 heads, d_model 128, context 64, "
       "batch 12, 2000 AdamW steps (lr 1e-3, beta2 0.99, weight decay 0.1), 100 warmup steps then a cosine "
       "down to 1e-4, no dropout, tied embeddings, no biases; the first 90% of the text for training, the "
       "last 10% for validation, as nanoGPT. nanoGPT reports a validation loss of 1.88 for it, estimated on "
       "20 random batches; the figure here is the loss on every character of the validation text.")


def _extra(trainer, task, results_dir, quick):
    from ..generate import generate
    from ..train import evaluate_loss

    model = trainer.model.eval()
    t = trainer.config["train"]
    loss = evaluate_loss(model, task, "test", t["eval_batch_size"] or t["batch_size"])      # the whole text
    ids = generate(model, task.tokenizer.encode(PROMPT), SAMPLE_TOKENS, temperature=1.0, rng=0)
    sample = task.tokenizer.decode(ids)                  # the prompt and what follows
    summary = trainer.last_summary
    figures = {"bits_per_character": loss / math.log(2), "train_tokens_per_s": summary["tokens_per_s"],
               "processes": summary["processes"]}
    md = "\n".join([
        f"Model: {WHY}", "",
        f"Training ran data-parallel on {summary['processes']} process(es) at {summary['tokens_per_s']:,.0f} "
        f"tokens/s ({summary['train_seconds']:.1f} s of training steps; {summary['wall_seconds']:.1f} s with the "
        f"evaluations and checkpoints).", "",
        f"Sample (`numformer generate runs/shakespeare_char --prompt \"{PROMPT}\" --max-new-tokens "
        f"{SAMPLE_TOKENS} --seed 0`):", "", "```text", sample, "```"])
    return figures, md


register(Experiment(
    "shakespeare_char", "Character-level GPT on tiny Shakespeare: `make run`'s model (nanoGPT's CPU configuration).",
    [Target("test_loss", 1.88, "<=")],
    quick_overrides=["train.max_steps=12", "train.eval_every=6", "train.checkpoint_every=6", "train.log_every=3",
                     "model.n_layers=1", "data.block_size=16"],
    extra=_extra))
