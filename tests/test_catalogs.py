import struct
from pathlib import Path

import pytest

from qkv.data.catalogs import (
    CatalogError, entry_pair, languages, load_pairs, merge_pairs, read_catalog, read_mo, split_pairs, val_score,
)

HEADER = ("", "Content-Type: text/plain; charset=UTF-8\n")
A = [HEADER, ("Open", "打开"), ("Save", "保存"), ("Quit", "Quit"), ("File\x00Files", "文件\x00文件"),
     ("Untranslated", ""), ("menu\x04Close", "关闭")]
B = [HEADER, ("Open", "开启"), ("Save", "存储"), ("Help", "帮助")]
C = [HEADER, ("Open", "打开")]


def mo_bytes(entries, order="<") -> bytes:
    """A GNU .mo file (gettext manual, 'The Format of GNU MO Files'): header, id table, string table, strings."""
    entries = sorted((i.encode(), s.encode()) for i, s in entries)
    n, table, blob = len(entries), [], b""
    for text in [i for i, _ in entries] + [s for _, s in entries]:
        table += [len(text), 28 + 16 * n + len(blob)]
        blob += text + b"\x00"
    return struct.pack(f"{order}7I", 0x950412DE, 0, n, 28, 28 + 8 * n, 0, 0) + struct.pack(f"{order}{4 * n}I", *table) + blob


def locale(root: Path, lang: str, catalogs: dict) -> Path:
    d = root / lang / "LC_MESSAGES"
    d.mkdir(parents=True, exist_ok=True)
    for name, entries in catalogs.items():
        (d / name).write_bytes(entries if isinstance(entries, bytes) else mo_bytes(entries))
    return root


@pytest.fixture
def root(tmp_path):
    r = locale(tmp_path / "locale", "zh_CN", {"a.mo": A, "b.mo": B, "c.mo": C})
    locale(r, "de", {"a.mo": [HEADER, ("Open", "Öffnen")]})
    (r / "xx" / "LC_MESSAGES").mkdir(parents=True)  # a directory without catalogs is no language
    return r


# --- reading one catalog ----------------------------------------------------------------------

@pytest.mark.parametrize("order", ["<", ">"])
def test_read_mo_either_byte_order(tmp_path, order):
    (tmp_path / "a.mo").write_bytes(mo_bytes(A, order))
    assert sorted(read_mo(tmp_path / "a.mo")) == sorted(A)


def test_entry_rules_skip_header_plural_empty_and_drop_context():
    assert [entry_pair(i, s) for i, s in A] == [
        None, ("Open", "打开"), ("Save", "保存"), ("Quit", "Quit"), None, None, ("Close", "关闭")]


def test_po_and_mo_written_by_polib_read_alike(tmp_path):
    polib = pytest.importorskip("polib", reason="the translate extra: pip install -e '.[translate]'")
    po = polib.POFile()
    po.metadata = {"Content-Type": "text/plain; charset=UTF-8"}
    po.append(polib.POEntry(msgid="Open", msgstr="打开"))
    po.append(polib.POEntry(msgid="Close", msgctxt="menu", msgstr="关闭"))
    po.append(polib.POEntry(msgid="File", msgid_plural="Files", msgstr_plural={0: "文件"}))
    po.append(polib.POEntry(msgid="Old", msgstr="旧", flags=["fuzzy"]))
    po.save(str(tmp_path / "x.po"))
    po.save_as_mofile(str(tmp_path / "x.mo"))
    pairs = {f: sorted(filter(None, (entry_pair(i, s) for i, s in read_catalog(tmp_path / f)))) for f in ("x.po", "x.mo")}
    assert pairs["x.po"] == [("Close", "关闭"), ("Open", "打开")]
    assert pairs["x.mo"] == pairs["x.po"]  # msgfmt-style writers leave fuzzy entries out too


# --- merging and splitting --------------------------------------------------------------------

