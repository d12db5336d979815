"""Other libraries' models as qkv modules and back: Hugging Face checkpoints (``hf``), GGUF files (``gguf``:
``from_gguf`` reads llama.cpp's) and PyTorch's ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer``
(``torch_nn``)."""
from .gguf import from_gguf, load_gguf
from .hf import from_hf, load_pretrained, to_hf
from .torch_nn import encoder_layer_from_torch, encoder_layer_to_torch, mha_from_torch, mha_to_torch

__all__ = ["from_hf", "to_hf", "load_pretrained", "from_gguf", "load_gguf",
           "mha_from_torch", "mha_to_torch", "encoder_layer_from_torch", "encoder_layer_to_torch"]
