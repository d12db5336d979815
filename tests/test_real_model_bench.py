"""benchmarks.real_model's arithmetic, without the model: the decode rate of the steps alone and the notes."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import real_model  # noqa: E402


def test_the_decode_rate_counts_the_steps_after_the_first_token_over_the_time_they_add():
    # 33 new tokens in 1.2 s, one new token (the prefill and the first) in 0.2 s: 32 steps in 1.0 s
    assert real_model.decode_rate(33, 1.2, 0.2) == 32.0


def test_both_notes_say_how_many_steps_the_decode_rate_counts():
    fields = dict(params=135, new=32, steps=31, prompt=37, repeats=2, mb=538.0)
    for lang, text in real_model.NOTE.items():
        assert "31" in text.format(**fields), lang


def test_a_servers_peak_resident_memory_is_read_from_proc_and_zero_when_it_is_gone():
    import os

    peak = real_model.peak_resident(os.getpid())
    if os.path.exists("/proc/self/status"):
        assert 10 * 2**20 < peak < 2**40
    assert real_model.peak_resident(2**22 + 12345) == 0  # no such process


def test_the_serve_row_names_each_servers_peak_memory():
    for lang in ("en", "zh"):
        assert len(real_model.HEADERS["serve"][lang]) == 10
        assert "MiB" in real_model.HEADERS["serve"][lang][-1]