def test_system_catalogs_merge_duplicates_and_skip_what_is_not_a_pair(root):
    c = load_pairs(locale_root=root)
    pairs = dict(c.train + c.val)
    # Open: 打开 twice, 开启 once -> the most frequent; Save: a tie -> sorted order (保 U+4FDD < 存 U+5B58)
    assert pairs == {"Open": "打开", "Save": "保存", "Help": "帮助", "Close": "关闭"}
    assert (c.pairs, c.catalogs, c.skipped_catalogs, c.target_lang) == (4, 3, 0, "zh_CN")
    assert load_pairs(target_lang="zh", locale_root=root) == c


def test_merge_pairs_drops_identical_and_sorts_by_source():
    assert merge_pairs([("b", "y"), ("a", "a"), ("b", "x"), ("b", "y")]) == [("b", "y")]


def test_split_is_about_two_percent_by_source_hash_and_stable(tmp_path):
    pairs = [(f"source {i}", f"目标 {i}") for i in range(3000)]
    train, val = split_pairs(pairs)
    assert 0.01 < len(val) / len(pairs) < 0.03 and len(train) + len(val) == len(pairs)
    assert not {s for s, _ in train} & {s for s, _ in val}
    assert split_pairs(pairs[:1500])[1] == [p for p in val if p in pairs[:1500]]  # one source's side never depends on others
    # pinned: the first 8 bytes of sha1(b"Open") (cf9b7706...) as a big-endian fraction of 2**64
    assert val_score("Open") == 0xCF9B77061F7B3126 / 2**64


def test_split_holds_out_at_least_one_and_needs_two():
    train, val = split_pairs([("a", "x"), ("b", "y")])
    assert len(train) == len(val) == 1
    with pytest.raises(ValueError, match="at least 2 distinct translated pairs to split, got 1"):
        split_pairs([("a", "x")])


# --- languages and locale roots ---------------------------------------------------------------

def test_other_languages_and_several_roots(root, tmp_path):
    assert languages(root) == ["de", "zh_CN"]
    de = load_pairs(target_lang="de", locale_root=[root, locale(tmp_path / "langpack", "de", {"b.mo": [("Save", "Speichern")]})])
    assert dict(de.train + de.val) == {"Open": "Öffnen", "Save": "Speichern"} and de.catalogs == 2


def test_unknown_language_lists_those_that_exist(root):
    with pytest.raises(ValueError, match=r"'fr'.*languages with catalogs: de, zh_CN$"):
        load_pairs(target_lang="fr", locale_root=root)
    with pytest.raises(ValueError, match="languages with catalogs: de, zh_CN"):
        load_pairs(target_lang="../locale/zh_CN", locale_root=root)  # a path is no language


# --- corrupt catalogs -------------------------------------------------------------------------

GOOD = mo_bytes(A)


def patched(at: int, value: int) -> bytes:
    data = bytearray(GOOD)
    struct.pack_into("<I", data, at, value)
    return bytes(data)


@pytest.mark.parametrize("data, message", [
    (b"", r"truncated \.mo catalog \(0 bytes"),
    (GOOD[:20], r"truncated \.mo catalog \(20 bytes"),
    (b"#, fuzzy\nmsgid \"\"\nmsgstr \"\"\n", r"not a \.mo catalog \(magic number 0x66202c23, expected 0x950412de\)"),
    (patched(8, 10**6), r"msgid table \(1000000 entries at offset 28\) runs past the end of the file"),
    (patched(28 + 4, 10**6), r"msgid 0 \(offset 1000000, length 0\) runs past the end of the file"),
    (GOOD[:-5], r"msgstr \d \(offset \d+, length \d+\) runs past the end of the file"),
    (patched(4, 2 << 16), "unsupported .mo major revision 2"),
])
def test_corrupt_mo_in_a_user_directory_is_an_error_naming_the_file(tmp_path, data, message):
    (tmp_path / "good.mo").write_bytes(GOOD)
    (tmp_path / "bad.mo").write_bytes(data)
    with pytest.raises(CatalogError, match=message) as e:
        load_pairs(tmp_path)
    assert "bad.mo" in str(e.value)


