"""Interoperability: PyTorch weight conversion (``interop.torch``) and safetensors I/O."""
