"""Parallel sentence pairs: English UI strings and their translations from gettext catalogs.

Every Linux system ships translated programs: compiled ``.mo`` catalogs under
``/usr/share/locale/<lang>/LC_MESSAGES/`` (and ``/usr/share/locale-langpack`` on Ubuntu). In
each, msgid is the English source and msgstr its translation — a parallel corpus of short
sentences, menu items and messages, the paper's task (section 6.1) at a size that trains on a CPU.

Rules, the same for every source of pairs:
  skipped    the header (msgid ""), plural forms (msgid_plural), empty translations,
             fuzzy and obsolete ``.po`` entries, pairs whose target equals the source.
  context    ``ctx\\x04text`` ids keep only the text after the separator: the source sentence
             is what a translator sees; the context only disambiguates it.
  merged     one source → one target across all catalogs: the most frequent translation,
             ties broken by sorted order, so every machine makes the same choice.
  split      about 2 % of the *sources* held out by a SHA-1 hash of the source string:
             no source is on both sides, and the split is the same on every machine.

On a Debian machine the zh_CN catalogs give tens of thousands of distinct pairs, short UI strings
(``qkv train --task translate`` prints how many it read, skipped and held out); identical pairs, plural
entries and headers are skipped on the way.

A ``.mo`` file is binary with offsets into itself, so its header and both offset tables are
checked against the file size before any string is read (GNU gettext manual, "The Format of
GNU MO Files"). A corrupt catalog in the system directory is skipped and counted; in a
directory the user names it is an error.
"""
from __future__ import annotations

import hashlib
import os
import re
import statistics
import struct
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

LOCALE_ROOTS = ("/usr/share/locale", "/usr/share/locale-langpack")
VAL_FRACTION = 0.02
LANG_ALIASES = {"zh": "zh_CN", "zh-CN": "zh_CN"}
MO_MAGIC = 0x950412DE
MO_HEADER = 28  # magic, revision, N, offset of ids, offset of strings, hash size, hash offset

Pair = tuple[str, str]
LocaleRoot = str | os.PathLike | Sequence[str | os.PathLike]  # one locale directory or several


class CatalogError(ValueError):
    """A ``.mo``/``.po`` catalog that cannot be read: truncated, corrupt, or not a catalog."""


@dataclass(frozen=True)
class PairCorpus:
    """Training and validation (source, target) pairs, and where they came from."""

    train: list[Pair]
    val: list[Pair]
    source: str  # a description: the directory or file read
    target_lang: str
    catalogs: int = 0  # catalog files read (0 for a pairs file)
    skipped_catalogs: int = 0  # corrupt system catalogs left out

    @property
    def pairs(self) -> int:
        return len(self.train) + len(self.val)

    def median_source_chars(self) -> float:
        return statistics.median(len(s) for s, _ in self.train + self.val)


# --- one catalog -----------------------------------------------------------------------------

def mo_entries(data: bytes, *, name: str) -> list[tuple[bytes, bytes]]:
    """The raw (msgid, msgstr) byte strings of a ``.mo`` file, after checking every offset."""
    if len(data) < MO_HEADER:
        raise CatalogError(f"{name}: truncated .mo catalog ({len(data)} bytes; the header alone is {MO_HEADER})")
    order = next((o for o in "<>" if struct.unpack_from(o + "I", data)[0] == MO_MAGIC), None)
    if order is None:
        magic = struct.unpack_from("<I", data)[0]
        raise CatalogError(f"{name}: not a .mo catalog (magic number 0x{magic:08x}, expected 0x{MO_MAGIC:08x})")
    _, revision, n, ids_at, strs_at = struct.unpack_from(order + "5I", data)
    if revision >> 16 > 1:
        raise CatalogError(f"{name}: unsupported .mo major revision {revision >> 16} (expected 0 or 1)")
    tables = []
    for what, start in (("msgid", ids_at), ("msgstr", strs_at)):
        if start + 8 * n > len(data):
            raise CatalogError(f"{name}: the {what} table ({n} entries at offset {start}) runs past "
                               f"the end of the file ({len(data)} bytes)")
        table = struct.unpack_from(f"{order}{2 * n}I", data, start)  # (length, offset) per entry
        ends = [length + offset for length, offset in zip(table[0::2], table[1::2])]
        if ends and max(ends) > len(data):
            i = max(range(n), key=ends.__getitem__)
            raise CatalogError(f"{name}: {what} {i} (offset {table[2 * i + 1]}, length {table[2 * i]}) "
                               f"runs past the end of the file ({len(data)} bytes)")
        tables.append([data[o:o + length] for length, o in zip(table[0::2], table[1::2])])
    return list(zip(*tables))


