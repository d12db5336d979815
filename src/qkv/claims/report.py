"""The claims' results as a text table (``qkv verify``) and as a Markdown report (``--markdown``),
in English or in Chinese (``lang="zh"``: each claim in the spec's own words, the measured
numbers unchanged). Rows that could not be measured come last, with the reason.

Shapes: none (records in, text out).
"""
from __future__ import annotations

import textwrap
import unicodedata

from .registry import Claim

WORDS = {
    "en": {"result": "result", "section": "section", "claim": "claim", "measured": "measured", "verdict": "holds",
           True: "holds", False: "FAILS", None: "n/a",
           "md": {True: "✅ holds", False: "❌ fails", None: "➖ not measurable"},
           "unmeasured": "not measurable here (the reason below each):",
           "tally": "{held} of {measured} claims hold", "failing": "; failing: {names}",
           "skipped": "; {count} not measurable", "title": "# qkv verify: the spec's claims, measured",
           "intro": "Produced by `qkv verify --markdown`; every number below is measured on qkv's own modules "
                    "(seeded, CPU)."},
    "zh": {"result": "结果", "section": "章节", "claim": "原文论断", "measured": "测量值", "verdict": "结论",
           True: "成立", False: "不成立", None: "无法测量",
           "md": {True: "✅ 成立", False: "❌ 不成立", None: "➖ 无法测量"},
           "unmeasured": "此处无法测量（原因写在每条下面）：",
           "tally": "{measured} 条论断中 {held} 条成立", "failing": "；不成立：{names}",
           "skipped": "；{count} 条无法测量", "title": "# qkv verify：逐条测量原文的论断",
           "intro": "由 `qkv verify --markdown --lang zh` 生成；下面每个数字都在 qkv 自己的模块上测得（固定随机种子，CPU）。"},
}


def words(lang: str) -> dict:
    if lang not in WORDS:
        raise ValueError(f"lang must be one of {sorted(WORDS)}, got {lang!r}")
    return WORDS[lang]


def columns(text: str) -> int:
    """Terminal columns ``text`` takes: a CJK character takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def pad(text: str, width: int) -> str:
    """``text`` left-aligned in ``width`` terminal columns."""
    return text + " " * max(0, width - columns(text))


def wrap(text: str, width: int) -> list[str]:
    """``text`` wrapped to about ``width`` columns, indented under its claim."""
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
        lines.append(f"{pad(w[r.holds], col)} {pad(r.section, 19)} {claim}  [{r.name}]")
        lines += wrap(summary, width)
    return "\n".join(lines + ["-" * width, tally(results, lang)])


def format_markdown(results: list[Claim], figures: dict[str, str] | None = None, *, lang: str = "en") -> str:
    """A Markdown report: the table, then each figure (caption -> relative PNG path)."""
    w = words(lang)

    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    lines = [w["title"], "", f"{tally(results, lang)}. {w['intro']}", "",
             f"| {w['claim']} | {w['section']} | {w['measured']} | {w['verdict']} |", "|---|---|---|---|"]
    rows = [r for r in results if r.holds is not None] + [r for r in results if r.holds is None]
    for r in rows:
        claim, summary = text_of(r, lang)
        lines.append(f"| {cell(claim)} (`{r.name}`) | {cell(r.section)} | {cell(summary)} | {w['md'][r.holds]} |")
    for caption, path in (figures or {}).items():
        lines += ["", f"## {caption}", "", f"![{caption}]({path})"]
    return "\n".join(lines) + "\n"
