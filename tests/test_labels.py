"""qkv.viz.labels: a token holding part of a character is named by the character and its piece number."""
import pytest

from qkv.data import CharTokenizer
from qkv.data.tokens import gpt2_byte_table, token_labels
from qkv.viz.labels import characters, readable_labels, readable_tokens

TABLE = gpt2_byte_table()


class BytePieces:
    """A byte-level tokenizer over fixed byte pieces, spelled the way GPT-2's vocabulary spells them."""

    def __init__(self, pieces):
        self.pieces = pieces
        self.backend = type("Backend", (), {"id_to_token": lambda _, i: "".join(TABLE[b] for b in pieces[i])})()

    def decode(self, ids):
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", "replace")


@pytest.fixture(scope="module")
def zh_bpe():
    """Byte-level BPE whose first merge is e5+a4 (the first two bytes of 大, 多 and 头), then 大."""
    from qkv.data import BPETokenizer

    return BPETokenizer.train("大大大大大 多头注意力" * 3, 258)


def test_byte_pieces_are_named_by_their_character(zh_bpe):
    ids = zh_bpe.encode("多头 大")
    assert token_labels(zh_bpe, ids) == ["<e5 a4>", "<9a>", "<e5 a4>", "<b4>", " ", "大"]  # the bytes
    assert readable_labels(zh_bpe, ids) == ["多₁", "多₂", "头₁", "头₂", " ", "大"]
    ids, labels = readable_tokens(zh_bpe, "狗咬人")  # not in the merges: one token per byte
    assert labels == ["狗₁", "狗₂", "狗₃", "咬₁", "咬₂", "咬₃", "人₁", "人₂", "人₃"] and len(ids) == 9


def test_a_window_cut_mid_character_keeps_the_stray_bytes(zh_bpe):
    ids = zh_bpe.encode("多头 大")
    assert readable_labels(zh_bpe, ids[1:]) == ["<9a>", "头₁", "头₂", " ", "大"]  # 多's last byte alone
    assert readable_labels(zh_bpe, ids[:3]) == ["多₁", "多₂", "<e5 a4>"]  # 头 cut after its first piece


def test_a_token_across_two_characters_names_both():
    dog, bite = "狗".encode(), "咬".encode()  # e7 8b 97, e5 92 ac
    tok = BytePieces([dog[:2], dog[2:] + bite[:1], bite[1:], "人".encode()])
    assert token_labels(tok, [0, 1, 2, 3]) == ["<e7 8b>", "<97 e5>", "<92 ac>", "人"]
    assert readable_labels(tok, [0, 1, 2, 3]) == ["狗₁", "狗₂咬₁", "咬₂", "人"]


def test_whole_characters_are_left_alone():
    tok = CharTokenizer.train("狗咬人 dog")
    ids = tok.encode("人咬狗 god")
    assert readable_labels(tok, ids) == token_labels(tok, ids) == list("人咬狗 god")
    with pytest.raises(ValueError, match="empty"):
        readable_tokens(tok, "")  # encode_text's checks


def test_characters_of_bytes():
    assert characters("a狗".encode()) == [(0, 1, "a"), (1, 4, "狗")]
    assert characters(b"\x97\xe5\x92") == [(0, 1, None), (1, 2, None), (2, 3, None)]  # no whole character
    assert characters(b"\xed\xa0\x80") == [(0, 1, None), (1, 2, None), (2, 3, None)]  # a surrogate is no character
