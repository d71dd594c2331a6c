"""numformer: a complete Transformer library in NumPy, with a hand-written backward pass for every layer."""
from . import kernels, nn, ops
from ._runtime import get_num_threads, set_fast_runtime, set_num_threads
from .interop.sources import load
from .models import GPT, BlockConfig, EncoderClassifier, GPTConfig, Transformer, build_model
from .nn.dispatch import reference_mode

__version__ = "0.1.0"
__all__ = ["nn", "ops", "kernels", "reference_mode", "GPT", "GPTConfig", "BlockConfig", "EncoderClassifier",
           "Transformer", "build_model", "load", "set_fast_runtime", "set_num_threads", "get_num_threads",
           "__version__"]
