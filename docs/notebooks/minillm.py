# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # MiniLLM with numformer: build, count, train, sample
#
# MiniLLM is a small character-level GPT: 6 decoder layers, 6 heads, d_model 384, a context of
# 256 characters, trained on tiny Shakespeare. This notebook builds it with numformer, counts its
# parameters component by component, trains it for a few steps and samples from it.
#
# Open it in Jupyter with jupytext installed (`pip install jupytext`, then open this .py
# file as a notebook), or convert it: `jupytext --to notebook docs/notebooks/minillm.py`.
# The test suite executes it with smaller settings (`tests/test_docs_notebook.py`).

# %% tags=["parameters"]
train_steps = 30     # a brief demonstration; the full configuration trains 5,000 steps
batch_size = 8
sample_length = 200
val_fraction = 0.01  # the last 1% of the text (11k characters): a quick evaluation

# %%
import numpy as np

from numformer import GPT
from numformer.data.text import read_corpus
from numformer.data.tokenizers import CharTokenizer
from numformer.models import format_parameter_report

text = read_corpus()                      # tiny Shakespeare, packaged with numformer
tok = CharTokenizer.from_text(text)
print(f"{len(text):,} characters, vocabulary of {tok.vocab_size}")
print(repr("".join(tok.chars)))

# %% [markdown]
# ## Build the model
#
# The configuration of `configs/shakespeare_char_full.toml`, but with biases (the config has
# `bias = false`): pre-LN blocks (a LayerNorm before attention and before the feed-forward layer,
# and a final one), GELU, learned positions, and an output layer that shares the token
# embedding's weights.

# %%
config = dict(vocab_size=tok.vocab_size, block_size=256, n_layers=6, n_heads=6,
              d_model=384, dropout=0.2, positional="learned", activation="gelu",
              norm_first=True, tie_weights=True)
model = GPT(**config, rng=np.random.default_rng(1337))
print(model.__class__.__name__, f"with {model.num_parameters():,} parameters")

# %% [markdown]
# ## Count the parameters
#
# `format_parameter_report` breaks the count down by component, with the first block's
# attention, feed-forward and norms in detail. By hand: each block has 4·d² + 4·d for attention
# (Q, K, V and output projections with biases), 8·d² + 5·d for the feed-forward layer
# (d → 4d → d) and 4·d for its two LayerNorms; the token embedding has vocab·d and the position
# table 256·d; the final LayerNorm 2·d, and the tied output layer nothing of its own.

# %%
print(format_parameter_report(model))
d, V, T, L = 384, tok.vocab_size, 256, 6
by_hand = V * d + T * d + L * (4 * d * d + 4 * d + 8 * d * d + 5 * d + 4 * d) + 2 * d
print(f"by hand: {by_hand:,}")
assert by_hand == model.num_parameters()

# %% [markdown]
# ## Train briefly
#
# `Trainer` takes the same three sections as a config file. The loss starts near ln 65 ≈ 4.17 (a
# uniform guess over 65 characters); the full run of `configs/shakespeare_char_full.toml` takes
# hours on a CPU. Here the validation text is the last 1% of the corpus, so that the final
# evaluation, over every character of it, stays quick. It trains in one process (`processes = 1`;
# the default is one per core), so the numbers below are the same on any machine.

# %%
from numformer.train import Trainer

sizes = ("vocab_size", "block_size")          # the data task gives these two
run = {
    "model": {"type": "gpt", **{k: v for k, v in config.items() if k not in sizes}},
    "data": {"task": "text", "block_size": 256, "val_fraction": val_fraction},
    "train": {"max_steps": train_steps, "batch_size": batch_size, "lr": 1e-3,
              "beta2": 0.99, "weight_decay": 0.1, "schedule": "cosine",
              "warmup_steps": 10, "min_lr": 1e-4, "eval_every": train_steps,
              "eval_batches": 2, "eval_metrics": False, "seed": 1337,
              "processes": 1},        # one process: the same numbers on any machine
}
trainer = Trainer(run, "runs/minillm_notebook", overwrite=True, quiet=True)
summary = trainer.train()
print(f"{summary['steps']} steps, validation loss {summary['best_val_loss']:.3f}, "
      f"{summary['tokens_per_s']:,.0f} tokens/s")

# %%
from IPython.display import Image

from numformer import analysis as A

# numformer's figures are drawn off-screen (no pyplot): write the PNG, then show it
A.plot_loss_curves(A.read_metrics("runs/minillm_notebook/metrics.jsonl"),
                   path="runs/minillm_notebook/loss.png")
Image("runs/minillm_notebook/loss.png")

# %% [markdown]
# ## Sample
#
# The same prompt with three strategies: greedy, temperature 0.8, and nucleus (top-p 0.9)
# sampling. After a few steps the model has learned character frequencies and little else.

# %%
from numformer.generate import generate

model = trainer.model.eval()
prompt = tok.encode("ROMEO:")
strategies = {"greedy": dict(greedy=True), "temperature 0.8": dict(temperature=0.8),
              "top-p 0.9": dict(top_p=0.9)}
for name, options in strategies.items():
    print(f"--- {name}")
    print(tok.decode(generate(model, prompt, sample_length, rng=0, **options)))
