"""The spec's claims as checks that measure qkv's own modules (`qkv verify`).

Each check returns a ``Claim`` record {name, claim, section, measured, holds, summary}. Its core
takes the function or module under test (qkv's by default), so a test can hand it a broken one
and watch it fail: a check that cannot fail proves nothing. Sections (§1.3 …) and FAQ numbers
(Q3 …) are those of the spec (seed/000_e6b97a1375c22a3f.txt). Every check is seeded and runs in
about a second on a CPU.

One module per chapter; a new check is a function with ``@check(...)`` in its chapter's module.
They are imported below in the spec's order, which is the registry's and ``qkv verify``'s order.
"""
from .registry import CHECKS, RUN_CHECKS, Claim, check, claim_names, resolve_names, run_claims, seeded
from . import self_attention, multi_head, positional, masks, faq, corrections  # noqa: E402,F401  (registers)
from .report import format_markdown, format_table
from .runs import run_text_ids, validation_text

__all__ = ["CHECKS", "RUN_CHECKS", "Claim", "check", "claim_names", "format_markdown", "format_table",
           "resolve_names", "run_claims", "run_text_ids", "seeded", "validation_text"]
