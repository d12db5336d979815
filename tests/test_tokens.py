"""qkv.tokens: text -> (ids, labels), the one encoder the claims, figures and explorer share."""
import pytest

from qkv.data import CharTokenizer
from qkv.data.tokens import bytes_label, encode_text, gpt2_byte_table, token_labels


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


# ---- byte-level labels: part of a character shows as its bytes, never as '�' -------------------

ZH = "大大大大大 多头注意力" * 3


@pytest.fixture(scope="module")
def zh_bpe():
    """Byte-level BPE with two merges learned on ZH: e5+a4 (the first two bytes of 大, 多 and 头), then 大."""
    from qkv.data import BPETokenizer

    return BPETokenizer.train(ZH, 258)


def test_gpt2_byte_table_is_the_byte_level_alphabet():
    from tokenizers import pre_tokenizers

    table = gpt2_byte_table()
    assert sorted(table) == list(range(256)) and set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert (table[ord(" ")], table[ord("\n")], table[ord("a")]) == ("Ġ", "Ċ", "a")  # GPT-2's 'Ġthe'


def test_bytes_label_shows_partial_characters_as_hex():
    assert bytes_label("大".encode()) == "大"
    assert bytes_label("大".encode()[:2]) == "<e5 a4>"
    assert bytes_label(b"a" + "大".encode() + b"\xe5") == "a大<e5>"
    assert bytes_label(b"\xa4\xa7\xe5") == "<a4 a7 e5>"  # adjacent stray bytes: one group


def test_bpe_labels_partial_characters_by_their_bytes(zh_bpe):
    ids = zh_bpe.encode("多头 大")
    # 多 = e5 a4 9a, 头 = e5 a4 b4: the merged first two bytes, then the last; 大 is one token
    assert token_labels(zh_bpe, ids) == ["<e5 a4>", "<9a>", "<e5 a4>", "<b4>", " ", "大"]
    labels = token_labels(zh_bpe, zh_bpe.encode("多头注意力把 d_model 切成 h 份"))
    assert "\ufffd" not in "".join(labels) and labels[-4:] == [" ", "<e4>", "<bb>", "<bd>"]  # 份 = e4 bb bd


def test_hf_wrapper_labels_like_qkv_bpe(zh_bpe):
    from qkv.interop.hf import Tokenizer

    ids = zh_bpe.encode("多头 大")
    expected = ["<e5 a4>", "<9a>", "<e5 a4>", "<b4>", " ", "大"]
    assert token_labels(Tokenizer(zh_bpe.tokenizer), ids) == expected  # a tokenizers.Tokenizer backend
    transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=zh_bpe.tokenizer)
    assert token_labels(Tokenizer(fast), ids) == expected  # a transformers backend


class Vocabulary(DecodeOnly):
    """A tokenizer whose backend spells tokens (``id_to_token``) as ``tokens`` and decodes them as ``texts``."""

    def __init__(self, tokens, texts):
        self.backend = type("Backend", (), {"id_to_token": lambda _, i: tokens[i]})()
        self.texts = texts

    def decode(self, ids):
        return "".join(self.texts[i] for i in ids)


def test_byte_fallback_latin1_and_unrecoverable_tokens():
    sentencepiece = Vocabulary(["<0xE5>", "▁大"], ["\ufffd", " 大"])
    assert token_labels(sentencepiece, [0, 1]) == ["<e5>", " 大"]
    wordpiece = Vocabulary(["é", "##ß"], ["é", "ß"])  # Latin-1 letters that are not GPT-2 byte characters here
    assert token_labels(wordpiece, [0, 1]) == ["é", "ß"]
    broken = Vocabulary(["x\ufffd"], ["\ufffd"])
    assert token_labels(broken, [0]) == ["<?>"]
    assert token_labels(Vocabulary(["ab"], ["\ufffd"]), [0]) == ["ab"]  # bytes unknown: the vocabulary's string
    with pytest.raises(TypeError):
        token_labels(DecodeOnly(), [1.0])
