"""The spec's claims as checks that measure qkv's own modules (`qkv verify`).

Each check returns a ``Claim`` record {name, claim, section, measured, holds, summary, claim_zh}.
Its core takes the function or module under test (qkv's by default), so a test can hand it a
broken one and watch it fail: a check that cannot fail proves nothing. Sections (§1.3 …) and
FAQ numbers (Q3 …) are those of the spec (the Chinese tutorial qkv implements; docs/conventions.md); ``claim_zh`` quotes
its sentence. The fast checks are seeded and run in about a second each on a CPU; the heavy
ones run with ``run_claims(full=True)``; what cannot be measured is a row with ``holds`` None
and the reason (``run_claims(unmeasurable=True)``).

One module per chapter or theme; a new check is a function with ``@check(...)`` in its module.
They are imported below in the spec's order, which is the registry's and ``qkv verify``'s order.
"""
from .registry import (CHECKS, FULL_CHECKS, NOT_MEASURABLE, RUN_CHECKS, Claim, all_hold, check, claim_names,
                       not_measurable, resolve_names, run_claims, seeded)
from . import (self_attention, recurrence, multi_head, positional, placement, block_order, masks,  # noqa: E402,F401
               faq, extrapolation, alternatives, complexity, spec_code, corrections, unmeasurable)  # (registers, in this order)
from .complexity import measure_complexity
from .report import format_markdown, format_table, words
from .runs import run_text_ids, validation_text

__all__ = ["CHECKS", "FULL_CHECKS", "NOT_MEASURABLE", "RUN_CHECKS", "Claim", "all_hold", "check", "claim_names",
           "format_markdown", "format_table", "measure_complexity", "not_measurable", "resolve_names",
           "run_claims", "run_text_ids", "seeded", "validation_text", "words"]
