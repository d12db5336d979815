"""README.md and README.zh-CN.md must not drift apart.

The Chinese README is a translation of the English one: prose, table headers and the comments
inside code blocks are translated, but the code of every fenced block (its comments left out, as
tests/test_code_blocks.py reads them) is the same and every ``qkv …`` command the English text
shows appears in the Chinese text too. These tests fail, naming what is missing on which side,
when one README gains a code block or a command the other lacks, or when a comment in a Chinese
code block is left in English. They also check that the two files link to each other in their
first lines. (That each python block runs as pasted is tests/test_code_blocks.py's test.)

To re-sync after editing README.md: copy each new or changed fenced block into the same section
of README.zh-CN.md and translate its comments (code unchanged), and write each new inline `qkv …`
command into the Chinese prose unchanged (flags, paths and quoted text exactly as in English).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from test_code_blocks import blocks, untranslated

ROOT = Path(__file__).resolve().parents[1]
EN = ROOT / "README.md"
ZH = ROOT / "README.zh-CN.md"

# A fenced block: an opening ``` line (with an optional info string such as bash or python),
# its body, and a closing ``` line. Matched at the start of a line, lazily, across lines.
FENCE = re.compile(r"^```[^\n`]*\n.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)
# An inline code span that holds a qkv command: `qkv train --max-minutes 30`. Spans may wrap
# onto the next line in Markdown, so the body may hold a newline; `qkv:` (program output)
# and `qkv[dev]` are not commands and do not match.
INLINE_QKV = re.compile(r"`(qkv\s[^`]+)`")
BASH_INFO = {"bash", "sh", "shell", "console"}


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def fenced_blocks(text: str) -> list[str]:
    return FENCE.findall(text)


def _normalise(command: str) -> str:
    return " ".join(command.split())


def qkv_commands(text: str) -> set[str]:
    """Every `qkv …` command in inline code outside fences, and every line of a bash block
    that starts with ``qkv `` (its trailing ``# comment`` removed), whitespace normalised."""
    commands: set[str] = set()
    for block in fenced_blocks(text):
        info = block.split("\n", 1)[0][3:].strip().lower()
        if info not in BASH_INFO:
            continue
        for line in block.splitlines()[1:-1]:
            line = line.strip()
            if line.startswith("qkv "):
                commands.add(_normalise(re.sub(r"\s+#.*$", "", line)))
    prose = FENCE.sub("", text)
    for match in INLINE_QKV.finditer(prose):
        commands.add(_normalise(match.group(1)))
    return commands


def _show(block: str, limit: int = 400) -> str:
    block = block if len(block) <= limit else block[:limit] + " …"
    return "\n".join("    " + line for line in block.splitlines())


def test_both_readmes_exist():
    assert EN.is_file(), f"missing {EN}"
    assert ZH.is_file(), f"missing {ZH}: the Simplified Chinese README (a translation of README.md)"


def test_readmes_link_to_each_other():
    en_head = _read(EN).splitlines()[:5]
    zh_head = _read(ZH).splitlines()[:5]
    assert any("(README.zh-CN.md)" in line for line in en_head), (
        "README.md's first lines must link to the Chinese README, e.g. "
        "'[简体中文](README.zh-CN.md)' right under the title; first lines are:\n"
        + "\n".join(en_head)
    )
    assert zh_head and zh_head[0].strip() == "# qkv", (
        f"README.zh-CN.md must start with '# qkv', not {zh_head[:1]!r}"
    )
    assert any("(README.md)" in line for line in zh_head), (
        "README.zh-CN.md's first lines must link back, e.g. '[English](README.md)'; first lines are:\n"
        + "\n".join(zh_head)
    )


def _code(block) -> str:
    """A block as the comparison sees it: its info string and its code without comments."""
    return f"```{block.info}\n{block.code}\n```"


def test_fenced_code_blocks_hold_the_same_code():
    en = Counter(_code(b) for b in blocks(_read(EN), EN))
    zh = Counter(_code(b) for b in blocks(_read(ZH), ZH))
    only_en = en - zh
    only_zh = zh - en
    if not only_en and not only_zh:
        return
    parts = [
        "README.md and README.zh-CN.md must hold the same fenced code blocks: the same code, comments "
        "aside (comments are translated); copy the English block into the same section of the Chinese "
        "README and translate its comments only. Blocks below are shown without their comments."
    ]
    for block, count in only_en.items():
        parts.append(f"\nin README.md but not in README.zh-CN.md (×{count}):\n{_show(block)}")
    for block, count in only_zh.items():
        parts.append(f"\nin README.zh-CN.md but not in README.md (×{count}):\n{_show(block)}")
    raise AssertionError("\n".join(parts))


def test_comments_in_the_chinese_code_blocks_are_chinese():
    zh = blocks(_read(ZH), ZH)
    assert any(b.comments for b in zh), "found no comments in README.zh-CN.md's code blocks: the extraction is broken"
    missing = untranslated(zh)
    assert not missing, "translate these comments of README.zh-CN.md's code blocks into Chinese:\n" + "\n".join(missing)


def test_qkv_commands_appear_in_both():
    en = qkv_commands(_read(EN))
    zh = qkv_commands(_read(ZH))
    assert en, "found no `qkv …` commands in README.md: the extraction is broken"
    only_en = sorted(en - zh)
    only_zh = sorted(zh - en)
    message = ["every `qkv …` command (inline code or a bash block line) must appear in both READMEs:"]
    if only_en:
        message.append("missing from README.zh-CN.md:\n" + "\n".join(f"    `{c}`" for c in only_en))
    if only_zh:
        message.append("missing from README.md:\n" + "\n".join(f"    `{c}`" for c in only_zh))
    assert not only_en and not only_zh, "\n".join(message)


def test_extraction_sees_what_it_should():
    text = (
        "Run `qkv train --max-minutes 30` or `qkv\nsample --run r`; not `qkv: error` nor `qkv[dev]`.\n\n"
        "```bash\nqkv verify --full   # a comment\nmake test\n```\n\n"
        "```python\nimport qkv\n```\n"
    )
    assert fenced_blocks(text) == ["```bash\nqkv verify --full   # a comment\nmake test\n```", "```python\nimport qkv\n```"]
    assert qkv_commands(text) == {"qkv train --max-minutes 30", "qkv sample --run r", "qkv verify --full"}
