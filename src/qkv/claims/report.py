"""The claims' results as a text table (``qkv verify``) and as a Markdown report (``--markdown``),
in English or in Chinese (``lang="zh"``: each claim in the spec's own words, each summary in its
Chinese twin from ``messages``, the measured numbers unchanged). Rows that could not be measured come last, with the reason.

Shapes: none (records in, text out).
"""
from __future__ import annotations

import textwrap
import unicodedata

from ..viz.text import CJK, wrap_lines
from .messages import WORDS, language, section_text
from .registry import Claim


def words(lang: str) -> dict:
    """The report's words (headers, verdicts, tally) in ``lang``; ValueError for another language."""
    return WORDS[language(lang)]


def columns(text: str) -> int:
    """Terminal columns ``text`` takes: a CJK character takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def pad(text: str, width: int) -> str:
    """``text`` left-aligned in ``width`` terminal columns."""
    return text + " " * max(0, width - columns(text))


def wrap(text: str, width: int) -> list[str]:
    """``text`` wrapped to about ``width`` columns, indented under its claim; CJK text (which has no
    spaces between words) breaks between its characters, measured in terminal columns."""
    if CJK.search(text):
        lines = wrap_lines(text, columns, width - 10)
        return [" " * (8 if i == 0 else 10) + line for i, line in enumerate(lines)]
    chars = width * len(text) // max(1, columns(text))  # fewer characters per line where they are wide
    return textwrap.wrap(text, width=chars, initial_indent=" " * 8, subsequent_indent=" " * 10)


def text_of(r: Claim, lang: str) -> tuple[str, str]:
    """(claim, summary) in ``lang``: zh takes the spec's sentence and a Chinese reason where there is one."""
    if lang == "zh":
        return r.claim_zh or r.claim, r.summary_zh or r.summary
    return r.claim, r.summary


def tally(results: list[Claim], lang: str) -> str:
    """'N of M claims hold[; failing: …][; K not measurable]'."""
    w = words(lang)
    measured = [r for r in results if r.holds is not None]
    failed = [r.name for r in measured if not r.holds]
    line = w["tally"].format(held=len(measured) - len(failed), measured=len(measured))
    line += w["failing"].format(names=", ".join(failed)) if failed else ""
    skipped = len(results) - len(measured)
    return line + (w["skipped"].format(count=skipped) if skipped else "")


def format_table(results: list[Claim], *, width: int = 100, lang: str = "en") -> str:
    """A text table: one line per claim (result, section, claim), the measured numbers (or the reason) beneath."""
    w = words(lang)
    col = max(7, *(columns(w[key]) for key in (True, False, None, "result")))
    lines = [f"{pad(w['result'], col)} {pad(w['section'], 19)} {w['claim']}", "-" * width]
    rows = [r for r in results if r.holds is not None] + [r for r in results if r.holds is None]
    for i, r in enumerate(rows):
        if r.holds is None and (i == 0 or rows[i - 1].holds is not None):
            lines.append(w["unmeasured"])
        claim, summary = text_of(r, lang)
        lines.append(f"{pad(w[r.holds], col)} {pad(section_text(r.section, lang), 19)} {claim}  [{r.name}]")
        lines += wrap(summary, width)
    return "\n".join(lines + ["-" * width, tally(results, lang)])


def format_markdown(results: list[Claim], figures: dict[str, str] | None = None, *, lang: str = "en") -> str:
    """A Markdown report: the table, then each figure (caption -> relative PNG path)."""
    w = words(lang)

    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    lines = [w["title"], "", w["lead"].format(tally=tally(results, lang), intro=w["intro"]), "",
             f"| {w['claim']} | {w['section']} | {w['measured']} | {w['verdict']} |", "|---|---|---|---|"]
    rows = [r for r in results if r.holds is not None] + [r for r in results if r.holds is None]
    for r in rows:
        claim, summary = text_of(r, lang)
        lines.append(f"| {cell(claim)} (`{r.name}`) | {cell(section_text(r.section, lang))} | {cell(summary)} | "
                     f"{w['md'][r.holds]} |")
    for caption, path in (figures or {}).items():
        lines += ["", f"## {caption}", "", f"![{caption}]({path})"]
    return "\n".join(lines) + "\n"
