"""Deprecated: use ``qkv.viz.plots`` (and ``qkv.viz.figures.save_png``)."""
import warnings

from ..viz.plots import *  # noqa: F401,F403
from . import encode_text  # noqa: F401  (the old form: ids as a tensor)

warnings.warn("qkv.inspect.plots is deprecated: use qkv.viz.plots", DeprecationWarning, stacklevel=2)
