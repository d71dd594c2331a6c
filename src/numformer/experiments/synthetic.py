"""The synthetic experiments of the design notes (seed 000) and the tutorial (seed 004)."""
from __future__ import annotations

from . import Experiment, Target, register

QUICK = ["train.max_steps=20", "train.eval_every=10", "train.checkpoint_every=10", "data.n_val=50",
         "data.n_test=50"]

register(Experiment("copy", "Copy: reproduce a sequence of 128 random symbols (1,000 held-out sequences).",
                    [Target("exact_match", 0.99)], quick_overrides=QUICK + ["data.length=8"],
                    time_limit_minutes=30), group="synthetic")
register(Experiment("reversal", "Reversal: output a sequence of 64 random symbols in reverse order.",
                    [Target("exact_match", 0.99)], quick_overrides=QUICK + ["data.length=8"],
                    time_limit_minutes=30), group="synthetic")
register(Experiment("parity", "Parity of 64-bit strings.",
                    [Target("accuracy", 0.95)], quick_overrides=QUICK + ["data.length=8"],
                    time_limit_minutes=30), group="synthetic")
register(Experiment("addition", "Addition of two numbers of up to 8 digits.",
                    [Target("exact_match", 0.99)], quick_overrides=QUICK + ["data.length=3"],
                    time_limit_minutes=30), group="synthetic")
register(Experiment("sorting", "Sorting 32 numbers from 0 to 99.",
                    [Target("exact_match", 0.99)], quick_overrides=QUICK + ["data.length=6"],
                    time_limit_minutes=30), group="synthetic")
