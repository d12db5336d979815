"""mkdocs hook: the chapter notebooks shown with their outputs.

docs/notebooks/*.ipynb are committed without outputs. Before mkdocs-jupyter renders one, this hook
points the page at an executed copy (execute_notebooks.py), so docs/ itself is never written:

- ``QKV_DOCS_NOTEBOOKS`` unset: each notebook is executed once per build process, into a temporary
  directory (both languages' builds, and ``mkdocs serve``'s rebuilds while its text is unchanged, reuse it).
- ``QKV_DOCS_NOTEBOOKS=DIR``: ``DIR/NAME.ipynb`` is used where it exists, and written there otherwise.
  tests/test_docs.py points this at its session's directory, where tests/test_notebooks.py finds them.
- ``QKV_DOCS_NOTEBOOKS=none``: rendered as committed, without outputs (a quick look at the pages).

mkdocs-static-i18n rebuilds every file as a plain mkdocs File, which takes a notebook for an asset
(copied as is, and not under zh/): its issue #198. Counting .ipynb among mkdocs' page extensions lets
it place a notebook as a page in each language, and mkdocs-jupyter renders it there.
"""
from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from mkdocs import utils
from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority

from execute_notebooks import execute  # beside this file; mkdocs puts a hook's folder on the path

if ".ipynb" not in utils.markdown_extensions:  # a page, for the i18n plugin too (see above)
    utils.markdown_extensions = (*utils.markdown_extensions, ".ipynb")

log = logging.getLogger("mkdocs.hooks.notebooks")
executed: dict[str, Path] = {}  # digest of a notebook's text -> its executed copy, for this process


def temporary_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="qkv-docs-notebooks-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def executed_copy(source: Path) -> Path | None:
    setting = os.environ.get("QKV_DOCS_NOTEBOOKS", "")
    if setting == "none":
        return None
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    if digest not in executed:
        try:
            executed[digest], seconds = execute(source, Path(setting) if setting else temporary_dir())
        except Exception as error:  # a notebook that fails is not published
            raise PluginError(f"docs/notebooks/{source.name} failed to execute: {error}") from error
        if seconds:
            log.info("executed %s in %.1f s", source.name, seconds)
    return executed[digest]


@event_priority(100)  # before mkdocs-jupyter reads the file
def on_pre_page(page, config, files):
    source = Path(page.file.abs_src_path)
    if source.suffix == ".ipynb" and source.is_relative_to(config.docs_dir):
        copy = executed_copy(source)
        if copy is not None:
            page.file.abs_src_path = str(copy)
    return page
