"""`qkv train --task translate`, `qkv translate`, `qkv info` on a translation run, end to end on a tiny budget."""
import io
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


def test_sample_on_a_translation_run_points_to_translate(run, capsys):
    assert main(["sample", "--run", str(run), "--prompt", "open"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "None" not in err[0] and err[0].startswith(f"qkv: error: {run}: sampling needs a decoder")
    assert "got PointerTransformer: use `qkv translate`" in err[0]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_typing_at_a_terminal_says_it_reads_stdin_and_translates_each_line(run, monkeypatch, capsys):
    from qkv.training.tasks import translation

    sizes, real = [], translation.translate_texts
    monkeypatch.setattr(translation, "translate_texts", lambda m, t, texts, **k: sizes.append(len(texts)) or
                        real(m, t, texts, **k))
    monkeypatch.setattr(sys, "stdin", Terminal("open file\nclose network\n"))
    assert main(["translate", "--run", str(run), "--num-beams", "1"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 2 and sizes == [1, 1]  # one line at a time, as typed
    assert "reading the lines to translate from stdin" in err and "end with Ctrl-D" in err
    monkeypatch.setattr(sys, "stdin", io.StringIO("open file\nclose network\n"))  # a pipe: batches, no message
    assert main(["translate", "--run", str(run), "--num-beams", "1"]) == 0
    assert capsys.readouterr().err == "" and sizes[2:] == [2]


def test_translations_come_as_each_batch_is_read(run):
    """translate_lines reads a batch, yields its translations, then reads on: nothing waits for the end."""
    from qkv.training.run_dir import load_run
    from qkv.training.tasks.translation import translate_lines, translate_texts

    r, read = load_run(run), []

    def lines():
        for text in ["open file", "close network", "copy error", "save user", "print user"]:
            read.append(text)
            yield text

    got = translate_lines(r.model, r.tokenizer, lines(), batch_size=2, num_beams=1)
    first = next(got)
    assert len(read) == 2  # only the first batch was read
    rest = list(got)
    assert [first, *rest] == translate_texts(r.model, r.tokenizer, read, num_beams=1, batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        next(translate_lines(r.model, r.tokenizer, ["a"], batch_size=0))


def test_info_says_what_the_data_was(run, capsys):
    from qkv.training.recipe import data_info

    assert main(["info", "--run", str(run)]) == 0
    data = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("data:"))
    assert "pairs.tsv" in data and "target language zh_CN" in data and "embedded" not in data
    catalogs = data_info({"task": "translate", "data": None}, {"corpus": "gettext catalogs in /usr/share/locale",
                                                                "target_lang": "de"})
    assert catalogs == "gettext catalogs in /usr/share/locale, target language de (the default: no --data given)"
    assert "gettext catalogs" in data_info({"task": "translate", "task_options": {"target_lang": "fr"}}, {})
    assert "Python standard library" in data_info({"task": "lm"}, {})
