"""`qkv train --task translate`, `qkv translate`, `qkv info` on a translation run, end to end on a tiny budget."""
import json
import subprocess
import sys

import pytest

from qkv.cli import main

WORDS = ["file", "open", "save", "close", "error", "print", "copy", "delete", "network", "user"]
ZH = ["文件", "打开", "保存", "关闭", "错误", "打印", "复制", "删除", "网络", "用户"]
ARGS = ["--task", "translate", "--preset", "tiny", "--vocab-size", "300", "--batch-size", "8", "--max-steps", "3",
        "--eval-interval", "2", "--num-beams", "2", "--threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    path = tmp_path_factory.mktemp("pairs") / "pairs.tsv"
    path.write_text("".join(f"{a} {b}\t{za}{zb}\n" for a, za in zip(WORDS, ZH) for b, zb in zip(WORDS, ZH) if a != b),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run(pairs, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tr"
    assert main(["train", *ARGS, "--pairs", str(pairs), "--out", str(out)]) == 0
    return out


def test_train_prints_scores_beside_both_baselines(run, pairs, capsys, tmp_path):
    assert main(["train", *ARGS, "--pairs", str(pairs), "--out", str(tmp_path / "again")]) == 0
    out = capsys.readouterr().out
    assert "BLEU" in out and "chrF" in out and "copy the source" in out and "translation memory" in out
    s = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert s["task"] == "translate" and {"bleu", "chrf", "greedy_chrf", "memory_bleu", "copy_chrf"} <= set(s)
    assert (run / "loss.png").is_file()


def test_translate_arguments_and_stdin(run, capsys):
    assert main(["translate", "--run", str(run), "--num-beams", "2", "open file", "save user"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    res = subprocess.run([sys.executable, "-m", "qkv", "translate", "--run", str(run), "--num-beams", "1"],
                         input="open file\nclose network\ncopy error\n", capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 3


def test_info_shows_the_scores(run, capsys):
    assert main(["info", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "Transformer" in out and "BLEU" in out and "task=translate" in out


def test_translate_refuses_a_language_model_run(tmp_path, capsys):
    import qkv
    from qkv.training import run_dir as ckpt
    from qkv.data import CharTokenizer

    tok = CharTokenizer("abcdef ")
    ckpt.save_model(tmp_path / "lm", qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=tok.vocab_size)), tok)
    assert main(["translate", "--run", str(tmp_path / "lm"), "abc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "qkv sample" in err[0]


@pytest.mark.parametrize("argv, message", [
    (["--target-lang", "xx_NOPE"], "xx_NOPE"),
    (["--tokenizer", "char"], "shared byte-level BPE"),
])
def test_bad_translation_input_is_one_line(argv, message, tmp_path, capsys):
    assert main(["train", *ARGS, *argv, "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "bad").exists()


def test_a_pairs_line_without_a_tab_names_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\nno tab here\n", encoding="utf-8")
    assert main(["train", *ARGS, "--pairs", str(bad), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and not (tmp_path / "r").exists()


def test_explore_and_plot_show_a_translation_runs_three_attentions(run, tmp_path, capsys):
    page = tmp_path / "page.html"
    assert main(["explore", "--run", str(run), "--text", "open file", "--num-beams", "1", "--out", str(page)]) == 0
    assert "translation:" in capsys.readouterr().out
    html = page.read_text(encoding="utf-8")
    assert all(v in html for v in ('"encoder"', '"decoder"', '"cross"'))
    for kind in ("cross", "encoder"):
        assert main(["plot", "attention", "--run", str(run), "--text", "open file", "--kind", kind,
                     "--num-beams", "1", "--out", str(tmp_path / kind)]) == 0
        assert (tmp_path / kind / "attention.png").stat().st_size > 1000
