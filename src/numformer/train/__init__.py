"""Training: the loop, evaluation, early stopping, checkpoints and resume."""
from .checkpoint import load_checkpoint, load_model_weights, save_checkpoint, save_model, write_atomic
from ..config import TRAIN_DEFAULTS, resolve_config
from .early_stopping import EarlyStopping
from .run import load_config_json, load_model, load_task, load_tokenizer_state
from .trainer import Trainer, TrainingDiverged, evaluate_loss

__all__ = ["Trainer", "TrainingDiverged", "EarlyStopping", "TRAIN_DEFAULTS", "resolve_config", "evaluate_loss",
           "save_checkpoint", "load_checkpoint", "save_model", "load_model_weights", "write_atomic", "load_model",
           "load_task", "load_config_json", "load_tokenizer_state"]
