"""Progress in one place (qkv.training.progress): a tqdm bar on a terminal; in a log (a file, a pipe), plain
lines, each ending in a newline, at most one per interval, never one line grown by carriage returns."""
import io

import pytest
import torch

from qkv.cli import main
from qkv.studies.progress import models_bar
from qkv.training.progress import LineProgress, progress_bar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def lines_of(text: str) -> list[str]:
    assert "\r" not in text and text.endswith("\n"), repr(text[-200:])
    return text.splitlines()


def test_in_a_log_progress_is_plain_lines_at_most_one_per_interval():
    log = io.StringIO()
    bar = progress_bar(100.0, desc="qkv train", unit="%", file=log, interval=1e9)
    assert isinstance(bar, LineProgress)
    for step in range(1000):
        bar.update(0.1)
        bar.set_postfix_str(f"step {step}, loss 2.000", refresh=False)
    bar.close()
    bar.close()
    lines = lines_of(log.getvalue())
    assert len(lines) == 2  # the start, the end: the interval kept the thousand updates out
    assert lines[0].startswith("qkv train:   0%") and lines[1].startswith("qkv train: 100%")
    assert lines[1].endswith("step 999, loss 2.000]")


def test_with_no_interval_each_update_is_a_line_and_the_counts_are_said():
    log = io.StringIO()
    with progress_bar(3, desc="qkv study pe", unit="model", file=log, interval=0) as bar:
        for name in ("sinusoidal", "rope", "alibi"):
            bar.set_postfix_str(name)
            bar.update(1)
    lines = lines_of(log.getvalue())
    assert [ln.split(" [")[0] for ln in lines] == [f"qkv study pe: {100 * k / 3:3.0f}% ({k}/3 model)" for k in range(4)]
    assert lines[-1].endswith(", alibi]")


def test_on_a_terminal_it_is_tqdms_bar():
    term = Terminal()
    bar = progress_bar(10, desc="x", unit="it", file=term)
    assert not isinstance(bar, LineProgress)
    bar.update(5)
    bar.close()
    assert "\r" in term.getvalue()


def test_the_studies_bar_writes_a_line_per_model(capsys):
    assert list(models_bar(["a", "b"], desc="qkv study order", enabled=True, label=str)) == ["a", "b"]
    lines = lines_of(capsys.readouterr().err)
    assert len(lines) == 3 and lines[-1].startswith("qkv study order: 100% (2/2 model)")


def test_training_into_a_log_writes_short_plain_lines(data, tmp_path, capsys):
    n = torch.get_num_threads()
    try:
        assert main(["train", "--preset", "tiny", "--context", "32", "--batch-size", "4", "--eval-interval", "2",
                     "--device", "cpu", "--threads", "1", "--data", str(data), "--max-steps", "6",
                     "--out", str(tmp_path / "r"), "--sample-tokens", "0"]) == 0
    finally:
        torch.set_num_threads(n)
    lines = lines_of(capsys.readouterr().err)
    progress = [ln for ln in lines if ln.startswith("qkv train: ")]
    assert progress[0].startswith("qkv train:   0%") and progress[-1].startswith("qkv train: 100%")
    assert "step 6, loss" in progress[-1] and max(map(len, lines)) < 400


@pytest.mark.parametrize("stream", [None, io.StringIO()])
def test_a_stream_that_cannot_say_is_not_a_terminal(stream):
    from qkv.training.progress import is_terminal

    if stream is not None:
        stream.close()
    assert is_terminal(stream) is False


def test_the_training_bar_reads_100_only_when_the_work_is_done():
    """Whole percents rounded down: 199 steps of 200 (99.5 %) read 99 %, not the format's rounded 100 %."""
    from qkv.training.progress import percent_done

    assert [percent_done(k / 200) for k in (0, 1, 199, 200)] == [0.0, 0.0, 99.0, 100.0]
    assert percent_done(0.9999) == 99.0 and percent_done(1.2) == 100.0
    log = io.StringIO()
    with progress_bar(100.0, desc="qkv train", unit="%", file=log, interval=0) as bar:
        bar.update(percent_done(199 / 200) - bar.n)
        shown = log.getvalue().splitlines()[-1]
    assert shown.startswith("qkv train:  99%"), shown
