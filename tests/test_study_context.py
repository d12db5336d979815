"""qkv.studies.context: RoPE scaling at evaluation time against ALiBi, T5 bias and no PE, on tiny budgets."""
import csv
import json
import math
from dataclasses import replace

import pytest
import torch

from qkv.cli import main
from qkv.data import split_by_file
from qkv.models import GPT
from qkv.nn.positional import RotaryEmbedding
from qkv.nn.rope_scaling import RopeScaling
from qkv.studies import context, pe
from qkv.studies import context_verdicts as verdict_module
from qkv.studies.context_verdicts import verdicts
from qkv.viz.text import CJK


def _corpus():
    g = torch.Generator().manual_seed(0)
    words = ["def", "return", "self", "x", "y", "for", "in", "range", "if", "else", "(", ")", ":", "="]
    files = {}
    for f in range(12):
        lines = []
        for _ in range(100):
            idx = torch.randint(len(words), (int(torch.randint(3, 9, (1,), generator=g)),), generator=g)
            lines.append(" ".join(words[i] for i in idx))
        files[f"f{f}.py"] = "\n".join(lines) + "\n"
    return split_by_file(files, source="synthetic", val_fraction=0.25)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("context")
    cfg = context.ContextStudyConfig.quick(threads=1, eval_factors=(1, 2, 4), finetune=True)
    return context.run(cfg, out=out, corpus=_corpus(), progress=False)


