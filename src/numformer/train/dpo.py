"""Direct preference optimisation in the trainer (Rafailov et al. 2023): which runs train with it, and the
reference model's log-probabilities, computed once from the starting weights and kept in the run folder.

The loss and its backward are ``train/step.py``'s ``dpo_loss_and_backward`` (ops: ``sequence_logprob`` and
``dpo_loss``)."""
from __future__ import annotations

import numpy as np

from ..data.chat_tasks import sequence_logprobs
from ..safetensors_reader import read_safetensors_file
from ..safetensors_writer import safetensors_pieces
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
        reference = read_reference(path, len(task.examples))
    else:
        reference = sequence_logprobs(model, task, np.arange(len(task.examples)))
        if write:
            write_atomic(path, safetensors_pieces({"reference": reference}))
    task.set_reference(reference)


def read_reference(path, n_pairs):
    """The (n_pairs, 2) reference log-probabilities stored in ``path``; ValueError naming the file when it does not
    hold them (another tensor, shape or type, a value that is not a finite log-probability <= 0)."""
    tensors = read_safetensors_file(path)
    reference = tensors.get("reference")
    if reference is None or set(tensors) != {"reference"}:
        raise ValueError(f"{path} holds {sorted(tensors)}, not the one tensor 'reference' of a DPO run's reference "
                         f"log-probabilities; restore it, or train again")
    if reference.shape != (n_pairs, 2) or reference.dtype.kind != "f":
        raise ValueError(f"{path}: 'reference' is {reference.dtype} of shape {reference.shape}, not the float "
                         f"log-probabilities of the chosen and rejected replies of the {n_pairs} pairs ({n_pairs}, 2) "
                         f"of the run's data; restore it, or train again")
    if not np.all(np.isfinite(reference) & (reference <= 0)):
        raise ValueError(f"{path}: 'reference' holds values that are not log-probabilities (finite, at most 0); "
                         f"restore it, or train again")
    return reference
