"""Deprecated: use ``qkv.viz.explorer`` (and ``qkv.tokens.encode_text`` for ``tokenize``)."""
import warnings

from ..viz.explorer import *  # noqa: F401,F403

warnings.warn("qkv.inspect.explorer is deprecated: use qkv.viz.explorer", DeprecationWarning, stacklevel=2)
