"""Look inside and check: the spec's claims as measured checks (``claims``), figures (``plots``).

``plots`` needs matplotlib and is imported on use: ``from qkv.inspect import plots``.
"""
from .claims import CHECKS, Claim, claim_names, format_markdown, format_table, run_claims

__all__ = ["CHECKS", "Claim", "claim_names", "format_markdown", "format_table", "run_claims"]
