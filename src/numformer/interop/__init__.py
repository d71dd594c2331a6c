"""Interoperability: loading a model from any source (``sources``: a run folder, a Hugging Face folder or a hub
id), Hugging Face checkpoints in and out (``hf``: one file per family), PyTorch modules (``torch``) and
safetensors I/O."""
