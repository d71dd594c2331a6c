"""Interoperability: loading a model from any source (``sources``: a run folder, a Hugging Face folder or a hub
id), Hugging Face checkpoints in and out (``hf``: one file per family; ``hf_rope``: their RoPE fields), LoRA
adapters in PEFT's format (``peft``) and PyTorch modules (``torch``); their safetensors files are read by
``numformer.safetensors_reader``, which run folders use too."""
