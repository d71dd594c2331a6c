"""Interoperability: loading a model from any source (``sources``: a run folder, a Hugging Face folder or a hub
id), Hugging Face checkpoints in and out (``hf``: one file per family; ``hf_rope``: their RoPE fields), LoRA
adapters in PEFT's format (``peft``), PyTorch modules (``torch``) and safetensors reading
(``safetensors_reader``)."""
