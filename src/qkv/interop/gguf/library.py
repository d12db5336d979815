"""The ``gguf`` package (llama.cpp's gguf-py), imported where a GGUF file is written or read."""
from __future__ import annotations


def gguf_module():
    """The ``gguf`` package (the gguf extra), with the install line when it is missing."""
    try:
        import gguf
    except ImportError:
        raise ValueError("GGUF files are written and read with the gguf package: pip install 'qkv[gguf]'") from None
    return gguf
