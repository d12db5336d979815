"""`qkv verify` and `qkv plot` end to end: every claim holds, bad input is one line and exit status 2."""
import json
import struct

import pytest
import torch
from torch import nn

import qkv
from qkv.cli import main
from qkv import claims
from qkv.claims import multi_head


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run on disk (checkpoint format) whose heads attend sharply and differently, and its training text."""
    from qkv.training.run_dir import save_model
    from qkv.data import CharTokenizer

    d = tmp_path_factory.mktemp("run")
    text = "def add(a, b):\n    return a + b\n" * 400
    (d / "corpus.txt").write_text(text, encoding="utf-8")
    tok = CharTokenizer.train(text)
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig(vocab_size=tok.vocab_size, d_model=32, attention=dict(num_heads=4), num_layers=2,
                                    max_len=32))
    with torch.no_grad():
        for block in model.blocks:
            nn.init.normal_(block.attn.q_proj.weight, std=1.0)
            nn.init.normal_(block.attn.k_proj.weight, std=1.0)
    save_model(d, model, tok)
    (d / "train_config.json").write_text(json.dumps({"data": str(d / "corpus.txt")}), encoding="utf-8")
    return d


def one_line_error(capsys, argv, match):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("qkv: error:") and match in err, err


def test_verify_every_claim_holds(capsys):
    assert main(["verify"]) == 0
    out = capsys.readouterr().out
    n = len(claims.CHECKS)
    assert f"{n} of {n} claims hold" in out and "FAILS" not in out
    for section in ("§1.3", "§2.3", "§3", "Q12", "§2.1 (correction)", "§3.4 (correction)", "Q2 (correction)"):
        assert section in out


def test_verify_json(capsys):
    assert main(["verify", "--json", "--only", "mha-params,output-shape", "--only", "sinusoidal-range"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in records] == ["output-shape", "mha-params", "sinusoidal-range"]
    assert all({"claim", "section", "measured", "holds"} <= set(r) and r["holds"] for r in records)
    assert records[1]["measured"]["parameters"] == [4 * 128**2] * 5


def test_verify_exits_1_when_a_claim_fails(capsys, monkeypatch):
    def broken(seed=0):  # biases add 4·d parameters
        return multi_head.mha_params(lambda d, h: qkv.MultiHeadAttention(d, h, bias=True), seed=seed)

    monkeypatch.setitem(claims.CHECKS, "mha-params", broken)
    assert main(["verify", "--only", "mha-params"]) == 1
    assert "FAILS   §2.2" in capsys.readouterr().out


def test_verify_list(capsys):
    assert main(["verify", "--list"]) == 0
    assert capsys.readouterr().out.split() == claims.claim_names()


def test_verify_markdown(tmp_path, capsys):
    report = tmp_path / "report.md"
    assert main(["verify", "--only", "scaling-variance", "--markdown", str(report)]) == 0
    text = report.read_text(encoding="utf-8")
    assert "scaling-variance" in text and "![" in text
    assert (tmp_path / "report-pe.png").is_file() and (tmp_path / "report-scaling.png").is_file()


def test_verify_run_adds_head_diversity(run_dir, tmp_path, capsys):
    report = tmp_path / "r.md"
    assert main(["verify", "--json", "--only", "head-diversity", "--run", str(run_dir), "--markdown", str(report)]) == 0
    (r,) = json.loads(capsys.readouterr().out)
    assert r["name"] == "head-diversity" and r["section"] == "Q3" and r["holds"]
    assert r["measured"]["trained_mean"] > 2 * r["measured"]["init_mean"]
    assert r["measured"]["tokens"] == 4 * 32  # 4 windows of max_len tokens of the run's validation text
    assert (tmp_path / "r-heads.png").is_file() and (tmp_path / "r-attention.png").is_file()
    assert main(["verify", "--json", "--only", "head-diversity", "--run", str(run_dir), "--text", "def f(a):"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["measured"]["tokens"] == 9


@pytest.mark.parametrize("argv, match", [
    (["verify", "--only", "nope"], "unknown claim 'nope'; choose from: scaling-variance"),
    (["verify", "--only", "head-diversity"], "needs a trained model"),
    (["verify", "--run", "/nonexistent/run"], "no such run directory"),
    (["verify", "--text", "abc"], "--text is for --run"),
    (["plot"], "required"),
    (["plot", "attention", "--run", "/nonexistent/run", "--text", "a"], "no such run directory"),
    (["plot", "pe", "--d-model", "7"], "even"),
    (["plot", "pe", "--length", "1"], "length must be an int in [2, "),
])
def test_bad_input_is_one_line_and_status_2(capsys, argv, match):
    one_line_error(capsys, argv, match)


def test_plot_attention_bad_text(run_dir, tmp_path, capsys):
    one_line_error(capsys, ["plot", "attention", "--run", str(run_dir), "--text", "a" * 33, "--out", str(tmp_path)],
                   "33 tokens but the model's max_len is 32")
    one_line_error(capsys, ["plot", "attention", "--run", str(run_dir), "--text", "def 狗", "--out", str(tmp_path)],
                   "outside the tokenizer")
    one_line_error(capsys, ["plot", "attention", "--run", str(run_dir), "--text", "", "--out", str(tmp_path)],
                   "empty")
    one_line_error(capsys, ["verify", "--run", str(tmp_path), "--only", "head-diversity"], "not a qkv run")
    assert not list(tmp_path.glob("*.png"))


def png_size(path):
    return struct.unpack(">II", path.read_bytes()[16:24])


def test_plot_commands(run_dir, tmp_path, capsys):
    assert main(["plot", "pe", "--out", str(tmp_path)]) == 0
    assert main(["plot", "scaling", "--out", str(tmp_path)]) == 0
    assert main(["plot", "attention", "--run", str(run_dir), "--text", "def add(a, b):", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / n) for n in ("pe.png", "scaling.png", "attention.png")]
    assert png_size(tmp_path / "pe.png") == (1400, 550)
    # 14 tokens: cell = max(2.3, 0.1·14 + 0.9) = 2.3 in; width 4·2.3 + 1.6 in; height 2·(2.3 + 0.4) + 1.0 in of
    # panels, 0.45 in around the title and the title's one or two lines of 12 pt
    width, height = png_size(tmp_path / "attention.png")
    assert width == 1080 and 100 * (6.4 + 0.45 + 0.15) < height < 100 * (6.4 + 0.45 + 0.45)


def test_run_whose_training_text_is_gone(run_dir, tmp_path, capsys):
    import shutil

    moved = tmp_path / "run"
    shutil.copytree(run_dir, moved)
    (moved / "train_config.json").write_text(json.dumps({"data": str(tmp_path / "gone.txt")}), encoding="utf-8")
    one_line_error(capsys, ["verify", "--run", str(moved), "--only", "head-diversity"], "pass --text")
    assert main(["verify", "--run", str(moved), "--only", "head-diversity", "--text", "def f(a, b):"]) == 0


def test_verify_lang_zh_and_not_measurable_rows(capsys):
    from qkv.cli import main

    assert main(["verify", "--lang", "zh", "--only", "scaling-variance"]) == 0
    out = capsys.readouterr().out
    assert "成立" in out and "§1.3" in out
    assert main(["verify", "--json"]) == 0
    rows = __import__("json").loads(capsys.readouterr().out)
    assert any(r["holds"] is None for r in rows) and all(r["holds"] in (True, None) for r in rows)


def test_plot_complexity_quick(tmp_path, monkeypatch):
    from qkv import claims
    from qkv.cli import main

    rows = [{"n": n, "path": p, "seconds": 1e-9 * n ** (2 if p == "reference" else 1), "peak_mb": n / 100}
            for n in (256, 512, 1024) for p in ("reference", "flash")]
    monkeypatch.setattr(claims, "measure_complexity", lambda lengths, **kw: [r for r in rows if r["n"] in lengths])
    assert main(["plot", "complexity", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "complexity.png").stat().st_size > 1000
