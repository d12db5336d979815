"""Deprecated: use ``qkv.claims`` (checks by chapter: ``qkv.claims.self_attention`` …) and
``qkv.tokens.encode_text``. Every name this module had is still found here for one release."""
import warnings

from .. import claims as _claims
from ..claims import *  # noqa: F401,F403
from ..claims import corrections, faq, masks, measure, multi_head, positional, runs, self_attention
from . import encode_text  # noqa: F401  (the old form: ids as a tensor)

warnings.warn("qkv.inspect.claims is deprecated: use qkv.claims", DeprecationWarning, stacklevel=2)

_MODULES = (self_attention, multi_head, positional, masks, faq, corrections, runs, measure, _claims)


def __getattr__(name: str):
    """Old names, found where they live now."""
    for module in _MODULES:
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
