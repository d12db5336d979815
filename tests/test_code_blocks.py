"""Every fenced Python block of the READMEs and of the docs site's pages runs as pasted.

Which blocks: each ```` ```python ```` fence that starts a line of README.md, README.zh-CN.md or a page
under docs/ (``docs/**/*.md``), up to the next ```` ``` ```` line. The chapter notebooks
(docs/notebooks/*.ipynb) are executed by tests/test_notebooks.py instead.

How each runs: in a fresh ``python`` process whose working directory is an empty temporary directory,
with ``QKV_CACHE_DIR`` set to this session's cache (``qkv.runtime.cache_dir()``, so that the kernels
the suite builds once are built once here too) and matplotlib's Agg backend. The block is compiled
under the page's own path with its own line numbers, so a traceback names ``README.md``, line 42,
and shows that line; the test's id is the page and the line of the opening fence
(``test_block_runs[docs/training.md:173]``). The code a block shows must be quick: a block that
would train for minutes trains a tiny model for a few steps, and its page says what the full-size
call is.

A block whose code, comments left out (``tokenize``), equals that of a block run before it is the
same program and is not run again: a Chinese page's twin of an English block, whose comments alone
are translated, runs under the English block's id, and a failure names both places. That the
twins hold the same code, and that every comment of a Chinese page's python and bash blocks is in
Chinese, is checked here for docs/ (``test_twin_pages_hold_the_same_python_code``) and by
tests/test_readme_i18n.py for the READMEs.

Markers: an HTML comment alone on the line just before the fence, which renders as nothing on
GitHub and in mkdocs-material:

``<!-- fragment -->``
    the block is not a program (a list of signatures, for example) and is not run. Use it only for
    a block that cannot be made to run: a block that needs a checkpoint builds a tiny random one
    in the block itself, a block that needs a trained run trains one for a few steps.
``<!-- continues -->``
    the block continues the previous python block of the same page: it runs after that one (and
    after whatever that one continues) in the same process and namespace. Prefer self-contained
    blocks.

Any other comment in that place is an error (a misspelt marker must not silently run or skip a block).
docs/conventions.md describes the markers for writers of the pages.
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "README.zh-CN.md", *sorted(DOCS.rglob("*.md"))]
MARKERS = {"fragment", "continues"}
MARKER = re.compile(r"^<!--\s*(.*?)\s*-->\s*$")
BASH_INFO = {"bash", "sh", "shell", "console"}
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its info string's first word, its body, and its marker."""

    path: Path | None
    line: int  # the opening fence's line, counted from 1
    info: str  # "python", "bash", … ("" for a bare fence), lower case
    body: str  # the lines between the fences, each ending in "\n"
    marker: str | None  # the text of an HTML comment alone on the line before the fence

    @property
    def where(self) -> str:
        if self.path is None:
            name = "<text>"
        else:
            name = self.path.relative_to(ROOT).as_posix() if self.path.is_relative_to(ROOT) else str(self.path)
        return f"{name}:{self.line}"

    @property
    def code(self) -> str:
        return split_comments(self.info, self.body)[0]

    @property
    def comments(self) -> list[str]:
        return split_comments(self.info, self.body)[1]


def blocks(text: str, path: Path | None = None) -> list[Block]:
    """The fenced blocks of a Markdown text, in order. A fence is ``` at the start of a line; the block
    ends at the next line that is ``` alone (an unclosed fence runs to the end of the text)."""
    lines = text.splitlines(keepends=True)
    found, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        info = (lines[i][3:].split() or [""])[0].lower()
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        before = MARKER.match(lines[i - 1].strip()) if i else None
        found.append(Block(path, i + 1, info, "".join(lines[i + 1:end]), before.group(1) if before else None))
        i = end + 1
    return found


def page_blocks(path: Path) -> list[Block]:
    return blocks(path.read_text(encoding="utf-8"), path)


def _shell_comment_at(line: str) -> int | None:
    """Where a shell comment starts in ``line`` (a # at the start or after a blank, outside quotes)."""
    quote = None
    for j, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (j == 0 or line[j - 1].isspace()):
            return j
    return None


