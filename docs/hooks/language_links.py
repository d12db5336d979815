"""mkdocs hook: a page's link to its own translation is dropped from the site.

On GitHub, ``docs/NAME.md`` starts with ``[中文](NAME.zh.md)`` and ``docs/NAME.zh.md`` with
``[English](NAME.md)``, so a reader can switch. On the site the header's language switcher does that,
and each language is built without the other's files, so such a link would be broken there. Only a
paragraph that is nothing but one link to the page's twin goes; every other link is checked as usual.
"""
from __future__ import annotations

import os
import posixpath
import re

LINK_LINE = re.compile(r"^\[[^\]]+\]\((?P<target>[^)\s#]+)\)[ \t]*$\n?", re.MULTILINE)  # a line that is one link


def twin(path: str) -> str:
    """The other language's file of a page: ``a/b.md`` <-> ``a/b.zh.md``."""
    if path.endswith(".zh.md"):
        return path[: -len(".zh.md")] + ".md"
    return path[: -len(".md")] + ".zh.md"


def on_page_markdown(markdown: str, page, config, files) -> str:
    path = os.path.relpath(page.file.abs_src_path, config.docs_dir).replace(os.sep, "/")  # as written: NAME.zh.md
    if not path.endswith(".md"):
        return markdown
    here = posixpath.dirname(path)

    def drop(match: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(here, match["target"]))
        return "" if target == twin(path) else match[0]

    return LINK_LINE.sub(drop, markdown)
