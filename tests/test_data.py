import sysconfig
from pathlib import Path

import pytest
import torch

from qkv import data
from qkv.data import BPETokenizer, CharTokenizer, load_corpus, load_tokenizer, split_by_file

CODE = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int = 0  # héllo → ok\n" * 20


# --- corpora -------------------------------------------------------------------------------

def test_stdlib_files_leave_out_tests_and_installed_packages():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = data.stdlib_files(root)
    assert len(files) > 300 and all(f.suffix == ".py" for f in files)
    rel = [f.relative_to(root).parts for f in files]
    assert not any(set(parts) & {"test", "tests", "idle_test", "site-packages"} for parts in rel)
    assert ("os.py",) in rel and files == data.stdlib_files(root)


def test_default_corpus_split_by_file_is_deterministic_and_about_five_percent():
    c = data.default_corpus()
    assert len(c.train) > 5_000_000  # "about 11 M characters"
    assert 0.02 < c.val_files / (c.train_files + c.val_files) < 0.08
    assert 0.02 < len(c.val) / (len(c.train) + len(c.val)) < 0.12
    data.default_corpus.cache_clear()
    assert data.default_corpus() == c  # same files on every call (and machine: a hash of the path)


def test_split_by_file_holds_out_whole_files():
    texts = {f"f{i}.py": f"# file {i}\n" + "x = 1\n" * i for i in range(1, 41)}
    c = split_by_file(texts, source="t")
    assert (c.train_files, c.val_files) == (38, 2)
    held = [t for t in texts.values() if t in c.val]
    assert len(held) == 2 and all(t not in c.train for t in held)
    assert split_by_file(dict(reversed(texts.items())), source="t") == c  # order does not matter


def test_split_of_two_files_keeps_one_for_training():
    c = split_by_file({"a": "aaa\n", "b": "bbb\n"}, source="t")
    assert (c.train_files, c.val_files) == (1, 1) and {c.train, c.val} == {"aaa\n", "bbb\n"}


def test_single_file_holds_out_its_tail_at_a_line_break(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text(CODE, encoding="utf-8")
    c = load_corpus(f)
    assert c.train + c.val == CODE and c.train.endswith("\n")
    assert 0.02 < len(c.val) / len(CODE) < 0.1


def test_directory_reads_text_files_and_skips_binary_and_hidden(tmp_path):
    for i in range(3):
        (tmp_path / f"m{i}.py").write_text(f"# module {i}\n" + CODE, encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "n.txt").write_text("nested text\n", encoding="utf-8")
    (tmp_path / "img.png").write_bytes(b"\x89PNG\x00\x01\x02")
    (tmp_path / ".hidden").write_text("secret\n")
    c = load_corpus(tmp_path)
    assert c.train_files + c.val_files == 4
    assert "PNG" not in c.train + c.val and "secret" not in c.train + c.val
    assert "nested text" in c.train + c.val


@pytest.mark.parametrize("content, message", [
    (None, "no such file"), (b"", "is empty"), (b"  \n", "is empty"),
    (b"abc\x00def", "binary"), (b"caf\xe9\n", "not UTF-8"),
])
def test_bad_data_files(tmp_path, content, message):
    f = tmp_path / "data.txt"
    if content is not None:
        f.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        load_corpus(f)


def test_directory_without_text(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\x00\x01")
    with pytest.raises(ValueError, match="no UTF-8 text files"):
        load_corpus(tmp_path)


# --- tokenizers ----------------------------------------------------------------------------

def test_char_tokenizer_round_trip_and_stable_ids():
    tok = CharTokenizer.train(CODE)
    assert tok.vocab_size == len(set(CODE))
    ids = tok.encode(CODE)
    assert tok.decode(ids) == CODE
    assert tok.encode_tensor(CODE).tolist() == ids
    assert tok.encode(" ") == [tok.chars.index(" ")] and tok.chars == sorted(tok.chars)
    assert tok.token_strings(tok.encode("→a")) == ["→", "a"]


def test_char_tokenizer_names_unknown_characters():
    tok = CharTokenizer.train("abc")
    with pytest.raises(ValueError, match=r"2 character\(s\) outside.*'Z', 'é'"):
        tok.encode("abZcé")
    with pytest.raises(ValueError, match="token ids"):
        tok.decode([0, 7])


def test_char_tokenizer_save_and_load(tmp_path):
    tok = CharTokenizer.train(CODE)
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert isinstance(again, CharTokenizer) and again.chars == tok.chars
    assert again.encode(CODE) == tok.encode(CODE)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_bpe_tokenizer_trains_round_trips_and_compresses(tmp_path):
    tok = BPETokenizer.train(CODE, vocab_size=300)
    assert 256 < tok.vocab_size <= 300
    ids = tok.encode(CODE)
    assert tok.decode(ids) == CODE and len(ids) < len(CODE) / 2  # merges pay off on repetitive code
    assert tok.decode(tok.encode("unseen ✓ text")) == "unseen ✓ text"  # byte-level: any text encodes
    assert "".join(tok.token_strings(tok.encode("return a"))) == "return a"
    torch.testing.assert_close(tok.encode_tensor(CODE[:500]), torch.tensor(tok.encode(CODE[:500])))
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert isinstance(again, BPETokenizer) and again.encode(CODE) == ids


def test_bpe_vocab_size_is_checked():
    with pytest.raises(ValueError, match="vocab_size"):
        BPETokenizer.train(CODE, vocab_size=100)
    with pytest.raises(ValueError, match="--vocab-size applies to --tokenizer bpe"):
        data.train_tokenizer("char", CODE, vocab_size=500)
    with pytest.raises(ValueError, match="'char' or 'bpe'"):
        data.train_tokenizer("word", CODE)


@pytest.mark.parametrize("content", ["not json", '{"model": {"type": "WordPiece"}}', '{"qkv_tokenizer": "char"}'])
def test_load_tokenizer_rejects_bad_files(tmp_path, content):
    (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(ValueError):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_tokenizer(tmp_path / "missing")


def test_encoded_corpus_and_bpe_are_cached_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path))
    tok = data.fit_tokenizer("bpe", CODE, vocab_size=300)
    ids = data.encode_corpus(tok, CODE)
    assert len(list(tmp_path.glob("bpe-*.json"))) == 1 and len(list(tmp_path.glob("ids-*.safetensors"))) == 1
    monkeypatch.setattr(BPETokenizer, "encode_tensor", lambda self, text: pytest.fail("not cached"))
    monkeypatch.setattr(BPETokenizer, "train", classmethod(lambda cls, *a, **k: pytest.fail("not cached")))
    again = data.fit_tokenizer("bpe", CODE, vocab_size=300)
    assert again.to_json() == tok.to_json() and torch.equal(data.encode_corpus(again, CODE), ids)
    next(tmp_path.glob("ids-*.safetensors")).write_bytes(b"damaged")  # recomputed, never trusted
    with pytest.raises(pytest.fail.Exception, match="not cached"):
        data.encode_corpus(again, CODE)
    monkeypatch.setenv("QKV_CACHE_DIR", "off")
    with pytest.raises(pytest.fail.Exception, match="not cached"):
        data.fit_tokenizer("bpe", CODE, vocab_size=300)