def read_mo(path: str | os.PathLike) -> list[Pair]:
    """A ``.mo`` catalog's (msgid, msgstr) entries, decoded with the charset its header names."""
    p = Path(path)
    entries = mo_entries(p.read_bytes(), name=str(p))
    header = next((s for i, s in entries if i == b""), b"")
    match = re.search(rb"charset=([\w.-]+)", header)
    charset = match.group(1).decode("ascii") if match else "utf-8"
    if charset.upper() == "CHARSET":  # xgettext's placeholder, left in ASCII-only catalogs
        charset = "utf-8"
    try:
        return [(i.decode(charset), s.decode(charset)) for i, s in entries]
    except (LookupError, UnicodeDecodeError) as e:
        raise CatalogError(f"{p}: cannot decode the catalog as {charset} ({e})") from None


def read_po(path: str | os.PathLike) -> list[Pair]:
    """A ``.po`` catalog's translated entries, written as a ``.mo`` would hold them
    (``ctx\\x04id``, ``id\\0plural``); fuzzy and obsolete entries left out."""
    import polib  # the `translate` extra

    p = Path(path)
    if b"\x00" in p.read_bytes():
        raise CatalogError(f"{p} looks binary (it contains NUL bytes); expected a .po text catalog")
    try:
        po = polib.pofile(str(p))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CatalogError(f"{p}: not a readable .po catalog ({e})") from None
    return [((f"{e.msgctxt}\x04" if e.msgctxt is not None else "") + e.msgid
             + (f"\x00{e.msgid_plural}" if e.msgid_plural else ""), e.msgstr)
            for e in po if not e.obsolete and not e.fuzzy]


def read_catalog(path: str | os.PathLike) -> list[Pair]:
    """The (msgid, msgstr) entries of one ``.mo`` or ``.po`` file."""
    return read_po(path) if Path(path).suffix == ".po" else read_mo(path)


def entry_pair(msgid: str, msgstr: str) -> Pair | None:
    """The (source, target) pair of one catalog entry, or None for entries that are not one."""
    if not msgid or not msgstr or "\x00" in msgid:  # header, untranslated, plural forms
        return None
    return msgid.rpartition("\x04")[2], msgstr  # context dropped


# --- many catalogs -> one corpus ---------------------------------------------------------------

def merge_pairs(pairs: Iterable[Pair]) -> list[Pair]:
    """One target per source (the most frequent; ties by sorted order), identical pairs dropped,
    sorted by source."""
    targets: dict[str, Counter] = defaultdict(Counter)
    for src, tgt in pairs:
        if src != tgt:
            targets[src][tgt] += 1
    return [(src, min(c, key=lambda t: (-c[t], t))) for src, c in sorted(targets.items())]


def val_score(source: str) -> float:
    """A number in [0, 1) fixed by the source string alone (SHA-1, the same on every machine)."""
    return int.from_bytes(hashlib.sha1(source.encode("utf-8")).digest()[:8], "big") / 2.0**64


def split_pairs(pairs: list[Pair], *, val_fraction: float = VAL_FRACTION) -> tuple[list[Pair], list[Pair]]:
    """(train, val): sources whose ``val_score`` is below ``val_fraction`` (at least one) held out."""
    if len(pairs) < 2:
        raise ValueError(f"need at least 2 distinct translated pairs to split, got {len(pairs)}")
    val = {s for s, _ in pairs if val_score(s) < val_fraction}
    val = val or {min((s for s, _ in pairs), key=val_score)}
    return [p for p in pairs if p[0] not in val], [p for p in pairs if p[0] in val]


def catalog_corpus(files: Sequence[Path], *, source: str, target_lang: str, strict: bool) -> PairCorpus:
    """The corpus of many catalogs; a corrupt one is an error (``strict``) or skipped and counted."""
    entries, skipped = [], 0
    for f in files:
        try:
            entries += read_catalog(f)
        except CatalogError:
            if strict:
                raise
            skipped += 1
    pairs = merge_pairs(p for p in (entry_pair(i, s) for i, s in entries) if p)
    if not pairs:
        raise ValueError(f"{source}: no translated pairs in {len(files) - skipped} catalog(s)")
    train, val = split_pairs(pairs)
    return PairCorpus(train, val, source=source, target_lang=target_lang,
                      catalogs=len(files) - skipped, skipped_catalogs=skipped)


