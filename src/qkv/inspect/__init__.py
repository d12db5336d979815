"""Deprecated: ``qkv.inspect`` shared the standard library's module name. Use ``qkv.claims``
(the spec's claims) and ``qkv.viz`` (figures, attention maps, the explorer); this shim goes
in the next release.
"""
import warnings

warnings.warn("qkv.inspect is deprecated: use qkv.claims (claims) and qkv.viz (plots, explorer)",
              DeprecationWarning, stacklevel=2)

import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from .. import tokens  # noqa: E402
from ..claims import CHECKS, Claim, claim_names, format_markdown, format_table, run_claims  # noqa: E402

__all__ = ["CHECKS", "Claim", "claim_names", "format_markdown", "format_table", "run_claims"]


def encode_text(tokenizer, text: str, *, max_len: int) -> tuple[Tensor, list[str]]:
    """The old ``claims.encode_text`` / ``plots.encode_text``: ids as a (T,) long tensor
    (``qkv.tokens.encode_text`` returns a list)."""
    ids, labels = tokens.encode_text(tokenizer, text, max_len=max_len)
    return torch.tensor(ids, dtype=torch.long), labels
