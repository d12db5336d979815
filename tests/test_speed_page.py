"""benchmarks.report: the speed page and the README's speed table are written from a run's own output (no
number typed by hand), in both languages, with the date, commit, machine and command."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks is a package beside src/, run as python -m benchmarks

from benchmarks import report  # noqa: E402

GENERATION = """roofline: 46.0 GB/s -> 498 tok/s
| batch | qkv auto tok/s | qkv compiled tok/s | inductor tok/s | qkv eager tok/s | HF tok/s | auto / HF | compiled / HF | inductor / HF | eager / HF | of roofline (auto / compiled / inductor / eager) | auto / no cache |
|---|---|---|---|---|---|---|---|---|---|---|---|
| 1 | 236 | 448 | 265 | 120 | 108 | 2.18x | 4.13x | 2.45x | 1.11x | 0.55 / 0.86 / 0.67 / 0.30 | 9.0x |
| 8 | 851 | 981 | - | - | 489 | 1.74x | 2.01x | - | - | - | - |
prompt 16, 128 new tokens"""
MARIAN = """| sentences | source len | beams | max new | qkv s | HF s | HF / qkv | qkv CPU s | HF CPU s |
|---|---|---|---|---|---|---|---|---|
| 8 | 12 | 4 | 40 | 1.10 | 2.20 | 2.00x | 2.1 | 4.3 |"""


def test_tables_are_read_by_their_headers():
    tables = report.parse_tables(GENERATION)
    assert len(tables) == 1 and tables[0][0]["qkv compiled tok/s"] == "448" and tables[0][1]["batch"] == "8"


def test_the_summary_takes_batch_one_and_each_section_present():
    rows = report.summary_rows({"generation": GENERATION, "marian": MARIAN}, "en")
    assert rows == [["greedy decoding, batch 1, tokens/s", "auto 236, fused 448", "HF generate 108", "2.18x, 4.13x"],
                    ["beam search 4, 8 sentences, s", "1.10", "HF MarianMTModel 2.20", "2.00x"]]
    assert report.summary_rows({}, "zh") == []


TRAIN = """| shape | params | batch | qkv tok/s | HF tok/s | qkv / HF | MFU qkv / HF |
|---|---|---|---|---|---|---|
| demo-size | 0.84 M | 32x128 | 18739 | 14708 | 1.27x | 50.1% / 39.3% |

| contender | tok/s | vs nanoGPT eager | of matmul peak | measured as |
|---|---|---|---|---|
| qkv eager | 17161 | 0.93x | 35.6% | median of 21 interleaved steps |
| nanoGPT eager | 18381 | 1.00x | 38.1% | median of 21 interleaved steps |
| qkv + speed layer + bf16 eager | 22191 | 1.21x | 46.0% | median of 21 interleaved steps |
| qkv + speed layer compiled + fused AdamW + bf16 | 28628 | 1.56x | 59.4% | 2517 steps in 180 s |"""


def test_the_summary_shows_qkvs_fastest_training_beside_nanogpt_where_the_run_had_it():
    rows = report.summary_rows({"train_speed": TRAIN}, "en")
    assert rows[1:] == [["training, demo shape, bf16 eager, tokens/s", "22191", "nanoGPT eager 18381", "1.21x"],
                        ["training, demo shape, bf16 compiled (compile counted), tokens/s", "28628",
                         "nanoGPT eager 18381", "1.56x"]]
    without = TRAIN.replace("vs nanoGPT eager", "vs HF eager").replace("nanoGPT eager |", "HF eager |")
    assert len(report.summary_rows({"train_speed": without}, "zh")) == 1  # no nanoGPT: the qkv / HF row alone


@pytest.mark.parametrize("lang, title", [("en", "# Speed"), ("zh", "# 速度")])
def test_the_page_says_when_where_and_how_and_keeps_the_output(lang, title):
    text = report.page(lang, {"generation": GENERATION}, "python -m benchmarks --quick", "a test machine")
    assert text.startswith(title) and "python -m benchmarks --quick" in text and "a test machine" in text
    assert "| 1 | 236 | 448 |" in text and "- roofline: 46.0 GB/s -> 498 tok/s" in text
    assert text.count(report.TEXT[lang]["missing"]) == len(report.SECTIONS) - 1  # the sections not run say so


def test_the_readme_table_is_replaced_between_its_markers_only(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{report.MARKERS[0]}\nold table\n{report.MARKERS[1]}\nafter\n")
    assert report.update_readme(readme, "NEW")
    assert readme.read_text() == f"# x\n\nbefore\n{report.MARKERS[0]}\nNEW\n{report.MARKERS[1]}\nafter\n"
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    assert not report.update_readme(plain, "NEW") and plain.read_text() == "no markers\n"


def test_both_readmes_hold_the_markers():
    for path in report.README.values():
        text = path.read_text(encoding="utf-8")
        assert text.count(report.MARKERS[0]) == 1 and text.count(report.MARKERS[1]) == 1, path


def test_the_prose_holds_no_figure():
    """What each section measures is said without numbers: the numbers are the run's."""
    import re

    prose = " ".join(t for texts in report.SECTIONS.values() for t in texts)
    assert not re.search(r"\d+(\.\d+)?\s*(x|×|%|ms|s\b|GB/s|tok/s)", prose)


