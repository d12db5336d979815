"""Text laid out without matplotlib: the languages qkv writes its reports in (``--lang``), which
characters are CJK, and text wrapped to a width by any measure (points on a figure, columns on a
terminal), breaking at spaces and between CJK characters, which Chinese writes without spaces.

Shapes: none (text).
"""
from __future__ import annotations

import re
from typing import Callable

LANGS = ("en", "zh")  # `qkv verify --lang`, `qkv study … --lang`


def language(lang: str) -> str:
    """``lang`` itself, checked: one of LANGS; ValueError naming them otherwise."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {list(LANGS)}, got {lang!r}")
    return lang


# Han (with extensions and compatibility ideographs), CJK punctuation, kana, bopomofo,
# Hangul, CJK strokes and enclosed forms, full-width forms.
CJK = re.compile("[\u1100-\u11ff\u2e80-\u2fdf\u3000-\u30ff\u3100-\u9fff\ua960-\ua97f\uac00-\ud7ff"
                 "\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef\U00020000-\U0003134f]")
CLOSING = "，。；：、！？）》」』”’"  # punctuation that never starts a line: it stays with what it follows
# a CJK character (or the word before one) with its closing punctuation, or a word, with the spaces after it
WRAP_UNIT = re.compile(rf"(?:{CJK.pattern}|[^\s]+?(?={CJK.pattern}))[{CLOSING}]*\s*|\S+\s*|\s+")


def wrap_lines(text: str, width_of: Callable[[str], float], width: float) -> list[str]:
    """``text`` in lines each ``width_of(line) <= width`` (greedy; a unit wider than a line is cut by characters)."""
    lines, line = [], ""
    for unit in WRAP_UNIT.findall(text):
        if not line or width_of((line + unit).rstrip()) <= width:
            line += unit
            continue
        lines.append(line.rstrip())
        line = unit
    lines.append(line.rstrip())
    out = []
    for line in lines:  # a single word wider than a line: cut it where it overflows
        while len(line) > 1 and width_of(line) > width:
            cut = next(n for n in range(len(line) - 1, 0, -1) if width_of(line[:n]) <= width or n == 1)
            out.append(line[:cut])
            line = line[cut:].lstrip()
        out.append(line)
    return out
