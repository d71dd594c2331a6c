"""Direct preference optimisation in the trainer (Rafailov et al. 2023): which runs train with it, and the
reference model's log-probabilities, computed once from the starting weights and kept in the run folder.

The loss and its backward are ``train/step.py``'s ``dpo_loss_and_backward`` (ops: ``sequence_logprob`` and
``dpo_loss``)."""
from __future__ import annotations

import numpy as np

from ..data.chat_tasks import sequence_logprobs
from ..interop.safetensors_reader import read_safetensors_file
from ..run_files import write_atomic
from .run_folder import REFERENCE


def check_objective(objective, task, world):
    """Whether the run trains with DPO; ValueError when the objective and the task do not go together."""
    pairs = hasattr(task, "set_reference")
    if objective == "dpo" and not pairs:
        raise ValueError(f"[train] objective = \"dpo\" trains on preference pairs: set [data] task = "
                         f"\"preference\" (the task is {task.name!r})")
    if pairs and objective != "dpo":
        raise ValueError("[data] task = \"preference\" holds preference pairs for DPO: set [train] objective = "
                         "\"dpo\"")
    if objective == "dpo" and world is not None:
        raise ValueError("[train] objective = \"dpo\" trains in one process, not under MPI")
    return objective == "dpo"


def set_reference_logprobs(model, task, run_dir, resumed, write):
    """Give ``task`` the reference model's log-probability of every pair: those of the starting weights (the
    init_from model, or with LoRA the base, B being zero), computed once and stored in the run folder
    (``REFERENCE``, when this process ``write``s it); a resumed run reads them back."""
    path = run_dir / REFERENCE
    if resumed:
        if not path.is_file():
            raise ValueError(f"{path} is missing: the DPO run cannot be resumed without the reference "
                             f"log-probabilities it started with; train again")
        reference = read_safetensors_file(path)["reference"]
    else:
        from safetensors.numpy import save
        reference = sequence_logprobs(model, task, np.arange(len(task.examples)))
        if write:
            write_atomic(path, save({"reference": reference}))
    task.set_reference(reference)
