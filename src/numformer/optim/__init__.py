"""Optimizers (SGD, Adam, AdamW, Muon), parameter groups, learning-rate schedules and gradient clipping."""
from .optimizers import (OPTIMIZERS, SGD, Adam, AdamW, Muon, Optimizer, adam_step, adamw_step, hidden_matrices,
                         newton_schulz, newton_schulz_many, param_groups)
from .schedules import (COOLDOWN_SHAPES, SCHEDULES, Schedule, clip_grad_norm, constant, make_schedule, noam,
                        train_schedule, warmup_cosine, warmup_linear, warmup_stable_decay)

__all__ = ["OPTIMIZERS", "SGD", "Adam", "AdamW", "Muon", "Optimizer", "adam_step", "adamw_step", "hidden_matrices",
           "newton_schulz", "newton_schulz_many", "param_groups", "COOLDOWN_SHAPES", "SCHEDULES", "Schedule",
           "clip_grad_norm", "constant", "make_schedule", "noam", "train_schedule", "warmup_cosine", "warmup_linear",
           "warmup_stable_decay"]
