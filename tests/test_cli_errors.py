"""The command's error policy: user errors exit 2 in one line, bugs in qkv exit 1 saying so,
QKV_DEBUG=1 shows every traceback; `qkv bench` runs a checkout's benchmarks in a subprocess."""
import pytest

from qkv import cli
from qkv.training.run_dir import RunLocked
from qkv.cli import bench, errors
from qkv.fileio import DiskFullError
from qkv.viz import plots


def fail_with(monkeypatch, exc: BaseException) -> None:
    """Make `qkv plot scaling` raise ``exc`` from inside the library."""
    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr(plots, "plot_scaling", broken)


def test_an_internal_bug_exits_1_and_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("QKV_DEBUG", raising=False)
    fail_with(monkeypatch, KeyError("d_model"))
    assert cli.main(["plot", "scaling", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "bug in qkv" in err and "QKV_DEBUG=1" in err and "KeyError" in err, err


@pytest.mark.parametrize("exc", [AttributeError("x"), RuntimeError("boom"), AssertionError()])
def test_other_internal_exceptions_exit_1(exc, monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("QKV_DEBUG", raising=False)
    fail_with(monkeypatch, exc)
    assert cli.main(["plot", "scaling", "--out", str(tmp_path)]) == 1
    assert "bug in qkv" in capsys.readouterr().err


@pytest.mark.parametrize("exc", [ValueError("bad"), TypeError("bad"), FileNotFoundError("bad"),
                                 PermissionError("bad"), IsADirectoryError("bad"), DiskFullError("/x"),
                                 RunLocked("bad"), errors.CommandError("bad")])
def test_user_errors_exit_2_in_one_line(exc, monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("QKV_DEBUG", raising=False)
    fail_with(monkeypatch, exc)
    assert cli.main(["plot", "scaling", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("qkv: error:") and "bug" not in err, err


def test_a_missing_optional_package_is_a_user_error(monkeypatch, tmp_path, capsys):
    fail_with(monkeypatch, ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib"))
    assert cli.main(["plot", "scaling", "--out", str(tmp_path)]) == 2
    assert "'matplotlib'" in capsys.readouterr().err


@pytest.mark.parametrize("exc", [KeyError("d_model"), ValueError("bad")])
def test_qkv_debug_shows_every_traceback(exc, monkeypatch, tmp_path):
    monkeypatch.setenv("QKV_DEBUG", "1")
    fail_with(monkeypatch, exc)
    with pytest.raises(type(exc)):
        cli.main(["plot", "scaling", "--out", str(tmp_path)])


def test_every_command_is_in_the_one_table_and_explains_itself(capsys):
    assert set(cli.COMMANDS) == {"train", "sample", "chat", "serve", "info", "export", "translate", "verify", "plot",
                                 "study", "explore", "bench"}
    for argv in [[name] for name in cli.COMMANDS] + [["plot", "pe"], ["plot", "attention"], ["study", "order"]]:
        assert cli.main([*argv, "--help"]) == 0
        assert capsys.readouterr().out.startswith(f"usage: qkv {' '.join(argv)} ")


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A fake source checkout whose benchmarks print their arguments and the working directory."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "__main__.py").write_text(
        "import os, sys\nSECTIONS = ['attention', 'complexity']\n"
        "if __name__ == '__main__':\n    print('ran', sys.argv[1:], os.getcwd())\n    sys.exit(3)\n")
    monkeypatch.setattr(bench, "CHECKOUT", tmp_path)
    return tmp_path


def test_bench_runs_the_checkout_in_a_subprocess(checkout, capfd):
    import sys

    path = list(sys.path)
    assert cli.main(["bench", "--quick", "--only", "complexity"]) == 3  # the benchmarks' own exit status
    assert f"ran ['--quick', '--only', 'complexity'] {checkout}" in capfd.readouterr().out
    assert sys.path == path


def test_bench_refuses_unknown_sections_and_missing_checkouts(checkout, monkeypatch, capfd):
    assert cli.main(["bench", "--only", "memory"]) == 2
    assert "unknown benchmark section(s) ['memory']" in capfd.readouterr().err
    monkeypatch.setattr(bench, "CHECKOUT", checkout / "nowhere")
    assert cli.main(["bench"]) == 2
    assert "source checkout" in capfd.readouterr().err


@pytest.mark.parametrize("command", [["sample", "--prompt", "a"], ["explore", "--text", "a"]])
def test_a_bad_device_is_a_user_error(command, tmp_path, capsys):
    assert cli.main([*command, "--run", str(tmp_path), "--device", "abc"]) == 2
    assert capsys.readouterr().err.startswith("qkv: error: device must be auto, cpu or cuda")


@pytest.mark.parametrize("argv, line", [
    (["train", "--max-minuts", "1"],
     "qkv: error: train: unrecognized arguments: --max-minuts 1 (--max-minuts: did you mean --max-minutes?)"),
    (["sample", "--run", "r", "--promt", "hi"],
     "qkv: error: sample: the following arguments are required: --prompt (--promt: did you mean --prompt?)"),
    (["study", "pe", "--quik"], "qkv: error: study pe: unrecognized arguments: --quik (--quik: did you mean --quick?)"),
    (["sample", "--run", "r", "--prompt", "a", "--backend", "fusd"],
     "qkv: error: sample: argument --backend: invalid choice: 'fusd' (choose from 'auto', 'eager', 'inductor', "
     "'fused', 'cudagraph') (did you mean 'fused'?)"),
    (["info", "--run", "r", "--zzzzzz"], "qkv: error: info: unrecognized arguments: --zzzzzz"),
    (["--zzzzzz"], "qkv: error: unrecognized arguments: --zzzzzz"),
])
def test_a_mistyped_flag_is_named_once_with_the_close_match(argv, line, capsys):
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_an_unknown_command_gets_the_close_match(capsys):
    assert cli.main(["smaple"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv: error: argument COMMAND: invalid choice: 'smaple'")
    assert err.rstrip().endswith("(did you mean 'sample'?)")


def test_a_flag_argparse_takes_as_an_abbreviation_gets_no_hint():
    assert errors.flag_hints(["--max-new", "3", "--tempreature", "1"], ["--max-new-tokens", "--temperature"]) == \
        ["--tempreature: did you mean --temperature?"]


def test_train_help_lists_every_preset_with_a_line(capsys):
    from qkv.models import PRESETS

    assert cli.main(["train", "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[lines.index("presets (--preset NAME; why each is shaped so: docs/design-notes.md):") + 2:]
    assert [ln.split()[0] for ln in table] == list(PRESETS)
    for name, c in PRESETS.items():
        row = next(ln for ln in table if ln.split()[0] == name).split()
        assert row[1:6] == [str(c.num_layers), str(c.attention.num_heads), str(c.d_model), str(c.max_len), c.position.kind]
        assert len(row) > 6  # what it is for


@pytest.mark.parametrize("argv", [["info", "--run", "F"], ["sample", "--run", "F", "--prompt", "a"]])
def test_a_file_given_for_a_run_directory_is_called_a_file(argv, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert cli.main([str(tmp_path / "f") if a == "F" else a for a in argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "is a file" in err[0] and "no such" not in err[0], err
