"""What a study writes, in each language (``qkv study … --lang en|zh``), and its results as a page of the
documentation site (``qkv study pe --markdown docs``).

Every sentence a study prints or writes is a template in one table, ``TEXT``, keyed by language and read
from a catalog per language (``text/en.json``, ``text/zh.json``; a study's own keys begin with its name:
``kv.``, ``ctx.``, ``moe.``); ``say(key, lang, **values)`` fills one, the numbers formatted the same in every language. A run
writes its results in its language — ``results.md`` (English) or ``results.zh.md`` — and
``summary.json`` holds every value they show, so ``qkv study NAME --from-results DIR --lang zh``
writes them again in another language without training (``pe.rerender``, ``order.rerender``).

``write_page`` copies the results file, headings moved under the page's own, to
``DIR/generated/study-NAME.md`` (English, which ``docs/studies.md`` includes) or
``study-NAME.zh.md`` (Chinese, for ``docs/studies.zh.md``), and its figures beside the pages, under a
line that says which command produced them. No number is typed into the site by hand.
"""
from __future__ import annotations

import csv
import datetime
import io
import json
import math
import re
import shutil
from pathlib import Path

from ..fileio import atomic_json, atomic_text
from ..runtime import machine, source_commit
from ..viz.text import language

RESULTS = {"en": "results.md", "zh": "results.zh.md"}  # the results file of each language
TEXT: dict[str, dict[str, str]] = {  # language -> key -> template, from text/LANG.json
    lang: json.loads((Path(__file__).parent / "text" / f"{lang}.json").read_text(encoding="utf-8"))
    for lang in RESULTS}
# Words inside the descriptions of the corpus and the machine, which qkv.data and qkv.runtime write in English.
LOCAL = {"zh": {"standard library": "标准库", "logical cores": "个逻辑核心", "torch threads": "个 torch 线程"}}
STAMP = re.compile(r"Run on (\S+) at commit `([^`]*)`\.")  # TEXT["en"]["stamp"], read back from an older results.md


def say(key: str, lang: str, **values) -> str:
    """TEXT[lang][key] filled with ``values``."""
    return TEXT[language(lang)][key].format(**values)


def localized(text: str, lang: str) -> str:
    """A description written elsewhere in English (corpus, machine) with LOCAL's words in ``lang``."""
    for english, local in LOCAL.get(language(lang), {}).items():
        text = text.replace(english, local)
    return text


def run_stamp() -> dict[str, str]:
    """When and from which source a study ran: {date, commit}, kept in its summary.json."""
    return {"date": datetime.date.today().isoformat(), "commit": source_commit()}


def recorded_run(folder: Path, summary: dict) -> dict[str, str]:
    """The {date, commit} a finished run recorded: summary.json's, else its results.md's last line."""
    if isinstance(summary.get("run"), dict):
        return summary["run"]
    path = Path(folder) / RESULTS["en"]
    found = STAMP.search(path.read_text(encoding="utf-8")) if path.is_file() else None
    return {"date": found[1], "commit": found[2]} if found else {"date": "?", "commit": "?"}


def finished_summary(folder: str | Path) -> dict:
    """A finished run's summary.json, with the {date, commit} it ran at as "run" (``recorded_run``);
    ValueError naming the folder when it is not a study's output."""
    path = Path(folder) / "summary.json"
    if not path.is_file():
        raise ValueError(f"--from-results {folder}: expected a study's output folder holding summary.json, "
                         "found none (run the study with --out DIR first)")
    summary = json.loads(path.read_text(encoding="utf-8"))  # n/a cells: NaN, read back as floats
    return summary | {"run": recorded_run(Path(folder), summary)}


def csv_bytes(rows: list[dict], columns: list[str]) -> bytes:
    """``rows``' ``columns`` as CSV: floats to 6 places, NaN as n/a."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow(["n/a" if isinstance(r[c], float) and math.isnan(r[c]) else
                    (f"{r[c]:.6f}" if isinstance(r[c], float) else r[c]) for c in columns])
    return buf.getvalue().encode()


def write_summary(out: Path, fields: dict, corpus_source: str, text_of, lang: str) -> dict:
    """A finished run's summary.json (``fields`` with the machine, the corpus and the run's date and commit) and
    its results file of ``lang``, ``text_of(summary, lang)``; the summary."""
    summary = fields | {"machine": machine(), "corpus": corpus_source, "run": run_stamp()}
    atomic_json(Path(out) / "summary.json", summary)
    write_results(out, text_of(summary, lang), lang)
    return summary


def write_results(folder: str | Path, text: str, lang: str) -> Path:
    """Write a study's results ``text`` to ``folder``'s results file of ``lang`` (RESULTS)."""
    path = Path(folder) / RESULTS[language(lang)]
    atomic_text(path, text)
    return path


def page_path(docs: Path, name: str, lang: str) -> Path:
    """docs/generated/study-NAME.md (English) or study-NAME.zh.md (Chinese)."""
    return Path(docs) / "generated" / f"study-{name}{'' if language(lang) == 'en' else '.' + lang}.md"


def write_page(results: Path, name: str, docs: str | Path, command: str, figures: tuple[str, ...] = (), *,
               lang: str = "en") -> list[Path]:
    """Copy ``results``' results file of ``lang`` (RESULTS) to ``page_path(docs, name, lang)``, its
    summary.json to ``docs/generated/study-{name}.json`` (what ``qkv verify`` reads in a checkout where the
    study has not run) and each figure to ``docs/study-{name}.{ext}``; return the paths written."""
    results, docs = Path(results), Path(docs)
    if not docs.is_dir():
        raise ValueError(f"--markdown {docs}: expected the documentation folder (e.g. docs), found no such directory")
    source = results / RESULTS[language(lang)]
    if not source.is_file():
        raise ValueError(f"{results}: expected {source.name}, found none (write it with --from-results "
                         f"{results} --lang {lang})")
    text = source.read_text(encoding="utf-8")
    body = "\n".join("##" + line if line.startswith("#") else line for line in text.splitlines())
    page = page_path(docs, name, lang)
    page.parent.mkdir(exist_ok=True)
    atomic_text(page, say("generated", lang, command=command, file=source.name) + f"\n\n{body.strip()}\n")
    written = [page]
    if (results / "summary.json").is_file():
        summary = page.parent / f"study-{name}.json"
        atomic_text(summary, (results / "summary.json").read_text(encoding="utf-8"))
        written.append(summary)
    for figure in figures:
        target = docs / f"study-{name}{Path(figure).suffix}"
        shutil.copyfile(results / figure, target)
        written.append(target)
    return written
