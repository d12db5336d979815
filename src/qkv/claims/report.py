"""The claims' results as a text table (``qkv verify``) and as a Markdown report (``--markdown``).

Shapes: none (records in, text out).
"""
from __future__ import annotations

import textwrap

from .registry import Claim


def format_table(results: list[Claim], *, width: int = 100) -> str:
    """A text table: one line per claim (result, section, claim), the measured numbers wrapped beneath."""
    lines = [f"{'result':<7} {'section':<19} claim", "-" * width]
    for r in results:
        lines.append(f"{'holds' if r.holds else 'FAILS':<7} {r.section:<19} {r.claim}  [{r.name}]")
        lines += textwrap.wrap(r.summary, width=width, initial_indent=" " * 8, subsequent_indent=" " * 10)
    failed = [r.name for r in results if not r.holds]
    lines.append("-" * width)
    lines.append(f"{len(results) - len(failed)} of {len(results)} claims hold" +
                 (f"; failing: {', '.join(failed)}" if failed else ""))
    return "\n".join(lines)


def format_markdown(results: list[Claim], figures: dict[str, str] | None = None) -> str:
    """A Markdown report: the table, then each figure (caption -> relative PNG path)."""

    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    held = sum(r.holds for r in results)
    lines = ["# qkv verify: the spec's claims, measured", "",
             f"{held} of {len(results)} claims hold. Produced by `qkv verify --markdown`; every number below is "
             "measured on qkv's own modules (seeded, CPU).", "",
             "| claim | section | measured | holds |", "|---|---|---|---|"]
    lines += [f"| {cell(r.claim)} (`{r.name}`) | {cell(r.section)} | {cell(r.summary)} | "
              f"{'✅ holds' if r.holds else '❌ fails'} |" for r in results]
    for caption, path in (figures or {}).items():
        lines += ["", f"## {caption}", "", f"![{caption}]({path})"]
    return "\n".join(lines) + "\n"