def test_corrupt_system_catalog_is_skipped_and_counted(root):
    locale(root, "zh_CN", {"z.mo": GOOD[:-5], "y.mo": b"junk" * 10})
    c = load_pairs(locale_root=root)
    assert (c.catalogs, c.skipped_catalogs, c.pairs) == (3, 2, 4)


def test_catalog_in_a_wrong_charset_is_an_error(tmp_path):
    (tmp_path / "a.mo").write_bytes(mo_bytes([HEADER, ("Open", "打开")]).replace(b"UTF-8", b"ascii"))
    with pytest.raises(CatalogError, match=r"a\.mo: cannot decode the catalog as ascii"):
        read_mo(tmp_path / "a.mo")


def test_user_directory_of_po_and_mo(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.mo").write_bytes(GOOD)
    (tmp_path / "b.po").write_text('msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                                   'msgid "Help"\nmsgstr "帮助"\n', encoding="utf-8")
    c = load_pairs(tmp_path)
    assert dict(c.train + c.val) == {"Open": "打开", "Save": "保存", "Close": "关闭", "Help": "帮助"}
    assert (c.catalogs, c.source) == (2, str(tmp_path))
    (tmp_path / "c.po").write_text('msgid "x"\nmsgstr\n', encoding="utf-8")
    with pytest.raises(CatalogError, match=r"c\.po: not a readable \.po catalog"):
        load_pairs(tmp_path)


def test_directory_without_catalogs_and_missing_path(tmp_path):
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no .po or .mo catalogs"):
        load_pairs(tmp_path)
    with pytest.raises(ValueError, match="no such file or directory"):
        load_pairs(tmp_path / "missing.tsv")


# --- a pairs file -----------------------------------------------------------------------------

def test_pairs_file(tmp_path):
    f = tmp_path / "pairs.tsv"
    f.write_text("\ufeffOpen\t打开\r\n\n  \nSave\t保存\nOpen\t开启\nOpen\t打开\nSame\tSame\n", encoding="utf-8")
    c = load_pairs(f, target_lang="zh")
    assert sorted(c.train + c.val) == [("Open", "打开"), ("Save", "保存")]
    assert (c.catalogs, c.source, c.target_lang) == (0, str(f), "zh_CN")


@pytest.mark.parametrize("data, message", [
    (b"", "is empty"),
    (b"\n \n", "is empty"),
    (b"Open\t\x00\x01\n", r"looks binary \(it contains NUL bytes\)"),
    (b"Open\t\xe6\x89\n", r"is not UTF-8 text \(invalid byte on line 1\)"),
    ("Open\t打开\n\nSave 保存\n".encode(), r"line 3: expected source<TAB>target .* got 0 tab\(s\): 'Save 保存'"),
    (b"a\tb\tc\n", r"line 1: .* got 2 tab\(s\)"),
    (b"a\t \n", r"line 1: expected source<TAB>target \(one tab, two non-empty fields\)"),
    (b"a\tb\n", "need at least 2 distinct translated pairs"),
])
def test_bad_pairs_file(tmp_path, data, message):
    (tmp_path / "p.tsv").write_bytes(data)
    with pytest.raises(ValueError, match=message):
        load_pairs(tmp_path / "p.tsv")


# --- the real system catalogs -------------------------------------------------------------------

ZH = Path("/usr/share/locale/zh_CN/LC_MESSAGES")


@pytest.mark.skipif(not any(ZH.glob("*.mo")), reason=f"no zh_CN .mo catalogs in {ZH} on this machine (the installed "
                    "programs' translations put them there); the reader is tested above on catalogs the tests write")
def test_system_zh_cn_catalogs():
    c = load_pairs(target_lang="zh")
    assert c.pairs > 2000 and c.catalogs >= 1 and 0.01 < len(c.val) / c.pairs < 0.03
    assert not {s for s, _ in c.train} & {s for s, _ in c.val}
    assert all(s != t and "\x04" not in s and "\x00" not in s for s, t in c.train[:5000])
