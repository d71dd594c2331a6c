"""Training: the loop, evaluation, early stopping, checkpoints and resume."""
from ..config import TRAIN_DEFAULTS, load_config_json, resolve_config
from ..run_files import (load_checkpoint, load_model_weights, load_tokenizer_state, save_checkpoint, save_model,
                         write_atomic)
from .early_stopping import EarlyStopping
from .run import load_model, load_task
from .evaluation import evaluate_loss
from .trainer import Trainer, TrainingDiverged

__all__ = ["Trainer", "TrainingDiverged", "EarlyStopping", "TRAIN_DEFAULTS", "resolve_config", "evaluate_loss",
           "save_checkpoint", "load_checkpoint", "save_model", "load_model_weights", "write_atomic", "load_model",
           "load_task", "load_config_json", "load_tokenizer_state"]