def test_a_saved_log_gives_each_section_its_output():
    log = ("\n## generation\n\n" + GENERATION + "\n[transformers] a warning\n(generation: 64 s)\n"
           "\n## marian\n\n" + MARIAN + "\n(marian: 3 s)\n")
    outputs = report.outputs_from_log(log)
    assert outputs == {"generation": GENERATION, "marian": MARIAN}


def test_a_table_after_a_line_of_text_gets_its_blank_line():
    md = report.section_markdown("a line\n| a | b |\n|---|---|\n| 1 | 2 |\nafter")
    assert md == "- a line\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n- after"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_partial_run_keeps_the_other_sections_with_their_own_stamps(lang, tmp_path, monkeypatch):
    readmes = {"en": tmp_path / "R.md", "zh": tmp_path / "R.zh.md"}
    for path in readmes.values():
        path.write_text("no markers\n")
    monkeypatch.setattr(report, "README", readmes)
    name = "speed.md" if lang == "en" else "speed.zh.md"
    (tmp_path / name).write_text(report.page(lang, {"generation": GENERATION, "marian": MARIAN}, "cmd", "machine A"))
    report.write(tmp_path, {"marian": MARIAN.replace("1.10", "9.99")}, "python -m benchmarks --only marian", "B")
    text = (tmp_path / name).read_text()
    assert "| 1 | 236 | 448 |" in text and "machine A" in text  # generation kept with its own stamp
    assert "9.99" in text and "| 1.10 |" not in text and ("Machine: B." in text or "机器：B。" in text)
    assert text.count(report.TEXT[lang]["missing"]) == len(report.SECTIONS) - 2


def test_a_page_of_one_run_gives_its_stamp_to_each_kept_section():
    title = report.SECTIONS["marian"][0]
    old = (f"# Speed\n\nGenerated by `python -m benchmarks` on 2026-12-02 at commit `abc`. Machine: old.\n\n"
           f"## {title}\n\nwhat it measures\n\n{MARIAN}\n")
    kept = report.kept_sections(old, "en")
    assert list(kept) == ["marian"] and kept["marian"].startswith("Measured by `python -m benchmarks` on 2026-12-02")
    assert MARIAN in kept["marian"]


def test_the_commit_is_read_once_before_any_page_is_written(tmp_path, monkeypatch):
    readmes = {"en": tmp_path / "R.md", "zh": tmp_path / "R.zh.md"}
    for path in readmes.values():
        path.write_text(f"{report.MARKERS[0]}\n{report.MARKERS[1]}\n")
    monkeypatch.setattr(report, "README", readmes)
    answers = iter(["abc1234"] + ["abc1234+changes"] * 10)  # what git says once the first page is written
    monkeypatch.setattr(report, "source_commit", lambda: next(answers))
    report.write(tmp_path, {"marian": MARIAN}, "python -m benchmarks --only marian", "B")
    for path in [tmp_path / "speed.md", tmp_path / "speed.zh.md", *readmes.values()]:
        assert "abc1234`" in path.read_text() and "+changes" not in path.read_text(), path


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_notes_close_the_page_once_and_are_not_kept_as_a_sections_output(lang):
    text = report.page(lang, {"open_models": "| a | b |\n|---|---|\n| 1 | 2 |"}, "cmd", "machine")
    again = report.page(lang, {}, "cmd", "machine", kept=report.kept_sections(text, lang))
    title, prose = report.NOTES[lang][-1]
    gpu_title, gpu_prose = report.GPU_NOTES[lang]
    real_title, real_prose = report.REAL_NOTES[lang]
    assert text.endswith(f"## {title}\n\n{prose}\n\n## {gpu_title}\n\n{gpu_prose}\n\n## {real_title}\n\n{real_prose}\n")
    assert len(report.NOTES[lang]) == 2
    # int8, MoE, the GPU's backend, then a real checkpoint against llama.cpp
    for title, prose in [*report.NOTES[lang], report.GPU_NOTES[lang], report.REAL_NOTES[lang]]:
        assert text.count(f"## {title}\n\n{prose}\n") == 1
        assert title not in report.kept_sections(text, lang)["open_models"]
        assert again.count(f"## {title}") == 1 and "| 1 | 2 |" in again
