"""Other libraries' models as qkv modules and back: Hugging Face checkpoints (``hf``) and
PyTorch's ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` (``torch_nn``)."""
from .hf import from_hf, load_pretrained, to_hf
from .torch_nn import encoder_layer_from_torch, encoder_layer_to_torch, mha_from_torch, mha_to_torch

__all__ = ["from_hf", "to_hf", "load_pretrained",
           "mha_from_torch", "mha_to_torch", "encoder_layer_from_torch", "encoder_layer_to_torch"]