def _python_comment_columns(body: str) -> dict[int, int] | None:
    """{line index: column of its comment} by tokenize, or None where the body does not tokenize."""
    try:
        return {t.start[0] - 1: t.start[1] for t in tokenize.generate_tokens(io.StringIO(body).readline)
                if t.type == tokenize.COMMENT}
    except (tokenize.TokenError, SyntaxError):
        return None


def split_comments(info: str, body: str) -> tuple[str, list[str]]:
    """(the code with its comments left out, the comments' texts without the #).

    A comment is cut with the blanks before it, and a line that held only a comment is dropped, so a
    translation may re-align or re-wrap comments and keep the same code. Python is read by tokenize
    (a # in a string is no comment); shell lines by a quote-aware scan (as is Python that does not
    tokenize, such as a list of signatures); other blocks have no comments."""
    lines = body.splitlines()
    if info == "python":
        columns = _python_comment_columns(body)
    elif info in BASH_INFO:
        columns = None
    else:
        return body, []
    if columns is None:
        columns = {i: j for i, line in enumerate(lines) if (j := _shell_comment_at(line)) is not None}
    code, comments = [], []
    for i, line in enumerate(lines):
        if i in columns:
            comments.append(line[columns[i]:].lstrip("#").strip())
            line = line[:columns[i]].rstrip()
            if not line:
                continue
        code.append(line)
    return "\n".join(code), comments


def untranslated(zh: list[Block]) -> list[str]:
    """'FILE:LINE: # comment' for each comment of a python or shell block that holds no Chinese."""
    return [f"{b.where}: # {c}" for b in zh if b.info == "python" or b.info in BASH_INFO
            for c in b.comments if c and not CJK.search(c)]


# --- running the blocks ---------------------------------------------------------------------------

def python_blocks(path: Path) -> list[Block]:
    return [b for b in page_blocks(path) if b.info == "python"]


def chain(path: Path, block: Block) -> list[Block]:
    """The blocks to run for ``block``: itself, after the ones it continues."""
    previous = [b for b in python_blocks(path) if b.line < block.line]
    run = [block]
    while run[0].marker == "continues" and previous:  # a page's first block cannot continue: see below
        run.insert(0, previous.pop())
    return run


def runnable() -> list[tuple[str, list[Block], list[str]]]:
    """(id, the blocks to run, the other places with the same code) for each program, once."""
    programs: dict[tuple[str, ...], tuple[str, list[Block], list[str]]] = {}
    for path in PAGES:
        for b in python_blocks(path):
            if b.marker == "fragment":
                continue
            blocks_ = chain(path, b)
            key = tuple(x.code for x in blocks_)
            if key in programs:
                programs[key][2].append(b.where)
            else:
                programs[key] = (b.where, blocks_, [])
    return list(programs.values())


PROGRAMS = runnable()

# Runs each (path, first line, source) in one namespace; the source is offset so that its line numbers
# are the page's, and compiled under the page's path so that a traceback shows the page's lines.
DRIVER = """
import json, sys
namespace = {"__name__": "__main__"}
for path, line, source in json.load(sys.stdin):
    exec(compile("\\n" * line + source, path, "exec"), namespace)
"""


