"""numformer: a complete Transformer library in NumPy, with a hand-written backward pass for every layer."""
from . import kernels, nn, ops
from ._runtime import get_num_threads, set_fast_runtime, set_num_threads
from .interop import hf as _hf  # noqa: F401  (registers the pretrained-weights loader: GPT.from_pretrained, init_from)
from .models import GPT, EncoderClassifier, Transformer, build_model
from .nn.dispatch import reference_mode

__version__ = "0.1.0"
__all__ = ["nn", "ops", "kernels", "reference_mode", "GPT", "EncoderClassifier", "Transformer", "build_model", "set_fast_runtime", "set_num_threads",
           "get_num_threads", "__version__"]
