import pytest

pytest.importorskip("sacrebleu", reason="the translate extra: pip install -e '.[translate]'")
pytest.importorskip("rapidfuzz", reason="the translate extra: pip install -e '.[translate]'")

from qkv.data.catalogs import PairCorpus
from qkv.training.metrics import baselines, bleu, bleu_tokenizer, chrf, copy_baseline, memory_baseline


def test_bleu_by_hand():
    # hyp 6 words = ref 6 words (brevity penalty 1); clipped n-gram precisions 5/6, 3/5, 2/4, 1/3
    got = bleu(["the cat sat on the mat"], ["the cat sat on a mat"], target_lang="de")
    assert got == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
    assert bleu(["a b c d"], ["a b c d"], target_lang="fr") == pytest.approx(100)


def test_chinese_target_is_tokenized_per_character():
    hyp, ref = ["我们喜欢这只猫"], ["我们喜欢那只猫"]  # one character differs
    assert bleu_tokenizer("zh_CN") == bleu_tokenizer("zh") == "zh" and bleu_tokenizer("de") == "13a"
    # per character: precisions 6/7, 4/6, 2/5, 1/4; with 13a the whole line is one (wrong) word
    assert bleu(hyp, ref, target_lang="zh_CN") == pytest.approx(100 * (6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25)
    assert bleu(hyp, ref, target_lang="en") == 0.0


def test_chrf_by_hand_and_pairing():
    assert chrf(["abc"], ["abc"]) == pytest.approx(100) and chrf(["abc"], ["xyz"]) == 0.0
    # orders 1-2 (the hypothesis has no 3-grams): precision 1, recall (2/3 + 1/2)/2 = 7/12; F2 = 5PR/(4P+R) = 35/55
    assert chrf(["ab"], ["abc"]) == pytest.approx(100 * 35 / 55)
    assert chrf(["abc", "xyz"], ["abc", "xyz"]) > chrf(["abc", "xyz"], ["xyz", "abc"])  # hypothesis i meets reference i


@pytest.mark.parametrize("hyps, refs, error, message", [
    (["a"], ["a", "b"], ValueError, "got 1 hypotheses and 2 references"),
    ([], [], ValueError, "at least one"),
    ("abc", ["abc"], TypeError, "hypotheses must be a list of strings, got str"),
    (["a"], [None], TypeError, "references must be a list of strings"),
])
def test_bad_input(hyps, refs, error, message):
    with pytest.raises(error, match=message):
        chrf(hyps, refs)
    with pytest.raises(error, match=message):
        bleu(hyps, refs, target_lang="zh")


TRAIN = [("Open file", "打开文件"), ("Save file", "保存文件"), ("Quit", "退出"), ("Quiz", "测验")]


def test_memory_baseline_picks_the_nearest_source():
    assert memory_baseline(TRAIN, ["Open files", "Save the file", "Quit?"]) == ["打开文件", "保存文件", "退出"]
    assert memory_baseline(TRAIN, ["Qui"]) == ["退出"] and memory_baseline(TRAIN[::-1], ["Qui"]) == ["测验"]  # a tie: the first
    assert memory_baseline(TRAIN, []) == []
    with pytest.raises(ValueError, match="at least one training pair, got 0"):
        memory_baseline([], ["Open"])


def test_baselines_score_copy_and_memory_on_the_held_out_pairs():
    val = [("Open files", "打开文件"), ("Quit now %s", "立即退出 %s")]
    c = PairCorpus(TRAIN, val, source="test", target_lang="zh_CN")
    refs = [t for _, t in val]
    assert copy_baseline(val) == ["Open files", "Quit now %s"]
    got = baselines(c)
    assert got["copy_chrf"] == pytest.approx(chrf(["Open files", "Quit now %s"], refs)) and got["copy_chrf"] > 0
    assert got["memory_bleu"] == pytest.approx(bleu(["打开文件", "退出"], refs, target_lang="zh"))
    assert got["memory_chrf"] > got["copy_chrf"]
    assert baselines(c, target_lang="de")["memory_bleu"] != got["memory_bleu"]  # 13a: whole lines as words
