"""qkv.studies: the PE extrapolation study and the order study, end to end on tiny budgets.

The corpus is a small synthetic text (a few hundred KB of Python-like lines) so that the
test does not depend on the standard library's size; budgets are a few hundred K tokens.
"""
import csv
import json
import math
import re

import pytest
import torch

from qkv.cli import main
from qkv.data import split_by_file, train_tokenizer
from qkv.models import GPT, ModelConfig
from qkv.studies import order, pages, pe
from qkv.viz.text import CJK
from qkv.training.recipe import LN2, eval_starts, evaluate


def _corpus():
    g = torch.Generator().manual_seed(0)
    words = ["def", "return", "self", "x", "y", "for", "in", "range", "if", "else", "print", "(", ")", ":", "=", "+"]
    files = {}
    for f in range(20):
        lines = []
        for _ in range(120):
            idx = torch.randint(len(words), (int(torch.randint(3, 9, (1,), generator=g)),), generator=g)
            lines.append("    " * int(torch.randint(0, 3, (1,), generator=g)) + " ".join(words[i] for i in idx))
        files[f"f{f}.py"] = "\n".join(lines) + "\n"
    return split_by_file(files, source="synthetic", val_fraction=0.25)


TINY = dict(train_len=16, d_model=32, num_heads=2, num_layers=1, max_tokens=8 * 1024, batch_size=8,
            warmup_steps=4, eval_chunks=4, threads=1)  # a fixed thread count: bitwise reproducible


@pytest.fixture(scope="module")
def corpus():
    return _corpus()


