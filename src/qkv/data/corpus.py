"""Corpora: the embedded default corpus (the Python standard library's own source) and user text.

The default corpus is the ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` (test suites and
site-packages left out): about 11 M characters on every machine with Python. A deterministic split *by
file* holds out about 5 % of the files for validation, so no validation file is ever seen in training.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

VAL_FRACTION = 0.05
STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


@dataclass(frozen=True)
class Corpus:
    """Training and validation text, and where they came from."""

    train: str
    val: str
    source: str
    train_files: int = 1
    val_files: int = 1


# --- reading text ------------------------------------------------------------------------

def read_text(path: str | os.PathLike) -> str:
    """A UTF-8 text file's contents; ValueError for binary, non-UTF-8 or unreadable files."""
    p = Path(path)
    raw = p.read_bytes()
    if b"\x00" in raw[:1 << 20]:
        raise ValueError(f"{p} looks binary (it contains NUL bytes); --data takes UTF-8 text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p} is not UTF-8 text (invalid byte at offset {e.start}); --data takes UTF-8 text") from None


def _val_names(names: list[str], fraction: float) -> set[str]:
    """About ``fraction`` of the names (at least one), chosen by a hash of the name: deterministic
    on every machine and stable when unrelated files come and go."""
    n_val = min(len(names) - 1, max(1, round(fraction * len(names))))
    ranked = sorted(names, key=lambda s: hashlib.sha1(s.encode()).hexdigest())
    return set(ranked[:n_val])


def split_by_file(texts: dict[str, str], *, source: str, val_fraction: float = VAL_FRACTION) -> Corpus:
    """Hold out about ``val_fraction`` of the files; with one file, its last ``val_fraction``
    (cut at a line break) is the validation text instead."""
    texts = {k: v for k, v in texts.items() if v}
    if not texts:
        raise ValueError(f"{source} contains no text")
    if len(texts) == 1:
        (text,) = texts.values()
        cut = int(len(text) * (1 - val_fraction))
        line = text.rfind("\n", 0, cut)
        cut = line + 1 if line > len(text) // 2 else cut
        if cut <= 0 or cut >= len(text):
            raise ValueError(f"{source} is too short to split into training and validation text ({len(text)} characters)")
        return Corpus(train=text[:cut], val=text[cut:], source=source, train_files=1, val_files=1)
    val = _val_names(sorted(texts), val_fraction)
    names = sorted(texts)
    return Corpus(
        train="".join(texts[k] for k in names if k not in val),
        val="".join(texts[k] for k in names if k in val),
        source=source, train_files=len(texts) - len(val), val_files=len(val),
    )


def stdlib_files(root: str | os.PathLike | None = None) -> list[Path]:
    """The standard library's ``.py`` files, sorted, without test suites or installed packages."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in STDLIB_SKIP and not d.startswith("."))
        files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
    return files


@lru_cache(maxsize=1)
def default_corpus() -> Corpus:
    """The embedded corpus: the standard library's source, split by file (about 5 % held out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = {}
    for f in stdlib_files(root):
        try:
            texts[f.relative_to(root).as_posix()] = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a stray non-UTF-8 file does not stop the corpus
    return split_by_file(texts, source=f"Python {sysconfig.get_python_version()} standard library ({root})")


def load_corpus(path: str | os.PathLike | None = None) -> Corpus:
    """``None``: the default corpus. A file: its text. A directory: every UTF-8 text file below it
    (hidden and binary files skipped), split by file."""
    if path is None:
        return default_corpus()
    p = Path(path)
    if not p.exists():
        raise ValueError(f"--data {p}: no such file or directory")
    if p.is_file():
        text = read_text(p)
        if not text.strip():
            raise ValueError(f"--data {p} is empty")
        return split_by_file({p.name: text}, source=str(p))
    texts = {}
    for dirpath, dirnames, filenames in os.walk(p):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            f = Path(dirpath) / name
            if name.startswith(".") or not f.is_file():
                continue
            try:
                texts[f.relative_to(p).as_posix()] = read_text(f)
            except (ValueError, OSError):
                continue  # binary or unreadable: not part of a text corpus
    if not any(t.strip() for t in texts.values()):
        raise ValueError(f"--data {p} contains no UTF-8 text files")
    return split_by_file(texts, source=str(p))
