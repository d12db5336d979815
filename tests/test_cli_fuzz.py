"""The command under fuzzing: random and adversarial arguments to every subcommand end with
exit status 0 or 2 and, on 2, one line on stderr — never a traceback. Bounded in count and time."""
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qkv
from qkv.training import run_dir as ckpt
from qkv import cli
from qkv.data import CharTokenizer

TEXT = "def f(x):\n    return x * 2\n" * 40
JUNK = ["-1", "0", "nan", "inf", "1e999", "abc", "", " ", "٣", "9" * 30, "--", "-", "../..", "/dev/null",
        "\x00", "é ü", "<script>", "-5.5", "None", "{}", "--help-me"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("run with spaces é")
    tok = CharTokenizer.train(TEXT)
    torch.manual_seed(0)
    ckpt.save_model(d, qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=tok.vocab_size)), tok)
    (d.parent / "data é.txt").write_text(TEXT, encoding="utf-8")
    return d


def commands(run: str, data: str, out: str) -> dict[str, tuple[list[str], dict[str, list[str]]]]:
    """Per subcommand: a safe base argv (small budgets) and each flag's candidate values."""
    return {
        "train": (["train", "--preset", "tiny", "--data", data, "--max-steps", "1", "--max-minutes", "0.05",
                   "--out", out, "--quiet", "--sample-tokens", "0"],
                  {"--preset": ["tiny", "nope", "gpt3"], "--max-steps": JUNK, "--seed": JUNK, "--lr": JUNK,
                   "--batch-size": JUNK, "--context": JUNK, "--tokenizer": ["char", "bpe", "words"],
                   "--vocab-size": JUNK, "--data": [data, "/nonexistent", "/dev/null", run], "--device": JUNK}),
        "sample": (["sample", "--run", run, "--prompt", "def", "--max-new-tokens", "3"],
                   {"--run": [run, "/nonexistent", data], "--prompt": ["def", "", "ß∂ƒ", "<script>"],
                    "--max-new-tokens": JUNK, "--temperature": JUNK, "--top-k": JUNK, "--top-p": JUNK,
                    "--seed": JUNK}),
        "info": (["info", "--run", run], {"--run": [run, "/nonexistent", data, "", "."]}),
        "verify": (["verify", "--only", "causal"], {"--only": ["nope", "", "causal", "§1.3"], "--seed": JUNK,
                                                    "--run": ["/nonexistent", data]}),
        "plot": (["plot", "pe", "--out", out], {"--d-model": JUNK + ["7", "4096"], "--length": JUNK,
                                                 "--out": ["/dev/null/x"]}),
        "explore": (["explore", "--run", run, "--text", "def", "--out", f"{out}/page.html"],
                    {"--text": ["", "ß", "def" * 100, "<script>alert(1)</script>"], "--run": ["/nonexistent", data],
                     "--hf": [run, "/nonexistent"], "--max-chars": JUNK}),
        "bench": (["bench", "--only", "nope"], {"--only": ["nope", "", "x y"]}),
        "study": (["study", "pe", "--seeds", "0"], {"--seeds": JUNK, "--data": ["/nonexistent"]}),
    }


@st.composite
def argvs(draw, table):
    name = draw(st.sampled_from(sorted(table)))
    base, flags = table[name]
    argv = list(base)
    for flag in draw(st.lists(st.sampled_from(sorted(flags)), max_size=3)):
        argv += [flag, draw(st.sampled_from(flags[flag]))]
    if draw(st.booleans()):
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(JUNK + ["--bogus", "-x"])))
    return name, argv


def check_one_line(rc: int, err: str) -> None:
    assert rc in (0, 2), f"exit status {rc}: {err}"
    assert "Traceback" not in err
    if rc == 2:
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("usage:")]
        assert len(lines) == 1 and lines[0].startswith("qkv"), err


def test_fuzz_every_subcommand(tiny_run, tmp_path, capsys):
    table = commands(str(tiny_run), str(tiny_run.parent / "data é.txt"), str(tmp_path / "out dir é"))
    seen = set()

    @settings(max_examples=120, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(argvs(table))
    def run(case):
        name, argv = case
        rc = cli.main(argv)
        err = capsys.readouterr().err
        check_one_line(rc, err)
        seen.add((name, rc))

    run()
    assert {name for name, _ in seen} == set(table)  # every subcommand was exercised
    assert {rc for _, rc in seen} == {0, 2}


@pytest.mark.parametrize("argv", [["--bogus"], ["train", "--max-steps", "x"], ["sample", "--run", "/nonexistent",
                                                                             "--prompt", "a"], ["nope"], []])
def test_real_entry_point_prints_one_line_never_a_traceback(argv):
    res = subprocess.run([sys.executable, "-m", "qkv", *argv], capture_output=True, text=True, timeout=120)
    check_one_line(res.returncode, res.stderr)
    assert res.returncode == 2


def test_paths_with_spaces_and_non_ascii_work(tiny_run, tmp_path, capsys):
    data = str(tiny_run.parent / "data é.txt")
    out = str(tmp_path / "my run ü")
    assert cli.main(["train", "--preset", "tiny", "--data", data, "--max-steps", "2", "--out", out, "--quiet",
                     "--sample-tokens", "0"]) == 0
    capsys.readouterr()
    assert cli.main(["sample", "--run", out, "--prompt", "def", "--max-new-tokens", "5", "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("def")
