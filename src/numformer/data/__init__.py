"""Data: tokenizers, dataset loaders, synthetic tasks and batching, behind the Task interface."""
from .base import IGNORE, TASKS, Batch, Task, make_task, pad_sequences, register_task

__all__ = ["IGNORE", "TASKS", "Batch", "Task", "make_task", "pad_sequences", "register_task"]
