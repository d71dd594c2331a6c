"""Data: tokenizers, dataset loaders, synthetic tasks and batching, behind the Task interface."""
from .base import IGNORE, TASKS, Batch, Task, make_task, pad_sequences, register_task

# Importing a task module registers its tasks (TASKS): numformer's own tasks are all registered with the package.
from . import chat_tasks, tasks, text, text_tasks, user_tasks  # noqa: F401,E402

__all__ = ["IGNORE", "TASKS", "Batch", "Task", "make_task", "pad_sequences", "register_task"]
