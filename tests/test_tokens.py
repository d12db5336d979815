"""qkv.tokens: text -> (ids, labels), the one encoder the claims, figures and explorer share."""
import pytest

from qkv.data import CharTokenizer
from qkv.tokens import encode_text, token_labels


class DecodeOnly:
    """A tokenizer without token_strings: labels come from decode([id])."""

    def encode(self, text):
        return [ord(c) - ord("a") for c in text]

    def decode(self, ids):
        return "".join(chr(i + ord("a")) for i in ids)


def test_encode_text_checks_vocabulary_and_length():
    tok = CharTokenizer("abc ")
    ids, labels = encode_text(tok, "ab c", max_len=8)
    assert ids == tok.encode("ab c") and labels == ["a", "b", " ", "c"]
    assert encode_text(tok, "a" * 9) == ([tok.encode("a")[0]] * 9, ["a"] * 9)  # no max_len: no bound
    with pytest.raises(ValueError, match="outside"):
        encode_text(tok, "abz", max_len=8)
    with pytest.raises(ValueError, match="9 tokens but the model's max_len is 8"):
        encode_text(tok, "a" * 9, max_len=8)
    with pytest.raises(ValueError, match="empty"):
        encode_text(tok, "", max_len=8)
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        encode_text(tok, b"ab")


def test_labels_from_token_strings_or_decode():
    tok = CharTokenizer("abc ")
    assert token_labels(tok, tok.encode("c a")) == ["c", " ", "a"]
    assert encode_text(DecodeOnly(), "cab") == ([2, 0, 1], ["c", "a", "b"])
    assert token_labels(DecodeOnly(), (1, 1)) == ["b", "b"]
