"""Seeing inside a model: attention maps (``maps``), figures (``plots``, saved by ``figures``)
and the attention explorer (``explorer``; a mixture of experts' load from its run: ``experts``).

Importing this package imports no matplotlib: ``plots`` and ``figures`` need it and are
imported on use (``from qkv.viz import plots``).
"""
from .maps import attention_maps, attention_weights

__all__ = ["attention_maps", "attention_weights"]
