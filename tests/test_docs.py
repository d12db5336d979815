"""The documentation site (mkdocs.yml): it builds with ``--strict`` (no warning: no broken link or anchor,
no nav entry without its page, no docstring mkdocstrings cannot read), every page exists in English and
Chinese, and nothing in the READMEs or docs/ links outside the repository.

Select with ``pytest -k docs``. The build executes the chapter notebooks into this session's directory
(docs/hooks/execute_notebooks.py), where tests/test_notebooks.py finds them: each is executed once.
Building needs the ``docs`` extra (in ``dev``): pip install -e '.[docs]'.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NOTEBOOKS = DOCS / "notebooks"  # in Chinese, shown under both languages; their README is the section's page
HOOKS = DOCS / "hooks"
GENERATED = DOCS / "generated"  # a study's results.md, included by its page (qkv study ... --markdown docs)
READMES = [ROOT / "README.md", ROOT / "README.zh-CN.md"]

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"""\]\(\s*<?([^)\s>]+)>?(?:\s+["'][^)]*)?\)"""  # [text](target "title")
                  r"""|^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)"""      # [label]: target
                  r"""|\b(?:src|href)\s*=\s*["']([^"']+)["']""",    # <img src="…">, <a href="…">
                  re.MULTILINE)
pytestmark = pytest.mark.timeout(900)  # the first test to use the site pays for executing the notebooks

EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|#|//)")  # https:, mailto:, an anchor on the same page


def pages() -> list[Path]:
    """The site's Markdown pages, English and Chinese (not the notebooks' folder, the hooks, the included results)."""
    return sorted(p for p in DOCS.rglob("*.md") if not any(p.is_relative_to(d) for d in (NOTEBOOKS, HOOKS, GENERATED)))


def english(page: Path) -> Path:
    return page.with_name(page.name[: -len(".zh.md")] + ".md") if page.name.endswith(".zh.md") else page


def site_page(site: Path, page: Path, lang: str) -> Path:
    """Where a docs/ page (.md or .ipynb) lands in the built site: NAME/index.html, zh/NAME/index.html."""
    rel = english(page).relative_to(DOCS).with_suffix("")
    rel = rel.parent if rel.name in ("index", "README") else rel
    return (site / "zh" if lang == "zh" else site) / rel / "index.html"


def test_every_page_has_its_twin():
    missing = []
    for page in pages():
        en = english(page)
        twin = en.with_name(en.stem + ".zh.md") if page == en else en
        if not twin.exists():
            missing.append(f"{page.relative_to(ROOT)} has no {twin.relative_to(ROOT)}")
    assert not missing, "every page needs its translation:\n" + "\n".join(missing)


def links(path: Path) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    return [next(g for g in m.groups() if g) for m in LINK.finditer(text)]


def test_no_link_leaves_the_repository():
    """A relative link must resolve inside the repository (on GitHub and in the site alike); the READMEs'
    links, which no build checks, must also name a file that exists."""
    bad = []
    for path in READMES + pages() + sorted(NOTEBOOKS.glob("*.md")):
        if not path.exists():
            continue
        for target in links(path):
            if EXTERNAL.match(target):
                continue
            file = target.split("#")[0].split("?")[0]
            resolved = (ROOT if file.startswith("/") else path.parent).joinpath(file.lstrip("/")).resolve()
            if not resolved.is_relative_to(ROOT):
                bad.append(f"{path.relative_to(ROOT)}: {target} is outside the repository")
            elif path in READMES and not resolved.exists():
                bad.append(f"{path.relative_to(ROOT)}: {target} does not exist")
    assert not bad, "\n".join(bad)


def test_link_extraction(tmp_path):
    path = tmp_path / "probe.md"
    path.write_text('[a](../x.md) [b](y.md#z "title") <img src="p.png"> `[c](../code.md)`\n'
                    '[r]: ../ref.md\n```\n[d](../fenced.md)\n```\n', encoding="utf-8")
    assert links(path) == ["../x.md", "y.md#z", "p.png", "../ref.md"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built with --strict into a temporary directory; the notebooks executed into the session's."""
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    sys.path.insert(0, str(HOOKS))
    try:
        from execute_notebooks import SESSION_DIR
    finally:
        sys.path.remove(str(HOOKS))
    out = tmp_path_factory.mktemp("site")
    shared = tmp_path_factory.getbasetemp() / SESSION_DIR
    notebooks = "none" if os.environ.get("QKV_DOCS_NOTEBOOKS") == "none" else str(shared)  # none: a quick look
    env = os.environ | {"QKV_DOCS_NOTEBOOKS": notebooks, "QKV_DOCS_CACHE": str(out.parent / "mkdocs-jupyter"),
                        "NO_MKDOCS_2_WARNING": "1"}
    start = time.perf_counter()
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    print(f"mkdocs build --strict: {time.perf_counter() - start:.1f} s")
    problems = [line for line in build.stderr.splitlines() if not line.startswith(("INFO", "DEBUG"))]
    assert build.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(problems[-60:])
    return out


def test_site_builds_in_both_languages(site):
    assert (site / "index.html").exists() and (site / "zh" / "index.html").exists()
    missing = [f"{lang}: {page.relative_to(DOCS)} -> {site_page(site, page, lang).relative_to(site)}"
               for page in pages() + sorted(NOTEBOOKS.glob("*.ipynb")) + [NOTEBOOKS / "README.md"]
               for lang in ("en", "zh") if not site_page(site, page, lang).exists()]
    assert not missing, "pages missing from the built site:\n" + "\n".join(missing)


def test_site_languages_differ(site):
    """The Chinese build serves the .zh.md pages under translated nav titles, and the switcher links both."""
    en, zh = (site / "index.html").read_text(encoding="utf-8"), (site / "zh" / "index.html").read_text(encoding="utf-8")
    assert '<html lang="en"' in en and '<html lang="zh"' in zh
    assert "Getting started" in en and "快速上手" in zh and "快速上手" not in en
    assert 'hreflang="zh"' in en and 'hreflang="en"' in zh


def test_site_notebooks_have_outputs(site):
    """The notebooks' pages show what executing them printed (the committed notebooks hold no outputs)."""
    if os.environ.get("QKV_DOCS_NOTEBOOKS") == "none":
        pytest.skip("QKV_DOCS_NOTEBOOKS=none: notebooks rendered without executing")
    bare = [nb.name for nb in sorted(NOTEBOOKS.glob("*.ipynb"))
            if "jp-OutputArea-output" not in site_page(site, nb, "zh").read_text(encoding="utf-8")]
    assert not bare, f"rendered without outputs: {bare}"


def test_site_reference_is_generated(site):
    page = (site / "reference" / "modules" / "index.html").read_text(encoding="utf-8")
    assert 'id="qkv.MultiHeadAttention"' in page  # mkdocstrings rendered the docstring, not the ::: line
    assert ":::" not in page
