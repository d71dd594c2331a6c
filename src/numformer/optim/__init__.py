"""Optimizers (SGD, Adam, AdamW), parameter groups, learning-rate schedules and gradient clipping."""
from .optimizers import OPTIMIZERS, SGD, Adam, AdamW, Optimizer, param_groups
from .schedules import (SCHEDULES, Schedule, clip_grad_norm, constant, make_schedule, noam, warmup_cosine,
                        warmup_linear, warmup_stable_decay)

__all__ = ["OPTIMIZERS", "SGD", "Adam", "AdamW", "Optimizer", "param_groups", "SCHEDULES", "clip_grad_norm",
           "constant", "make_schedule", "noam", "Schedule", "warmup_cosine", "warmup_linear", "warmup_stable_decay"]
