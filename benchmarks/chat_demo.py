"""The chat fine-tuning demo, with no download: supervised fine-tuning on the catalogs' conversations, then DPO on
their preference pairs, each measured before and after on held-out data.

    python -m benchmarks.chat_demo                        # SFT 10 minutes, DPO 5 (the defaults' budgets)
    python -m benchmarks.chat_demo --sft-minutes 2 --dpo-minutes 1 --markdown docs

Steps, each ``qkv train`` as a user runs it: ``--task sft --max-steps 0`` (the starting model), ``--task sft``
(from scratch, ChatML), ``qkv export`` of that run, ``--task dpo --init-from-hf`` the export with
``--max-steps 0`` (the policy is its reference: ln 2) and then trained. ``--markdown DOCS`` writes
DOCS/generated/chat-demo.md (.zh.md, .json) and DOCS/chat-demo.png (both runs' validation curves).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


def qkv(*argv: str) -> None:
    env = os.environ | {"PYTHONPATH": str(CHECKOUT / "src")}
    subprocess.run([sys.executable, "-m", "qkv", *argv], check=True, env=env, cwd=CHECKOUT,
                   stdout=subprocess.DEVNULL)


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def run_all(work: Path, sft_minutes: float, dpo_minutes: float) -> dict:
    quiet = ["--quiet", "--sample-tokens", "0"]
    qkv("train", "--task", "sft", "--max-steps", "0", "--eval-generate", "64", "--out", str(work / "sft-start"), *quiet)
    qkv("train", "--task", "sft", "--max-minutes", str(sft_minutes), "--eval-generate", "64", "--out", str(work / "sft"),
        *quiet)
    qkv("export", "--run", str(work / "sft"), "--hf", str(work / "sft-hf"))
    base = ["--task", "dpo", "--init-from-hf", str(work / "sft-hf")]
    qkv("train", *base, "--max-steps", "0", "--out", str(work / "dpo-start"), *quiet)
    qkv("train", *base, "--max-minutes", str(dpo_minutes), "--out", str(work / "dpo"), *quiet)
    return {name: {"summary": summary(work / name), "metrics": metrics(work / name)}
            for name in ("sft-start", "sft", "dpo-start", "dpo")}


def packing_rates(work: Path, seconds: float) -> dict:
    """Training tokens per second (padding not counted) of the default SFT run without and with --packing, one
    after the other for ``seconds`` each."""
    rates = {}
    for name, flags in (("padded", []), ("packed", ["--packing"])):
        out = work / f"sft-{name}"
        qkv("train", "--task", "sft", "--max-minutes", str(seconds / 60), "--out", str(out), "--quiet",
            "--sample-tokens", "0", *flags)
        rates[name] = summary(out)["tokens_per_s"]
    return rates


ROWS = (("sft-start", "SFT: the starting model"), ("sft", "SFT: after training"),
        ("dpo-start", "DPO: the SFT model (policy = reference)"), ("dpo", "DPO: after training"))
ROWS_ZH = {"sft-start": "SFT：起始模型", "sft": "SFT：训练之后", "dpo-start": "DPO：SFT 模型（策略 = 参考）",
           "dpo": "DPO：训练之后"}


def packing_line(saved: dict, lang: str) -> str:
    p = saved.get("packing")
    if not p:
        return ""
    same = " (the same run)" if lang == "en" else "（同一次运行）"
    ratio, when = p["packed"] / p["padded"], (", " + p["stamp"]) if p.get("stamp") else same
    return (f"\n\nSFT training tokens per second (padding not counted){when}: padded rows "
            f"{p['padded']:.0f}, packed ({'--packing'}) {p['packed']:.0f}: {ratio:.2f} ×." if lang == "en" else
            f"\n\nSFT 每秒训练的 token 数（不计填充）{when}：填充的行 {p['padded']:.0f}，打包"
            f"（--packing）{p['packed']:.0f}：{ratio:.2f} 倍。")


def table(saved: dict, lang: str) -> str:
    from .common import table as markdown

    rows = []
    for name, label in ROWS:
        s = saved["runs"][name]["summary"]
        label = ROWS_ZH[name] if lang == "zh" else label
        if name.startswith("sft"):
            rows.append([label, s["steps"], f"{s['val_loss']:.3f}", f"{s['val_exact_match']:.1f} %",
                         f"{s['val_chrf']:.1f}", ""])
        else:
            rows.append([label, s["steps"], f"{s['val_loss']:.4f}", "", "",
                         f"{100 * s['val_reward_accuracy']:.1f} % / {s['val_reward_margin']:.3f}"])
    header = (["run", "steps", "val loss", "exact match", "chrF", "reward accuracy / margin"] if lang == "en" else
              ["运行", "步数", "验证损失", "完全匹配", "chrF", "奖励准确率 / 差距"])
    return markdown(rows, header)


def plot(saved: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="tight")
    a, b = fig.subplots(1, 2)
    sft, dpo = saved["runs"]["sft"]["metrics"], saved["runs"]["dpo"]["metrics"]
    a.plot([m["step"] for m in sft], [m["val_loss"] for m in sft])
    a.set(xlabel="step", ylabel="nats per answer token", title="SFT: held-out loss")
    b.plot([m["step"] for m in dpo], [100 * m["val_reward_accuracy"] for m in dpo])
    b.set(xlabel="step", ylabel="%", title="DPO: held-out reward accuracy")
    fig.savefig(path, dpi=100)


def write_pages(saved: dict, docs: Path) -> None:
    from .common import write_generated

    write_generated(docs, "chat-demo", saved, lambda lang: table(saved, lang) + packing_line(saved, lang))
    plot(saved, docs / "chat-demo.png")


def main(argv=None) -> str:
    from qkv.runtime import machine, source_commit

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sft-minutes", type=float, default=10.0)
    p.add_argument("--dpo-minutes", type=float, default=5.0)
    p.add_argument("--packing-seconds", type=float, default=60.0, help="each packing run's budget (0: none)")
    p.add_argument("--only-packing", action="store_true", help="measure packing alone, into the saved --from-json")
    p.add_argument("--markdown", metavar="DOCS", default=None)
    p.add_argument("--from-json", metavar="FILE", default=None)
    args = p.parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        if args.only_packing:
            with tempfile.TemporaryDirectory(prefix="qkv-chat-demo-") as work:
                saved["packing"] = packing_rates(Path(work), args.packing_seconds) | {
                    "stamp": f"{time.strftime('%Y-%m-%d')}, commit {source_commit()}, {args.packing_seconds:g} s each"}
    else:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="qkv-chat-demo-") as work:
            runs = run_all(Path(work), args.sft_minutes, args.dpo_minutes)
            packing = packing_rates(Path(work), args.packing_seconds) if args.packing_seconds else None
        saved = {"stamp": f"{time.strftime('%Y-%m-%d')}, commit {source_commit()}, {machine()}, "
                          f"{(time.perf_counter() - t0) / 60:.1f} min in all",
                 "command": "python -m benchmarks.chat_demo " + " ".join(sys.argv[1:] if argv is None else argv),
                 "runs": runs, "packing": packing}
    if args.markdown:
        write_pages(saved, Path(args.markdown))
    text = table(saved, "en")
    print(text)
    return text


if __name__ == "__main__":
    main()