def test_quick_run_writes_every_output_and_its_sentences_follow_its_numbers(quick):
    out = quick.out
    for name in set(context.OUTPUTS) - {"results.zh.md"}:
        assert (out / name).stat().st_size > 0
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    want = {(L, s, f * L) for L in (16, 32) for s in context.ROWS for f in (1, 2, 4)}
    assert {(int(r["train_len"]), r["scheme"], int(r["eval_len"])) for r in rows} == want
    for L in (16, 32):
        mine = [r for r in rows if int(r["train_len"]) == L]
        at_l = [r for r in mine if int(r["eval_len"]) == L]
        best = min(at_l, key=lambda r: float(r["bpc"]))
        said = [s for s in quick.sentences if s.startswith(f"L = {L}: ")]
        assert f"{best['scheme']} is best ({float(best['bpc']):.3f} bpc)" in said[0]
        kept = [s for s in context.ROWS if all(float(r["ratio_to_L"]) <= 1.10 for r in mine if r["scheme"] == s)]
        if kept:
            assert f": {', '.join(kept)} (change at {4 * L}:" in said[1]
        rope = next(r["bpc"] for r in at_l if r["scheme"] == "rope")
        assert all(r["bpc"] == rope for r in at_l if r["scheme"] in context.SCALED)  # scale 1 at L
        tuned = {r["scheme"]: r["bpc"] for r in at_l if r["scheme"] in context.FINETUNED}
        assert len(tuned) == 2 and rope not in tuned.values()  # the fine-tune moved the weights
        for held, tuned_row in context.HELD.items():  # the same weights at s = 4: equal up to 4L, not past it
            got = {int(r["eval_len"]): float(r["bpc"]) for r in mine if r["scheme"] == held}
            want = {int(r["eval_len"]): float(r["bpc"]) for r in mine if r["scheme"] == tuned_row}
            assert got == want  # eval lengths 1L, 2L, 4L here: max(4, f) = 4
    with open(out / "positions.csv") as f:
        pos = [p for p in csv.DictReader(f) if p["train_len"] == "32" and p["scheme"] == "rope+YaRN"]
    assert sum(1 for p in pos if p["eval_len"] == "128") == 128
    assert (out / "context.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "results.md").read_text()
    assert "## Trained at L = 32" in md and "| rope+dynamic NTK |" in md and quick.sentences[0] in md
    assert "Fine-tuned rows" in md and "| rope+YaRN (ft 4L) |" in md


def test_results_again_in_chinese_from_the_summary(quick, tmp_path, capsys):
    summary = json.loads((quick.out / "summary.json").read_text())
    assert summary["config"]["train_lens"] == [16, 32] and len(summary["rows"]) == 2 * 13 * 3
    path, table, said = context.rerender(quick.out, "zh")
    text = path.read_text(encoding="utf-8")
    assert path.name == "results.zh.md" and CJK.search(text) and "## 训练长度 L = 16" in table
    assert len(said) == len(quick.sentences) and all(CJK.search(s) for s in said)
    docs = tmp_path / "docs"
    docs.mkdir()
    assert main(["study", "context", "--from-results", str(quick.out), "--markdown", str(docs)]) == 0
    assert (docs / "study-context.png").read_bytes() == (quick.out / "context.png").read_bytes()
    assert "### Long context" in (docs / "generated" / "study-context.md").read_text()


@pytest.mark.parametrize("scheme", list(context.SCALED))
def test_each_scaling_at_scale_one_changes_nothing(scheme):
    conf = pe.study_model_config("rope", 20, d_model=32, num_heads=2, num_layers=1, max_len=64)
    torch.manual_seed(0)
    model = GPT(conf).eval()
    scaled = context.scaled_model(model, scheme, 1, 16)
    assert scaled.config != model.config or scheme == "rope+NTK"  # NTK at α = 1 keeps the very same base
    ids = torch.randint(20, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(scaled(ids).logits, model(ids).logits, rtol=0, atol=1e-6)
        moved, longer = context.scaled_model(model, scheme, 4, 16), torch.randint(20, (2, 64))
        assert not torch.allclose(moved(longer).logits, model(longer).logits)  # a real factor does change them


@pytest.mark.parametrize("s", [2, 4, 16])
def test_pi_at_factor_s_rotates_position_s_p_as_plain_rope_rotates_p(s):
    plain, pi = RotaryEmbedding(32), RotaryEmbedding(32, scaling=RopeScaling(type="linear", factor=s))
    p = torch.arange(0, 200)
    for got, want in zip(pi.angles(s * p), plain.angles(p)):
        assert torch.equal(got, want)  # exactly: s a power of two


def test_ntk_is_the_base_change_and_dynamic_yarn_carry_the_training_length():
    conf = pe.study_model_config("rope", 20, d_model=32, num_heads=2, num_layers=1, max_len=64)
    d = conf.rope_dim  # 16
    assert context.scaled_config(conf, "rope+NTK", 4, 16).position.base == pytest.approx(10000 * 4 ** (d / (d - 2)))
    dyn = context.scaled_config(conf, "rope+dynamic NTK", 4, 16).position.scaling
    assert (dyn.type, dyn.factor, dyn.original_max_position_embeddings) == ("dynamic", 4, 16)
    assert context.scaled_config(conf, "rope+YaRN", 8, 32).position.scaling.type == "yarn"


def test_bad_options(tmp_path, capsys):
    with pytest.raises(ValueError, match="must be > 0, got 0"):
        context.ContextStudyConfig(eval_factors=(1, 0))
    with pytest.raises(ValueError, match="multiple of L, got 1.5L"):
        context.ContextStudyConfig(eval_factors=(1, 1.5))
    with pytest.raises(ValueError, match="schemes"):
        context.ContextStudyConfig(schemes=("rope+ReRoPE",))
    with pytest.raises(ValueError, match="factor must be > 0"):
        context.scaled_config(pe.study_model_config("rope", 20, d_model=32, num_heads=2, num_layers=1, max_len=64),
                              "rope+PI", -2.0, 16)
    out = tmp_path / "run"
    for argv in (["--eval-lens", "1L", "0L"], ["--eval-lens", "1L", "3.5L"], ["--eval-lens", "1L", "fourL"],
                 ["--schemes", "rope+ReRoPE"], ["--train-lens", "0"], ["--workers", "0"],
                 ["--threads", "0"]):
        assert main(["study", "context", "--quick", "--out", str(out), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("qkv: error:") and err.count("\n") == 1, err
    assert not out.exists()
    assert math.isclose(context.parse_eval_len("16L"), 16)


def test_two_workers_give_the_rows_one_process_gives():
    """Models trained side by side in two spawned processes (one thread each) = one after the other here."""
    cfg = context.ContextStudyConfig.quick(eval_factors=(1, 2), schemes=("rope", "rope+YaRN", "alibi"),
                                           max_tokens=4096)
    alone = context.run(replace(cfg, threads=1), corpus=_corpus(), progress=False)
    pair = context.run(replace(cfg, threads=2, workers=2), corpus=_corpus(), progress=True)  # the bar names each job
    assert (alone.config.workers, pair.config.workers) == (1, 2)
    assert pair.rows == alone.rows and pair.parameters == alone.parameters
    assert {r["scheme"] for r in pair.rows} == {"rope", "rope+YaRN", "alibi", *context.FINETUNED,
                                                *context.HELD}


def _rows(bpc: dict) -> list[dict]:
    """Study rows from {(L, scheme, f): bpc}, ratio_to_L as the study computes it."""
    return [{"train_len": L, "scheme": s, "eval_len": f * L, "bpc": b, "ratio_to_L": b / bpc[(L, s, 1)]}
            for (L, s, f), b in bpc.items()]


def test_verdicts_follow_the_numbers():
    flat = {(L, s, f): 2.0 for L in (64, 256) for s in ("sinusoidal", "alibi") for f in (1, 2, 4)}
    v = verdicts(_rows(flat), seeds=3)
    assert v["sinusoidal"] == {"factor": 2, "ratios": {"64": 1.0, "256": 1.0}, "holds": True}
    assert v["alibi"]["factor"] == 4 and v["alibi"]["holds"] and v["yarn"]["holds"] is None
    v = verdicts(_rows(flat | {(64, "sinusoidal", 2): 2.21}), seeds=3)  # +10.5 % at 2L for one L: fails
    assert v["sinusoidal"]["holds"] is False and v["sinusoidal"]["ratios"]["64"] == pytest.approx(1.105)
    scaled = {(64, s, f): 2.0 + f / 10 for s in (*verdict_module.UNTUNED_SCALINGS, "rope+PI (ft 4L)") for f in (1, 2, 4)}
    yarn = {(64, "rope+YaRN", f): 2.0 + f / 20 for f in (1, 2, 4)} | {(64, "rope+YaRN (ft 4L)", f): 1.9 for f in (1, 2, 4)}
    got = verdicts(_rows(scaled | yarn), seeds=1)["yarn"]
    assert got == {"untuned": (2, 2), "finetuned": (2, 2), "holds": True}
    yarn[(64, "rope+YaRN", 4)] = 2.45  # above PI's 2.4 at 4L
    assert verdicts(_rows(scaled | yarn), seeds=1)["yarn"] == {"untuned": (1, 2), "finetuned": (2, 2), "holds": False}


def test_the_published_anchors_and_the_orders_compared():
    assert verdict_module.loss_ratio(43.54, 20.05) == pytest.approx(math.log(43.54) / math.log(20.05))
    as_press = {(64, s, f): 2.0 * (1 + k * (f - 1) / 10) for k, s in enumerate(("alibi", "t5", "rope", "sinusoidal"))
                for f in (1, 2, 4)}
    text = "\n".join(verdict_module.press_text(_rows(as_press), "en"))
    assert "| sinusoidal | 1.259 | 1.630 | 1.300 | 1.900 |" in text and "The orders agree." in text
    swapped = as_press | {(64, "t5", 2): 2.8, (64, "t5", 4): 3.9}  # t5 now worse than rope and sinusoidal at 4L
    assert "They differ where Press et al. have t5 < rope, t5 < sinusoidal (qkv the reverse)." in \
        verdict_module.press_order(_rows(swapped), "en")


def test_the_advice_names_the_best_rows():
    bpc = {(L, s, f): b + f / 100 for L in (64, 256) for s, b in
           (("alibi", 2.5), ("rope+NTK", 2.4), ("rope+YaRN (ft 4L)", 2.3)) for f in (1, 4, 16)}
    bpc[(64, "rope+NTK", 16)] = bpc[(256, "rope+NTK", 16)] = 3.0
    bpc[(64, "rope+YaRN (ft 4L)", 16)] = bpc[(256, "rope+YaRN (ft 4L)", 16)] = 2.9
    four, sixteen = verdict_module.advice(_rows(bpc), "en")
    assert "without a fine-tune, rope+NTK (2.440 bpc at L = 64, 2.440 at L = 256); with a fine-tune at 4L, " \
           "rope+YaRN (ft 4L)" in four
    assert "without a fine-tune, alibi" in sixteen and "the same: no fine-tuned row does better" in sixteen
    assert all(CJK.search(s) for s in verdict_module.advice(_rows(bpc), "zh"))


def test_verify_rows_read_the_study(quick, tmp_path, monkeypatch):
    from qkv import claims

    names = ["sinusoidal-extrapolates", "alibi-extrapolates", "yarn-beats-pi-ntk"]
    (tmp_path / "runs" / "study-context").mkdir(parents=True)
    (tmp_path / "runs" / "study-context" / "summary.json").write_text((quick.out / "summary.json").read_text())
    monkeypatch.chdir(tmp_path)
    rows = claims.run_claims(names, unmeasurable=True)
    v = json.loads((quick.out / "summary.json").read_text())["verdict"]
    assert [r.name for r in rows] == names and all(r.holds is None for r in rows)
    sin = rows[0]
    assert sin.measured == v["sinusoidal"] and "measured that it" in sin.summary
    assert f"{v['sinusoidal']['ratios']['16']:.3f} (L = 16)" in sin.summary and "（L = 16）" in sin.summary_zh
    won, of = v["yarn"]["untuned"]
    assert f"at {won} of {of} lengths past L" in rows[2].summary and "### Which to pick" in \
        (quick.out / "results.md").read_text()