@pytest.fixture(scope="module")
def tiny_study(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("pe")
    return pe.run(pe.PEStudyConfig(**TINY), out=out, corpus=corpus, progress=False)


def test_pe_study_writes_every_scheme_length_plot_and_sentences(tiny_study):
    r, out = tiny_study, tiny_study.out
    lengths = [16, 32, 64, 128]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(row["scheme"], int(row["eval_len"])) for row in rows} == {(s, T) for s in pe.DEFAULT_SCHEMES for T in lengths}
    for row in rows:
        if row["scheme"] == "learned" and int(row["eval_len"]) > 16:
            assert row["bpc"] == "n/a"  # no embedding past max_len = L
        else:
            assert 0 < float(row["bpc"]) < 10
    png = (out / "pe.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[16:24] == (800).to_bytes(4, "big") + (304).to_bytes(4, "big")
    md = (out / "results.md").read_text()
    assert "| alibi |" in md and "non-overlapping" in md and "n/a" in md
    assert any("within 10 %" in s or "10 %" in s for s in r.sentences) and any("learned" in s for s in r.sentences)
    with open(out / "positions.csv") as f:
        pos = list(csv.DictReader(f))
    assert sum(1 for p in pos if p["scheme"] == "rope" and p["eval_len"] == "128") == 128
    assert not any(p["scheme"] == "learned" and p["eval_len"] != "16" for p in pos)


def test_pe_sentences_follow_the_numbers():
    rows = []
    for scheme, bpcs in (("alibi", [2.0, 1.9, 1.9, 1.9]), ("sinusoidal", [2.0, 2.1, 3.0, 4.0]),
                         ("learned", [2.1, math.nan, math.nan, math.nan])):
        for T, b in zip([8, 16, 32, 64], bpcs):
            rows.append({"scheme": scheme, "eval_len": T, "bpc": b, "ratio_to_L": b / bpcs[0]})
    text = " ".join(pe.sentences(rows, 8))
    assert "64: alibi" in text and "sinusoidal (+50 % at 32" in text and "n/a beyond L: learned" in text
    assert "| learned | 2.100 | n/a | n/a | n/a | n/a |" in pe.markdown_table(rows, 8)


def test_position_losses_agree_with_train_evaluate(corpus):
    """The study's per-position scorer and train.evaluate give the same mean loss on the same windows."""
    tok = train_tokenizer("char", corpus.train + corpus.val)
    ids = tok.encode_tensor(corpus.val)
    model = GPT(ModelConfig(vocab_size=tok.vocab_size, d_model=32, attention=dict(num_heads=2),
                            position=dict(kind="rope"), num_layers=1, max_len=64)).eval()
    starts = pe.chunk_starts(len(ids), 64, 3)
    per_pos = pe.position_losses(model, ids, starts, 64, 16)  # (16,)
    windows = [s + k for s in starts for k in range(0, 64, 16)]
    nats, n = evaluate(model, ids, 16, windows)
    assert per_pos.shape == (16,)
    assert per_pos.mean().item() == pytest.approx(nats / n, rel=1e-5)
    assert eval_starts(len(ids), 16, None)[:2] == [0, 16]  # evaluate's own tiling is non-overlapping too


def test_pe_same_seed_reproduces_changed_seed_changes(corpus, tiny_study):
    cfg = dict(TINY, schemes=("rope", "learned"))
    again = pe.run(pe.PEStudyConfig(**cfg), corpus=corpus, progress=False)
    for s in ("rope", "learned"):
        assert again.bpc(s, 16) == tiny_study.bpc(s, 16)  # exactly
    assert again.bpc("rope", 128) == tiny_study.bpc("rope", 128)
    other = pe.run(pe.PEStudyConfig(**cfg, seed=7), corpus=corpus, progress=False)
    assert other.bpc("rope", 16) != tiny_study.bpc("rope", 16)


def test_pe_seeds_add_mean_and_std(corpus, tmp_path):
    r = pe.run(pe.PEStudyConfig(**dict(TINY, schemes=("alibi",), seeds=2, max_tokens=2048)), out=tmp_path,
               corpus=corpus, progress=False)
    header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["scheme", "eval_len", "bpc", "bpc_std", "seeds"]
    assert all(row["bpc_std"] > 0 for row in r.rows)
    assert "±" in r.table


def test_pe_bad_input(tmp_path, corpus):
    with pytest.raises(ValueError, match="schemes"):
        pe.PEStudyConfig(schemes=("absolute",))
    with pytest.raises(ValueError, match="seeds"):
        pe.PEStudyConfig(seeds=0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        pe.run(pe.PEStudyConfig(**TINY), out=tmp_path / "file", corpus=corpus, progress=False)
    with pytest.raises(ValueError, match="chunk"):
        pe.chunk_starts(10, 64, 4)


def test_output_folders_are_checked_before_any_training(tmp_path, corpus):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        order.run(order.OrderStudyConfig.quick(), out=tmp_path / "file", progress=False)
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "results.csv").write_text("x")
    with pytest.raises(ValueError, match=r"already holds a study's results \(results.csv\)"):
        pe.run(pe.PEStudyConfig(**TINY), out=tmp_path / "done", corpus=corpus, progress=False, overwrite=False)
    with pytest.raises(ValueError, match=r"already holds a study's results \(results.csv\)"):
        order.run(order.OrderStudyConfig.quick(), out=tmp_path / "done", progress=False, overwrite=False)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["done", "file", "results.csv"]


def test_order_pe_beats_no_pe_and_no_pe_stays_order_blind(tmp_path):
    cfg = order.OrderStudyConfig.quick(schemes=("none", "learned"), tasks="reverse", test_size=512)
    r = order.run(cfg, out=tmp_path, progress=False)
    with open(tmp_path / "results.csv") as f:
        rows = {row["scheme"]: float(row["accuracy"]) for row in csv.DictReader(f) if row["task"] == "reverse"}
    assert set(rows) == {"none", "learned"}
    assert rows["none"] < r.bag_baseline["reverse"] + 0.05  # permutation equivariance: at best a guess from the bag
    assert rows["learned"] > rows["none"] + 0.3
    assert rows["learned"] == pytest.approx(r.accuracy("learned", "reverse"), abs=1e-6)
    assert "| none |" in (tmp_path / "results.md").read_text()


def test_order_targets_and_bag_baseline():
    ids = torch.tensor([[1, 2, 3, 3]])
    assert order.task_targets(ids, "reverse").tolist() == [[3, 3, 2, 1]]
    assert order.task_targets(ids, "shift").tolist() == [[-100, 1, 2, 3]]
    # bag minus self: pos0 {2,3,3}->3 (target 3 ✓), pos1 {1,3,3}->3 ✓, pos2 {1,2,3}->1 (target 2 ✗), pos3 ->1 ✓
    assert order.bag_baseline(ids, order.task_targets(ids, "reverse")) == 0.75
    with pytest.raises(ValueError, match="task"):
        order.OrderStudyConfig(tasks=("sort",))


def test_cli_study_errors_are_one_line(capsys, tmp_path):
    assert main(["study", "pe", "--seeds", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv: error:") and "seeds" in err and err.count("\n") == 1
    assert main(["study", "order", "--task", "sort"]) == 2
    assert main(["study"]) == 2


def test_scale_embeddings_multiplies_token_vectors_by_sqrt_d():
    """ModelConfig.scale_embeddings (added for these studies): x = √C · tok(ids) + PE(pos), Vaswani §3.4."""
    conf = ModelConfig(vocab_size=11, d_model=16, attention=dict(num_heads=2), position=dict(kind="sinusoidal"),
                       num_layers=1)
    plain, scaled = GPT(conf), GPT(conf.replace(embedding={"scale": True}))
    scaled.load_state_dict(plain.state_dict())
    ids = torch.tensor([[1, 5, 7]])
    pos = torch.arange(3)
    want = 4.0 * plain.embed.tok(ids) + plain.embed.pos(pos)
    torch.testing.assert_close(scaled.embed(ids, pos), want)
    torch.testing.assert_close(plain.embed(ids, pos), plain.embed.tok(ids) + plain.embed.pos(pos))
    from qkv.interop.hf import hf_config

    with pytest.raises(ValueError, match="embedding.scale"):
        hf_config(ModelConfig(position=dict(kind="rope"), feed_forward=dict(activation="swiglu"),
                              normalization=dict(kind="rmsnorm"), embedding=dict(scale=True)))


def test_cli_study_pe_quick_end_to_end_on_the_embedded_corpus(capsys, tmp_path):
    """`qkv study pe --quick` on the default corpus, its budget cut to 1024 tokens to keep the test short."""
    docs = tmp_path / "docs"
    docs.mkdir()
    out = tmp_path / "run"
    assert main(["study", "pe", "--quick", "--max-tokens", "1024", "--out", str(out), "--quiet",
                 "--markdown", str(docs)]) == 0
    printed = capsys.readouterr().out
    assert "| sinusoidal |" in printed and "wrote" in printed
    for name in set(pe.OUTPUTS) - {"results.zh.md"}:  # an English run writes results.md only
        assert (out / name).stat().st_size > 0
    results = (out / "results.md").read_text()
    assert "standard library" in results and "at commit" in results
    # the docs page: the same results under the page's headings, citing the command; the figure beside it
    page = (docs / "generated" / "study-pe.md").read_text()
    assert page.startswith("*Generated by `qkv study pe --quick --max-tokens 1024")
    assert "\n### Positional encodings: length extrapolation" in page
    assert results.splitlines()[4] in page  # the table's first row, verbatim
    assert (docs / "study-pe.png").read_bytes() == (out / "pe.png").read_bytes()


def test_cli_study_markdown_folder_is_checked_before_training(capsys, tmp_path):
    assert main(["study", "order", "--quick", "--out", str(tmp_path / "run"), "--markdown",
                 str(tmp_path / "nowhere")]) == 2
    assert "expected the documentation folder" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# ---- the studies in Chinese: --lang zh, and --from-results DIR without training --------------------

NUMBER = re.compile(r"\d+\.\d+|\d+")


def assert_chinese(text):
    """Every line with words is Chinese: table rows hold only scheme names and numbers."""
    for line in filter(None, text.splitlines()):
        if line.startswith("|") and not CJK.search(line):
            assert not re.search(r"[a-z]{3,}\s[a-z]{3,}", line.replace("|", " ").split(" ", 2)[-1]), line
        else:
            assert CJK.search(line), line


def test_pe_results_again_from_summary_in_each_language(tiny_study):
    out = tiny_study.out
    english = (out / "results.md").read_text(encoding="utf-8")
    path, table, said = pe.rerender(out, "en")  # the round trip: summary.json holds everything results.md shows
    assert path == out / "results.md" and path.read_text(encoding="utf-8") == english
    assert table == tiny_study.table and said == tiny_study.sentences
    path, table, said = pe.rerender(out, "zh")
    chinese = path.read_text(encoding="utf-8")
    assert path.name == "results.zh.md" and (out / "results.md").read_text(encoding="utf-8") == english
    assert_chinese(chinese)
    assert NUMBER.findall(table) == NUMBER.findall(tiny_study.table)  # the same numbers, formatted the same
    assert "| learned | " in table and "不适用" in table and len(said) == len(tiny_study.sentences)


def test_order_in_chinese_then_english_from_its_summary(tmp_path, capsys):
    cfg = order.OrderStudyConfig(steps=3, test_size=64, schemes=("none", "learned"), tasks=("reverse",))
    r = order.run(cfg, out=tmp_path, progress=False, lang="zh")
    assert not (tmp_path / "results.md").exists()
    assert_chinese((tmp_path / "results.zh.md").read_text(encoding="utf-8"))
    assert all(CJK.search(s) for s in r.sentences)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["run"]) == {"date", "commit"}
    docs = tmp_path / "docs"
    docs.mkdir()
    assert main(["study", "order", "--from-results", str(tmp_path), "--markdown", str(docs)]) == 0
    printed = capsys.readouterr().out
    assert "| *best order-blind guess* |" in printed and f"wrote {tmp_path / 'results.md'}" in printed
    english = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert english.startswith("# Positional encodings: order") and summary["run"]["date"] in english
    page = (docs / "generated" / "study-order.md").read_text(encoding="utf-8")
    assert page.startswith("*Generated by `qkv study order --from-results") and "### Positional encodings: order" in page
    assert NUMBER.findall(english.split("Encoder:")[0]) == NUMBER.findall(
        (tmp_path / "results.zh.md").read_text(encoding="utf-8").split("编码器：")[0])


def test_cli_study_from_results_writes_the_chinese_page(tiny_study, tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    summary = json.loads((tiny_study.out / "summary.json").read_text())
    del summary["run"]  # a run from before summary.json kept its date: read from its results.md
    (tiny_study.out / "summary.json").write_text(json.dumps(summary))
    assert main(["study", "pe", "--from-results", str(tiny_study.out), "--lang", "zh", "--markdown", str(docs)]) == 0
    printed = capsys.readouterr().out
    assert "| 方案 |" in printed and "已写入" in printed and "wrote" not in printed
    page = (docs / "generated" / "study-pe.zh.md").read_text(encoding="utf-8")
    assert page.startswith("*由 `qkv study pe --from-results") and "\n### 位置编码：长度外推" in page
    date = re.search(r"Run on (\S+) at commit", (tiny_study.out / "results.md").read_text())[1]
    assert f"运行于 {date}，提交 `" in page and not (docs / "generated" / "study-pe.md").exists()
    assert (docs / "study-pe.png").read_bytes() == (tiny_study.out / "pe.png").read_bytes()
    assert main(["study", "pe", "--from-results", str(tmp_path / "none"), "--lang", "zh"]) == 2
    assert "expected a study's output folder holding summary.json" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"lang must be one of \['en', 'zh'\], got 'fr'"):
        pages.say("scheme", "fr")


def test_run_study_checks_language_and_folder_before_the_body_and_fixes_the_threads(tmp_path):
    from dataclasses import dataclass

    from qkv.studies.runner import run_study

    @dataclass
    class Config:
        threads: int | None = None

    calls = []

    def body(cfg, out, *, lang, extra):
        calls.append((cfg.threads, torch.get_num_threads(), out, lang, extra))
        return "result"

    before = torch.get_num_threads()
    assert run_study(body, Config(threads=1), ("a.csv",), out=tmp_path / "o", overwrite=True, lang="zh",
                     extra=5) == "result"
    assert calls == [(1, 1, tmp_path / "o", "zh", 5)] and torch.get_num_threads() == before
    run_study(body, Config(), ("a.csv",), out=None, overwrite=True, lang="en", extra=0)
    assert calls[-1][0] == calls[-1][1] >= 1  # None: the count fixed is the one the body's config holds
    (tmp_path / "o" / "a.csv").write_text("taken")
    with pytest.raises(ValueError, match="already holds"):
        run_study(body, Config(threads=1), ("a.csv",), out=tmp_path / "o", overwrite=False, lang="en", extra=0)
    with pytest.raises(ValueError, match="fr"):
        run_study(body, Config(threads=1), (), out=None, overwrite=True, lang="fr", extra=0)
    assert len(calls) == 2 and torch.get_num_threads() == before


@pytest.mark.parametrize("name, flags, derived", [
    ("pe", ["--schemes", "rope", "alibi", "--max-tokens", "1234"], {"schemes": ("rope", "alibi"), "max_tokens": 1234}),
    ("order", ["--task", "shift"], {"tasks": ("shift",)}),
    ("kv", ["--max-tokens", "1234"], {"max_tokens": 1234}),
    ("context", ["--eval-lens", "1L", "2L", "--no-finetune"], {"eval_factors": (1, 2), "finetune": False}),
    ("moe", [], {}),
])
def test_each_row_of_the_study_table_is_a_subcommand_whose_options_reach_its_config(name, flags, derived):
    from importlib import import_module

    from qkv.cli import build_parser
    from qkv.cli.study import STUDIES, study_config

    study, module = STUDIES[name], import_module(f"qkv.studies.{name}")
    args = build_parser().parse_args(["study", name, "--quick", "--seed", "7", "--device", "cpu", *flags])
    assert (args.out, args.lang, args.quiet) == (f"runs/study-{name}", "en", False)
    cfg, quick = study_config(study, args, module), getattr(module, study.config).quick()
    assert type(cfg) is type(quick) and (cfg.seed, cfg.device) == (7, "cpu")
    for field in {*study.given, *derived}:
        assert getattr(cfg, field) == derived.get(field, getattr(quick, field)), field
    args.quick = False
    assert type(study_config(study, args, module)) is type(quick)


def test_each_language_catalog_has_the_same_sentences_with_the_same_values():
    import string

    def fields(template):
        return sorted(name for _, name, _, _ in string.Formatter().parse(template) if name)

    en, zh = pages.TEXT["en"], pages.TEXT["zh"]
    assert set(en) == set(zh) and len(en) > 50
    assert {k: fields(v) for k, v in en.items()} == {k: fields(v) for k, v in zh.items()}
    assert pages.say("moe.best", "zh", best="dense", bpc=1.5, dense=1.6).startswith("验证 bpc 最低")