def run_blocks(run: list[Block], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Runs the blocks, in order, in one fresh python process in ``cwd``."""
    script = [[str(b.path), b.line, b.body] for b in run]
    return subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(script), cwd=cwd,
                          env=os.environ | env, capture_output=True, text=True, timeout=540)


@pytest.fixture(scope="session")
def cache_env() -> dict[str, str]:
    from qkv.runtime import cache_dir

    cache = cache_dir()
    return {"QKV_CACHE_DIR": str(cache) if cache else "off", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("where, run, twins", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_block_runs(where, run, twins, tmp_path, cache_env):
    done = run_blocks(run, tmp_path, cache_env)
    also = f" (the same code as {', '.join(twins)})" if twins else ""
    assert done.returncode == 0, (
        f"the python block at {where}{also} fails as pasted (exit status {done.returncode}); fix the block, "
        f"or mark it <!-- fragment --> if it cannot run:\n--- stdout ---\n{done.stdout[-3000:]}\n"
        f"--- stderr ---\n{done.stderr[-6000:]}")


# --- what the pages hold --------------------------------------------------------------------------

def test_pages_hold_blocks_and_every_marker_is_known():
    found = {p: python_blocks(p) for p in PAGES}
    assert len(found[ROOT / "README.md"]) >= 2 and sum(map(len, found.values())) >= 20, (
        f"found only {sum(map(len, found.values()))} python blocks: the extraction is broken")
    unknown = [f"{b.where}: <!-- {b.marker} -->" for bs in found.values() for b in bs
               if b.marker is not None and b.marker not in MARKERS]
    assert not unknown, ("an HTML comment just before a python fence must be one of "
                         f"{sorted(MARKERS)}:\n" + "\n".join(unknown))
    for bs in found.values():
        if bs and bs[0].marker == "continues":
            raise AssertionError(f"{bs[0].where} is marked <!-- continues --> but is its page's first python block")
    assert len(PROGRAMS) >= 20


def twin_pairs() -> list[tuple[Path, Path]]:
    return [(p.with_name(p.name[:-len(".zh.md")] + ".md"), p) for p in sorted(DOCS.rglob("*.zh.md"))]


@pytest.mark.parametrize("en, zh", twin_pairs(), ids=[zh.relative_to(ROOT).as_posix() for _, zh in twin_pairs()])
def test_twin_pages_hold_the_same_python_code(en, zh):
    """A Chinese page shows the English page's python blocks, in order, with the same code and markers;
    only the comments are translated. (Shell blocks may differ: a Chinese reader is shown --lang zh.)"""
    assert en.is_file(), f"{zh.name} has no English page {en.name}"
    want, got = python_blocks(en), python_blocks(zh)
    assert [(b.code, b.marker) for b in got] == [(b.code, b.marker) for b in want], (
        f"{zh.relative_to(ROOT)} must hold {en.name}'s python blocks in the same order, code and markers "
        "unchanged (translate only the comments): English "
        f"{[b.where for b in want]}, Chinese {[b.where for b in got]}; first difference:\n"
        + next((f"{w.where}:\n{w.code}\n---\n{g.where}:\n{g.code}" for w, g in zip(want, got)
                if (w.code, w.marker) != (g.code, g.marker)), "(one page has more blocks)"))
    missing = untranslated(page_blocks(zh))
    assert not missing, "comments in the Chinese page's code blocks must be in Chinese:\n" + "\n".join(missing)


def test_extraction_markers_and_comments():
    text = ("Text.\n\n<!-- fragment -->\n```python\nf(x, *, y)  # a signature\n```\n\n```bash\n"
            "qkv train --text \"a # b\"   # a comment\n# alone\nmake\n```\n<!-- continues -->\n"
            "```python\ns = '# no comment'  # 注释\n# only a comment\nprint(s)\n```\n")
    found = blocks(text)
    assert [(b.line, b.info, b.marker) for b in found] == [(4, "python", "fragment"), (8, "bash", None),
                                                          (14, "python", "continues")]
    assert found[0].body == "f(x, *, y)  # a signature\n"
    assert split_comments("python", found[0].body) == ("f(x, *, y)", ["a signature"])
    assert found[1].code == 'qkv train --text "a # b"\nmake' and found[1].comments == ["a comment", "alone"]
    assert found[2].code == "s = '# no comment'\nprint(s)" and found[2].comments == ["注释", "only a comment"]
    assert untranslated(found) == ["<text>:4: # a signature", "<text>:8: # a comment", "<text>:8: # alone",
                                   "<text>:14: # only a comment"]


def test_a_failing_block_fails_naming_its_page_and_line(tmp_path, cache_env):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```python\nx = 1\n```\n\n<!-- continues -->\n```python\ny = x + 1\n"
                    "print(1 / (y - 2))\n```\n", encoding="utf-8")
    first, second = page_blocks(page)
    assert chain(page, second) == [first, second]
    done = run_blocks([first, second], tmp_path, cache_env)
    assert done.returncode == 1 and "ZeroDivisionError" in done.stderr
    assert f'File "{page}", line 10' in done.stderr and "print(1 / (y - 2))" in done.stderr  # the page's line
    alone = run_blocks([second], tmp_path, cache_env)  # without the block it continues, x is undefined
    assert alone.returncode == 1 and "NameError" in alone.stderr and f'File "{page}", line 9' in alone.stderr
