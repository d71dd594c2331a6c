"""int8 weight-only quantization for generation: the reference in plain sight, the fast kernel beside it.

- ``reference``: symmetric absmax quantization per output channel or per group of inputs (``quantize``),
  ``dequantize``, and the quantized linear layer as dequantize-then-matmul (``quantized_linear_forward``).
- ``kernel``: the same product for generation's few rows, dequantizing one cache-sized block of weights at a
  time across numformer's threads, so that each int8 weight is read from memory once per token.
- ``layer``: ``QuantizedLinear`` (inference only) and ``quantize_model``, which swaps a model's linear layers
  for it by name and reports what it changed; ``LayerQuantizer``, the same one layer at a time while a model
  is loaded (``numformer.interop.sources.load(source, quantize=LayerQuantizer())``).
- ``processes``: ``worker_processes``, which shares each small-batch product's rows with worker processes
  mapping the same int8 weights (a hand-off between processes costs far less than one between threads).

    from numformer.quantize import quantize_model
    print(quantize_model(model, bits=8, group_size=None))       # then model.generate(...) as before
    with worker_processes(model):                                # optional: the products across processes
        model.generate(prompt, 100)
"""
from .layer import (LayerQuantizer, QuantizationReport, QuantizedLinear, QuantizedQKVProjection, quantize_model,
                    weight_bytes)
from .processes import worker_processes
from .reference import dequantize, quantize, quantized_linear_forward

__all__ = ["quantize", "dequantize", "quantized_linear_forward", "QuantizedLinear", "quantize_model", "LayerQuantizer",
           "QuantizationReport", "weight_bytes", "worker_processes"]