# --- the system's catalogs ------------------------------------------------------------------------

def as_roots(locale_root: LocaleRoot) -> list[Path]:
    """One locale directory or several, as paths."""
    if isinstance(locale_root, (str, os.PathLike)):
        return [Path(locale_root)]
    return [Path(r) for r in locale_root]


def languages(locale_root: LocaleRoot = LOCALE_ROOTS) -> list[str]:
    """The languages (locale directory names) with at least one ``.mo`` catalog, sorted."""
    return sorted({d.name for root in as_roots(locale_root) if root.is_dir() for d in root.iterdir()
                   if any((d / "LC_MESSAGES").glob("*.mo"))})


def system_catalogs(target_lang: str, locale_root: LocaleRoot = LOCALE_ROOTS) -> list[Path]:
    """The ``.mo`` files for ``target_lang`` under the locale root(s); ValueError listing the
    languages that exist when there are none."""
    lang = LANG_ALIASES.get(target_lang, target_lang)
    files = [] if "/" in lang or lang in ("", ".", "..") else sorted(
        f for root in as_roots(locale_root) for f in (root / lang / "LC_MESSAGES").glob("*.mo"))
    if not files:
        roots = ", ".join(str(r) for r in as_roots(locale_root))
        raise ValueError(f"no gettext catalogs for target language {target_lang!r} under {roots}; "
                         f"languages with catalogs: {', '.join(languages(locale_root)) or 'none'}")
    return files


# --- a pairs file -------------------------------------------------------------------------------

def read_pairs_file(path: str | os.PathLike) -> list[Pair]:
    """``source<TAB>target`` UTF-8 lines (blank lines skipped); ValueError naming the bad line."""
    p = Path(path)
    raw = p.read_bytes()
    if not raw.strip():
        raise ValueError(f"--pairs {p} is empty; expected source<TAB>target lines")
    if b"\x00" in raw:
        raise ValueError(f"--pairs {p} looks binary (it contains NUL bytes); expected UTF-8 text")
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(f"--pairs {p} is not UTF-8 text (invalid byte on line {line})") from None
    pairs = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise ValueError(f"--pairs {p} line {number}: expected source<TAB>target (one tab, "
                             f"two non-empty fields), got {len(fields) - 1} tab(s): {line[:60]!r}")
        pairs.append((fields[0], fields[1]))
    return pairs


# --- the entry point ---------------------------------------------------------------------------

def load_pairs(pairs: str | os.PathLike | None = None, *, target_lang: str = "zh_CN",
               locale_root: LocaleRoot = LOCALE_ROOTS) -> PairCorpus:
    """Translation pairs, split about 98/2 by a hash of the source.

    Args:
        pairs: None for the system's catalogs of ``target_lang``; a file of ``source<TAB>target``
            lines; or a directory of ``.po``/``.mo`` catalogs (searched recursively).
        target_lang: the locale directory to read (``zh`` means ``zh_CN``); for a file or a
            directory, recorded so that metrics tokenize the target the right way.
        locale_root: the system locale directory, or several.
    """
    lang = LANG_ALIASES.get(target_lang, target_lang)
    if pairs is None:
        files = system_catalogs(lang, locale_root)
        where = ", ".join(sorted({str(f.parent.parent) for f in files}))
        return catalog_corpus(files, source=f"gettext catalogs in {where}", target_lang=lang, strict=False)
    p = Path(pairs)
    if not p.exists():
        raise ValueError(f"--pairs {p}: no such file or directory")
    if p.is_file():
        train, val = split_pairs(merge_pairs(read_pairs_file(p)))
        return PairCorpus(train, val, source=str(p), target_lang=lang)
    files = sorted(f for f in p.rglob("*") if f.suffix in (".po", ".mo") and f.is_file())
    if not files:
        raise ValueError(f"--pairs {p}: the directory holds no .po or .mo catalogs")
    return catalog_corpus(files, source=str(p), target_lang=lang, strict=True)
