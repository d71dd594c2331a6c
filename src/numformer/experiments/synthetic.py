"""The synthetic experiments: copy, reversal, parity, addition and sorting.

Each trains ``configs/NAME.toml`` (the model chosen for the task and why is
written at the top of each config), evaluates the best weights on 1,000
held-out test problems and reports it against the experiment's target. Besides the
learning curve and the attention heatmaps of the standard pipeline, each one
draws its validation metrics against the step; parity also trains the
EncoderClassifier (the model that reads the bits and classifies), for a few minutes, as a baseline
(its accuracy is reported as ``classifier_accuracy``, next to the scratchpad
model's ``accuracy``). The markdown says which model was trained and why.

``--quick`` versions (tiny lengths, a few steps) run in seconds, for the tests.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..analysis import plot_eval_metrics, read_metrics
from . import Experiment, Target, register
from ._runs import start_run

QUICK = ["train.max_steps=12", "train.eval_every=6", "train.checkpoint_every=12", "train.warmup_steps=2",
         "data.n_val=40", "data.n_test=40", "model.n_layers=1", "model.d_model=16", "model.n_heads=2"]


def _figure(results_dir, name):
    d = Path(results_dir) / "figures"
    d.mkdir(parents=True, exist_ok=True)
    return d / name


def model_line(trainer):
    """One sentence: the model trained, its size and the training budget (from the resolved config)."""
    m, t = trainer.config["model"], trainer.config["train"]
    if m["type"] == "transformer":
        n_dec = m.get("n_decoder_layers") or m["n_layers"]
        kind = f"encoder-decoder Transformer ({m.get('n_encoder_layers') or m['n_layers']}+{n_dec} layers"
    elif m["type"] == "gpt":
        kind = f"decoder-only GPT ({m['n_layers']} layers"
    else:
        kind = f"{m['type']} ({m['n_layers']} layers"
    return (f"Model: {kind}, d_model {m['d_model']}, {m['n_heads']} heads, {m['positional']} positions, "
            f"{'pre' if m.get('norm_first') else 'post'}-LN, {trainer.model.num_parameters():,} parameters); "
            f"{t['optimizer']} lr {t['lr']:g} ({t['schedule']}, {t['warmup_steps']} warmup steps), batch "
            f"{t['batch_size']}, at most {t['max_steps']} steps.")


def synthetic_extra(name, metrics, why):
    """An ``extra`` hook: the model and why it was chosen, and the validation ``metrics`` against the step
    (figures/NAME_metrics.png)."""

    def extra(trainer, task, ctx):
        md = [model_line(trainer) + " " + why]
        records = read_metrics(trainer.run_dir / "metrics.jsonl")
        names = [m for m in metrics if any(m in r for r in records)]
        path = _figure(ctx.results_dir, f"{name}_metrics.png")
        if names and plot_eval_metrics(records, path=path, names=names) is not None:
            md += ["**Validation metrics during training**", f"![Validation metrics](figures/{path.name})"]
        return {}, "\n\n".join(md)

    return extra


# The classifier for parity: an encoder that reads the bits and classifies. Trained on lengths
# 1..64 (short strings first carry a signal), as a baseline for the scratchpad model of configs/parity.toml.
PARITY_BASELINE = "parity_classifier"        # its run folder, beside runs/parity
PARITY_CLASSIFIER = {
    "model": {"type": "classifier", "n_layers": 4, "n_heads": 4, "d_model": 64, "dropout": 0.0,
              "norm_first": True, "activation": "gelu", "pooling": "first", "positional": "learned"},
    "data": {"task": "parity", "length": 64, "min_length": 1, "n_val": 500},
    "train": {"max_steps": 1000, "batch_size": 64, "lr": 1e-3, "schedule": "cosine", "warmup_steps": 100,
              "min_lr": 1e-4, "weight_decay": 0.01, "eval_every": 250, "checkpoint_every": 1000, "seed": 1337},
}
PARITY_CLASSIFIER_QUICK = ["train.max_steps=4", "train.eval_every=4", "data.length=8", "data.n_val=40",
                           "data.n_test=40", "model.n_layers=1", "model.d_model=16", "model.n_heads=2"]

PARITY_WHY = (
    "Technique: a scratchpad (Nye et al. 2021, \"Show your work\") and mixed lengths. The model writes the "
    "running counts of ones c_1 .. c_L, then the parity bit of c_L; each step c_i = c_{i-1} + b_i is a local "
    "addition that gradient descent learns, where the bare label, an XOR of 64 bits, gives no signal. Its "
    "cross-attention reads source bit i at step i, the diagonal, the same at every length, so training "
    "mixes lengths 1..64 in each batch (`min_length = 1`): the short strings teach the rule early. "
    "Half of every batch has the full length 64 (`full_length_fraction = 0.5`): with lengths uniform in "
    "1..64 alone few strings are long, and a full 3,000-step run ended at 93.3% test accuracy, since one "
    "wrong count among 64 steps spoils the bit (see the comment in configs/parity.toml). "
    "`accuracy` is the parity bit the model writes last when it decodes its whole scratchpad greedily, from "
    "its own outputs, as at inference; `exact_match` counts strings whose whole scratchpad is right.")


def parity_extra(trainer, task, ctx):
    """Setup and validation curves, then the EncoderClassifier baseline trained and tested on parity too."""
    figures, md = synthetic_extra("parity", ["accuracy", "exact_match", "token_accuracy"], PARITY_WHY)(
        trainer, task, ctx)
    print("parity: training the EncoderClassifier baseline", file=sys.stderr, flush=True)
    base = start_run(ctx, PARITY_CLASSIFIER, ctx.runs_dir / PARITY_BASELINE,
                     PARITY_CLASSIFIER_QUICK if ctx.quick else [])
    summary = base.train()
    acc = base.task.evaluate(base.model.eval(), "test")["accuracy"]
    m, d, t = base.config["model"], base.config["data"], base.config["train"]
    text = (f"**Baseline: the EncoderClassifier**, the model that classifies the string directly: an encoder "
            f"({m['n_layers']} pre-LN layer{'s' if m['n_layers'] > 1 else ''}, d_model {m['d_model']}, "
            f"{m['n_heads']} heads, {summary['parameters']:,} parameters, classifying from the `<cls>` token) "
            f"that reads `<cls> b_1 .. b_L` and predicts the parity bit, trained on lengths "
            f"{d['min_length']}..{d['length']} for {summary['steps']} steps of batch {t['batch_size']} "
            f"({summary['train_seconds']:.0f} s): test accuracy **{acc:.4f}** on {d['length']}-bit strings "
            f"(`classifier_accuracy`; chance is 0.5). Its config is `PARITY_CLASSIFIER` in "
            f"`numformer/experiments/synthetic.py`.")
    return {**figures, "classifier_accuracy": acc}, md + "\n\n" + text


SEQ_METRICS = ["exact_match", "token_accuracy"]
ENC_DEC = ("cross", "decoder", "encoder")        # the cross-attention shows how copy, reversal and parity are solved

COPY_WHY = (
    "Why this model: the cross-attention only has to learn the diagonal (target position t reads source "
    "position t), which sinusoidal positions on both sides make easy at any length; the decoder-only GPT "
    "must learn to look back 129 positions inside one 257-token sequence, and stayed at chance for "
    "hundreds of steps in probes (see the comment in configs/copy.toml).")
REVERSAL_WHY = (
    "Why this model: the cross-attention learns the anti-diagonal (target position t reads source position "
    "L - 1 - t); the decoder-only GPT stayed at chance for 500 steps in a probe at this length (see the "
    "comment in configs/reversal.toml).")
ADDITION_WHY = (
    "Format: operands zero-padded to 8 digits, the sum written least significant digit first (Lee et al. "
    "2023), so each sum digit needs the two operand digits of its place and the carry from the place "
    "below, already written. Why this model: with that format each answer step reads two prompt positions "
    "at fixed offsets and its own previous output, which one causal stack does directly.")
SORTING_WHY = (
    "Why this model: each answer step is a content lookup (the smallest prompt number not yet written, "
    "repeated numbers as often as they occur), and the decoder-only GPT sees the prompt and its own answer "
    "so far in the same attention.")

register(Experiment(
    "copy", "Copy: reproduce a sequence of 128 random symbols (10 symbols; 1,000 held-out test sequences).",
    [Target("exact_match", 0.99)], quick_overrides=QUICK + ["data.length=8"], time_limit_minutes=30,
    extra=synthetic_extra("copy", SEQ_METRICS, COPY_WHY), attention_groups=ENC_DEC), group="synthetic")
register(Experiment(
    "reversal", "Reversal: output a sequence of 64 random symbols in reverse order (10 symbols; 1,000 held-out "
    "test sequences).",
    [Target("exact_match", 0.99)], quick_overrides=QUICK + ["data.length=8"], time_limit_minutes=30,
    extra=synthetic_extra("reversal", SEQ_METRICS, REVERSAL_WHY), attention_groups=ENC_DEC), group="synthetic")
register(Experiment(
    "parity", "Parity of 64-bit strings (1,000 held-out test strings).",
    [Target("accuracy", 0.95)], quick_overrides=QUICK + ["data.length=8"], time_limit_minutes=30,
    extra=parity_extra, extra_runs=(PARITY_BASELINE,), attention_groups=ENC_DEC), group="synthetic")
register(Experiment(
    "addition", "Addition of two numbers of up to 8 digits (1,000 held-out test pairs).",
    [Target("exact_match", 0.99)], quick_overrides=QUICK + ["data.length=3"], time_limit_minutes=30,
    extra=synthetic_extra("addition", SEQ_METRICS, ADDITION_WHY)), group="synthetic")
register(Experiment(
    "sorting", "Sorting sequences of 32 numbers from 0 to 99 (1,000 held-out test sequences).",
    [Target("exact_match", 0.99)], quick_overrides=QUICK + ["data.length=6"], time_limit_minutes=30,
    extra=synthetic_extra("sorting", SEQ_METRICS, SORTING_WHY)), group="synthetic")
