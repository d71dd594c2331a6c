"""What a run builds to train: its model (``build_trained_model``: [model], the init_from weights, [lora]
adapters), the optimizer of its [train] section (``make_optimizer``), and the check that the model can be
trained as configured (``check_trainable``)."""
from __future__ import annotations

import contextlib
from pathlib import Path

from .._platform import check_memory
from ..config import schedule_warning
from ..interop.hf.families import default_export_type
from ..interop.peft import savable_adapter_keys
from ..interop.sources import check_load_memory, load_weights
from ..lora import add_lora
from ..models import build_model
from ..nn import MultiHeadAttention
from ..optim import OPTIMIZERS, SGD, AdamW, Muon, hidden_matrices, param_groups
from . import run_folder


def build_trained_model(config, rng, dtype, resume):
    """The model a run trains: built from [model]; a new run fine-tuning a source (``init_from``) starts from its
    weights (refused first when this machine lacks the memory for them: ``check_load_memory``); [lora] adapters
    go on those weights, everything else frozen; then checked (``check_trainable``)."""
    model_cfg = dict(config["model"])
    init_from = model_cfg.pop("init_from", None)
    if init_from is not None and not resume:
        check_load_memory(init_from, dtype)         # before the model takes its memory
    model = build_model(model_cfg, rng=rng, dtype=dtype)
    if init_from is not None and not resume:
        with _reading_source(init_from):
            load_weights(model, init_from)
    if config.get("lora"):
        add_lora(model, **config["lora"], rng=rng)
    check_trainable(model)
    return model


@contextlib.contextmanager
def _reading_source(source):
    """A run folder given as init_from is read under its shared lock, as ``numformer eval`` reads one: while a run
    trains there (holding it exclusively) it is refused with one line, not read between two of its writes."""
    path = Path(str(source))
    if not (path.is_dir() and run_folder.holds_run(path)):
        yield
        return
    with run_folder.RunLock(path, exclusive=False, what="read"):
        yield


def describe_run(model, n_params, task, config):
    """The line a new run starts with: the model, its parameters and data; a warning for a warmup longer than
    the run (``config.schedule_warning``), and one for [lora] adapters without [model] init_from (they would
    train on a random base, frozen: LoRA fine-tunes a trained model)."""
    trainable = sum(p.size for p in model.parameters() if p.requires_grad)
    of_which = f" ({trainable:,} trained, the rest frozen)" if trainable < n_params else ""
    line = f"{type(model).__name__} with {n_params:,} parameters{of_which}; data: {task.describe()}"
    warning = schedule_warning(config["train"])
    if warning:
        line += f"\n{warning}"
    if config.get("lora") and "init_from" not in config["model"]:
        line += ("\nwarning: [lora] adapters without [model] init_from train on a random, frozen base; LoRA "
                 "fine-tunes a trained model: set [model] init_from to a run folder or a Hugging Face model")
    if config.get("lora"):
        line += peft_export_note(model)
    return line


def peft_export_note(model):
    """'' or a note line for a LoRA run whose adapters have no module of their own in the Hugging Face family
    it exports as (GPT-2's fused c_attn on a Llama-style base, Llama's q_proj on GPT-2's): said at the start,
    not first by ``numformer export`` after the training."""
    try:
        savable_adapter_keys(model, default_export_type(model.config))
    except ValueError as e:
        return f"\nnote: this run will not export as a PEFT adapter: {e}"
    return ""


def make_optimizer(model, train):
    """The [train] optimizer over the model's parameter groups (``param_groups``). "muon": Muon over the
    hidden layers' matrices (``hidden_matrices``) with the run's weight_decay, and an AdamW with lr, betas
    and eps over every other parameter, in its groups."""
    groups = param_groups(model, train["weight_decay"], tuple(train["no_decay"]))
    name = train["optimizer"]
    if name == "muon":
        matrices = hidden_matrices(model)
        if not matrices:
            raise ValueError("[train] optimizer = \"muon\" needs Linear layers inside Transformer blocks, and "
                             "this model has none; use optimizer = \"adamw\"")
        taken = {id(p) for p in matrices}
        rest = [{**g, "params": [p for p in g["params"] if id(p) not in taken]} for g in groups]
        rest = [g for g in rest if g["params"]]
        adamw = AdamW(rest, lr=train["lr"], betas=(train["beta1"], train["beta2"]), eps=train["eps"]) if rest else None
        # base_lr: the schedule gives values relative to [train] lr; Muon's run at muon_lr / lr of them (also
        # when every trainable parameter is a hidden matrix, as with LoRA, and no AdamW holds lr)
        return Muon(matrices, adamw, base_lr=train["lr"], lr=train["muon_lr"], momentum=train["muon_momentum"],
                    nesterov=train["muon_nesterov"], ns_steps=train["muon_ns_steps"],
                    weight_decay=train["weight_decay"])
    if name == "sgd":
        return OPTIMIZERS[name](groups, lr=train["lr"], momentum=train["momentum"], nesterov=train["nesterov"])
    return OPTIMIZERS[name](groups, lr=train["lr"], betas=(train["beta1"], train["beta2"]), eps=train["eps"])


def training_memory_needed(optimizer):
    """(bytes, what they count) that training adds to a built model with ``optimizer``: a gradient for each
    parameter it updates and the optimizer's buffers (``_buffers``: AdamW's two moments; Muon's and, with
    momentum, SGD's one), each the parameter's size. Not counted: the activations of a step (they depend on
    the batch and the context) and data-parallel worker processes' own gradients."""
    optimizers = [optimizer] + ([optimizer.adamw] if getattr(optimizer, "adamw", None) is not None else [])
    need, counted = 0, 0
    for opt in optimizers:
        for group in opt.param_groups:
            buffers = 0 if isinstance(opt, SGD) and not group["momentum"] else len(opt._buffers)   # lazily
            for p in group["params"]:
                need += p.data.nbytes * (1 + buffers)
                counted += p.data.size
    return need, f"the gradients and optimizer state of {counted:,} trained parameters"


def check_training_memory(run_dir, optimizer):
    """One ValueError before anything trains (or is written) when the memory left lacks room for what
    training adds to the model (``training_memory_needed``; ``_platform.check_memory``): training would end
    in the operating system killing the process at its first step. Returns ``optimizer``."""
    check_memory(f"training {run_dir}", *training_memory_needed(optimizer))
    return optimizer


def check_trainable(model):
    """Settings a model accepts for inference but cannot train with, caught before the run folder is written."""
    for name, m in model.named_modules():
        if isinstance(m, MultiHeadAttention) and m.attention == "flash" and m.dropout_p > 0:
            raise ValueError(f"[model] attention = \"flash\" has no attention dropout, but {name} has dropout "
                             f"{m.dropout_p}; set [model] dropout = 0 or attention = \"plain\"")
