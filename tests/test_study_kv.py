"""qkv study kv: MHA, GQA, MQA and MLA on a tiny budget, end to end; the cache arithmetic against real caches;
the sentences against the numbers; bad options."""
import csv
import json
import math
import re

import pytest
import torch

from qkv.cli import main
from qkv.generation.timing import decode_step_seconds, fill_random
from qkv.models import GPT
from qkv.nn.kv_cache import KVCache
from qkv.studies import kv
from test_studies import _corpus

TINY = dict(threads=1)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("kv")
    return kv.run(kv.KVStudyConfig.quick(**TINY), out=out, corpus=_corpus(), progress=False)


def test_cache_arithmetic_matches_the_caches_buffers():
    cfg = kv.KVStudyConfig()  # d_model 128, 4 heads of D = 32: d_c = 64, d_R = 16
    want = {"mha": 2 * 4 * 32, "gqa": 2 * 2 * 32, "mqa": 2 * 32, "mla": 64 + 16, "mla-naive": 4 * (16 + 16 + 32)}
    for path, numbers in want.items():
        config = cfg.model_config(path.split("-")[0], 50).replace(max_len=64)
        assert kv.cache_numbers(config, path) == numbers
        caches = kv.decode_caches(GPT(config), path, 10)  # 11 slots per layer
        per_layer = sum(b.numel() for b in caches[0].buffers()) / 11
        assert per_layer == numbers and len(caches) == cfg.num_layers and caches[0].pos == 10


def test_widths_match_the_parameter_counts():
    cfg = kv.KVStudyConfig()
    widths = kv.matched_widths(cfg, 50)
    counts = {v: kv.parameters(cfg.model_config(v, 50, widths[v])) for v in kv.VARIANTS}
    assert widths["mha"] == 512 and widths["gqa"] > 512 and widths["mqa"] > widths["gqa"]
    assert max(counts.values()) - min(counts.values()) <= 2 * 128 * cfg.num_layers  # within one d_ff step


def test_quick_run_writes_every_output_and_its_sentences_follow_its_numbers(quick):
    out = quick.out
    for name in set(kv.OUTPUTS) - {"results.zh.md"}:
        assert (out / name).stat().st_size > 0
    with open(out / "results.csv") as f:
        rows = {r["path"]: r for r in csv.DictReader(f)}
    assert list(rows) == list(kv.PATHS)
    assert rows["mla-naive"]["bpc"] == rows["mla"]["bpc"]  # one model, two caches
    assert all(float(rows[p][f"tok_s_{S}"]) > 0 for p in kv.PATHS for S in kv.CONTEXTS)
    v = quick.verdict
    assert v["reduction"] == pytest.approx(1 - int(rows["mla"]["cache_numbers"]) / int(rows["mha"]["cache_numbers"]))
    assert v["holds"] == (v["reduction"] >= 0.9 and v["bpc_mla"] <= v["bpc_mha"])
    said = " ".join(quick.sentences)
    assert ("does not hold at this scale" in said) == (not v["holds"])
    assert (f"{100 * v['reduction']:.1f} % smaller" in said) and f"{v['bpc_mla']:.3f}" in said
    assert not v["cache_small"] and "the cache is" in said  # d_c + d_R = 20 of 64: 69 % smaller, not 90 %
    md = (out / "results.md").read_text()
    assert "| MLA (naive) |" in md and quick.table in md and "Wall time" in md
    assert (out / "kv.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == json.loads(json.dumps(v)) and len(summary["bpcs"]["mla"]) == 2


def test_verdict_reads_the_numbers():
    def rows(mla_bpc, mla_numbers, std=0.01):
        base = {"bpc_std": std, "seeds": 2}
        return [dict(base, path="mha", bpc=2.0, cache_numbers=256), dict(base, path="mla", bpc=mla_bpc,
                                                                         cache_numbers=mla_numbers)]

    assert kv.verdict(rows(1.99, 20), 4)["holds"]
    worse = kv.verdict(rows(2.005, 20), 4)
    assert not worse["holds"] and worse["cache_small"] and not worse["beyond_noise"]
    assert "within seed noise" in kv.verdict_sentence(worse, "en")
    big = kv.verdict(rows(1.9, 80), 4)
    assert not big["holds"] and big["as_good"] and "68.8 % smaller, not 90 %" in kv.verdict_sentence(big, "en")
    assert math.isclose(big["deepseek_reduction"], 1 - 2.25 / 4)


def test_results_again_in_chinese(quick):
    path, table, said = kv.rerender(quick.out, "zh")
    assert path.name == "results.zh.md" and "MLA（吸收）" in table and len(said) == len(quick.sentences)
    numbers = re.compile(r"\d+\.\d+")
    assert numbers.findall(table) == numbers.findall(quick.table)


def test_decode_step_seconds_rewinds_and_checks():
    c = fill_random(KVCache(1, 2, 9, 4), 8)
    seen = []
    t = decode_step_seconds({"a": (lambda: seen.append(c.pos), [c])}, 5, repeats=2, inner=3, warmup=1)
    assert set(seen) == {5} and len(seen) == 9 and t["a"] >= 0
    with pytest.raises(ValueError, match="cannot hold"):
        fill_random(KVCache(1, 2, 4, 4), 5)
    with pytest.raises(ValueError, match="repeats"):
        decode_step_seconds({"a": (lambda: None, [c])}, 5, repeats=0)


def test_cli_quick_and_bad_options(capsys, tmp_path):
    data = tmp_path / "text.py"
    data.write_text("".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(3000)))
    docs = tmp_path / "docs"
    docs.mkdir()
    assert main(["study", "kv", "--quick", "--max-tokens", "2048", "--data", str(data), "--out",
                 str(tmp_path / "run"), "--quiet", "--markdown", str(docs)]) == 0
    printed = capsys.readouterr().out
    assert "| MHA |" in printed and "wrote" in printed and "min" in printed
    assert (docs / "generated" / "study-kv.md").read_text().startswith("*Generated by `qkv study kv --quick")
    assert (docs / "study-kv.png").is_file()
    for argv, word in ((["--seeds", "0"], "seeds"), (["--max-tokens", "-1"], "max_tokens")):
        assert main(["study", "kv", *argv, "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("qkv: error:") and word in err and err.count("\n") == 1
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="gqa_groups"):
        kv.KVStudyConfig(gqa_groups=3)


def test_verify_row_reads_the_study(quick, tmp_path, monkeypatch):
    from qkv import claims
    from qkv.claims.registry import study_summary

    (row,) = claims.run_claims(["mla-kv-cache"])
    assert row.holds is None and row.section == "Q4"
    if study_summary("kv") is None:  # not run here: the row says how
        assert "run `qkv study kv`" in row.summary and "qkv study kv" in row.summary_zh
    (tmp_path / "runs" / "study-kv").mkdir(parents=True)
    (tmp_path / "runs" / "study-kv" / "summary.json").write_text((quick.out / "summary.json").read_text())
    monkeypatch.chdir(tmp_path)
    (row,) = claims.run_claims(["mla-kv-cache"])
    v = quick.verdict
    assert row.holds is None and row.measured["reduction"] == pytest.approx(v["reduction"])
    assert "does not hold at this scale" in row.summary and f"{100 * v['reduction']:.1f} % smaller" in row.summary
    assert "不成立" in row.summary_zh and f"{v['bpc_mla']:.3f}" in row.summary_zh
