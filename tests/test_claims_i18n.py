"""`qkv verify --lang zh`: every line in Chinese but for code names, numbers, units and model names;
each summary template has a Chinese twin with the same fields; the English output as it was."""
import re
import string

import pytest

from qkv import claims
from qkv.claims import messages
from qkv.claims.messages import MESSAGES, Joined, Term, fields, say, section_text
from qkv.cli import main
from qkv.viz.text import CJK, LANGS

# Words a Chinese line may hold: code and module names, units, models and the like. No English prose word
# ("error", "holds", "mean", "weights", "vs" …) may be added here: the test is there to catch those.
NEUTRAL = {
    "nats", "MFLOP", "GFLOP", "FLOPs", "MB", "ms", "M", "µs", "True", "False", "softmax", "relu", "logits", "token",
    "autograd", "std", "max", "min", "var", "TV", "PE", "RoPE", "ALiBi", "MHA", "GPT", "LSTM", "GRU", "RNN", "qkv",
    "SelfAttention", "MultiHeadAttention", "Encoder", "TransformerBlock", "RotaryEmbedding", "Transformer", "base",
    "BERT-base", "BERT-large", "small", "medium", "large", "xl", "transformers", "flash", "cpu", "cuda", "fp32",
    "fp64", "tanh", "conv1d", "DIR", "WMT", "Press", "et", "al", "sinusoidal", "out", "pos", "spec", "key",
    "query", "scores", "CPU", "embedding",  # the spec writes "embedding" and "token" in Chinese text too
    "paper-base", "verify", "study",  # a preset's and qkv's commands' names
    "YaRN", "PI", "NTK", "Peng",  # RoPE scaling methods' names and an author's
}
QUOTED = re.compile(r"「[^」]*」|(?<![A-Za-z])'[^']*'(?![A-Za-z])|\"[^\"]*\"|`[^`]*`|\[[^\]]*\]")  # the spec's words, errors, code, names


def prose(text: str) -> list[str]:
    """The English words of ``text`` outside quotes (which may span lines) that are neither code nor in NEUTRAL."""
    names = set(claims.claim_names())
    found = []
    for token in re.split(rf"[\s，。；：、（）《》]+|{CJK.pattern}", QUOTED.sub(" ", text)):
        if re.search(r"[0-9_.=/\[\]|‖∂√·²ᵀ^−]|\w\(|^--", token):
            continue  # a number, a formula, a call, an option
        token = token.strip(",;:()…—")
        if token and token not in names:  # a claim's name is code
            found += [w for w in re.findall(r"[A-Za-z][A-Za-z-]*[A-Za-z]", token) if w not in NEUTRAL]
    return found


def english_lines(text: str) -> dict[str, list[str]]:
    """line -> its English words, for each line of ``text`` that has some (quotes removed first, whole)."""
    return {line: prose(line) for line in QUOTED.sub(lambda m: re.sub(r"\S", "", m[0]), text).splitlines()
            if prose(line)}


def test_prose_finds_english_words_and_lets_code_through():
    assert prose("max |out − W·V| = 0；最小权重 0.039") == []
    assert prose("min weight 0.039; holds") == ["weight", "holds"]
    assert prose("需要 `qkv verify --run DIR`；'ValueError: bad input' [scaling-variance]") == []
    assert prose("注意力 1.44, LSTM 7.17e-14") == [] and prose("the module against a loop") == ["the", "module",
                                                                                                   "against", "loop"]


def test_every_line_of_verify_in_chinese(capsys, tmp_path):
    report = tmp_path / "report.md"
    assert main(["verify", "--lang", "zh", "--markdown", str(report)]) == 0
    text = capsys.readouterr().out + report.read_text(encoding="utf-8")
    assert not english_lines(text), english_lines(text)
    lines = text.splitlines()
    assert sum(bool(CJK.search(line)) for line in lines) > 0.9 * sum(bool(line.strip("-|! ")) for line in lines)


def test_every_chinese_template_is_chinese_with_the_english_fields():
    for key, by_lang in MESSAGES.items():
        assert set(by_lang) == set(LANGS), key
        assert fields(by_lang["zh"]) == fields(by_lang["en"]), key  # same values, same format specs
        filled = string.Formatter().vformat(by_lang["zh"], (), {name: 1 for name, _, _ in fields(by_lang["zh"])})
        assert not prose(filled), (key, prose(filled))  # also the --full and --run checks' sentences
    for table in (messages.WORDS["zh"], messages.TERMS["zh"], messages.SECTION_WORDS["zh"]):
        for key, text in table.items():
            text = " ".join(text.values()) if isinstance(text, dict) else text
            assert not prose(re.sub(r"\{\w*\}", "1", text)), (key, text)


def test_english_sentences_as_before_and_the_same_numbers_in_chinese():
    m = say("sdpa-default-scale", d_k=64, scaled=3.04e-07, unscaled=0.74123)
    assert m.render("en") == ("d_k=64: F.scaled_dot_product_attention vs softmax(QKᵀ/√d_k)V rel. error 3e-07; "
                              "vs softmax(QKᵀ)V 0.741")
    assert m.render("zh") == ("d_k=64：F.scaled_dot_product_attention 与 softmax(QKᵀ/√d_k)V 的相对误差 3e-07；"
                              "与 softmax(QKᵀ)V 的相对误差 0.741")
    parts = Joined([say("named", name=Term("attention"), value="1.44"), say("named", name=Term("GRU"), value="2")])
    assert parts.render("en") == "attention 1.44; GRU 2" and parts.render("zh") == "注意力 1.44；GRU 2"
    assert section_text("Q10 (correction)", "en") == "Q10 (correction)" and section_text("Q10 (correction)", "zh") == "Q10（更正）"
    with pytest.raises(KeyError, match="no message 'nope'"):
        say("nope")
    with pytest.raises(ValueError, match=r"lang must be one of \['en', 'zh'\], got 'fr'"):
        m.render("fr")


def test_claims_carry_both_languages():
    (r,) = claims.run_claims(["mha-params"])
    assert r.summary.startswith("d_model=128, h = 1, 2, 4, 8, 16: ") and r.summary.endswith("parameters; 4·d² = 65536")
    assert r.summary_zh.startswith("d_model=128，h = 1, 2, 4, 8, 16：参数量 ")
    numbers = re.compile(r"\d[\d.e+-]*")
    assert numbers.findall(r.summary) == numbers.findall(r.summary_zh)
