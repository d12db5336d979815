"""The demo's levers side by side: train the demo recipe for the same wall-clock budget with each variant and
print held-out bits per character beside gzip -9 and xz -9e.

    python -m benchmarks.demo_levers --minutes 3                          # every variant
    python -m benchmarks.demo_levers --minutes 3 --variant baseline --variant adamw+cosine
    python -m benchmarks.demo_levers --minutes 3 --jobs 2 --markdown docs # two at a time, one core each; a page
    python -m benchmarks.demo_levers --list                               # the variants and what each sets

Each run is ``qkv train --max-minutes M`` with the variant's settings (``train_speed.bpc_run``: nothing
written); ``a+b`` combines variants. ``--jobs N`` trains N variants at a time, each in its own process pinned to
its own core on one thread (a variant that asks for more threads runs alone afterwards), so the variants of a
batch see the same machine; with one job they run one after the other on the threads qkv chooses.
``--markdown DOCS`` writes DOCS/generated/demo-levers.md and .zh.md: the table with the date, commit, machine
and command.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import qkv
from qkv.fileio import atomic_text
from qkv.runtime import machine, source_commit
from qkv.training.tasks import task_type

from .common import table
from .train_speed import bpc_run


def demo_model(**flat) -> dict:
    """Settings that train another model shape on the demo's own tokenizer (a given model would otherwise
    train on characters)."""
    kind, vocab = task_type("lm").defaults.tokenizer_for("demo")
    return {"model": qkv.ModelConfig.preset("demo", **flat), "tokenizer": kind, "vocab_size": vocab}


def demo_sections(**sections) -> dict:
    """``demo_model`` with fields of the demo's config sections replaced: ``attention={"qk_norm": True}``."""
    demo = qkv.ModelConfig.preset("demo")
    changed = {name: dataclasses.replace(getattr(demo, name), **fields) for name, fields in sections.items()}
    return demo_model() | {"model": demo.replace(**changed)}


LR = task_type("lm").defaults.lr  # the demo's peak learning rate
VARIANTS = {  # name -> (what it changes, in English and Chinese; TrainConfig settings, None: a model_variant)
    "baseline": ("the default recipe (Muon + warmup-stable-decay; bf16 where the CPU has it)",
                 "默认配方（Muon + warmup-stable-decay；CPU 支持时用 bf16）", {}),
    "muon": ("Muon for the hidden matrices, AdamW for the rest", "隐藏层矩阵用 Muon，其余用 AdamW",
             {"optimizer": "muon"}),
    "adamw": ("AdamW for every weight", "所有权重都用 AdamW", {"optimizer": "adamw"}),
    "muon-lr2x": ("Muon at twice the peak learning rate, AdamW's unchanged", "Muon 的峰值学习率加倍，AdamW 的不变",
                  {"optimizer": "muon", "muon_lr": 2 * LR}),
    "wsd": ("warmup-stable-decay schedule", "warmup-stable-decay 调度", {"schedule": "wsd"}),
    "cosine": ("warmup then cosine decay", "预热后余弦衰减", {"schedule": "cosine"}),
    "lr-half": ("half the peak learning rate", "峰值学习率减半", {"lr": LR / 2}),
    "lr-2x": ("twice the peak learning rate", "峰值学习率加倍", {"lr": 2 * LR}),
    "threads1": ("one CPU thread", "一个 CPU 线程", {"threads": 1}),
    "threads2": ("two CPU threads", "两个 CPU 线程", {"threads": 2}),
    "compile": ("torch.compile'd model (the compile counted)", "torch.compile 编译模型（计入编译时间）",
                {"compile": True}),
    "fused-adamw": ("AdamW's fused CPU kernel", "AdamW 的融合 CPU kernel", {"fused_adamw": True}),
    "bf16": ("bfloat16 autocast", "bfloat16 自动混合精度", {"bf16": True}),
    "fp32": ("fp32 throughout (no bf16 autocast)", "全程 fp32（不用 bf16 自动混合精度）", {"bf16": False}),
    "reference": ("the reference modules, without the speed layer's training path",
                  "参考模块，不走速度层的训练路径", {"speed_layer": False}),
    "batch8": ("8 sequences per step", "每步 8 个序列", {"batch_size": 8}),
    "batch32": ("32 sequences per step", "每步 32 个序列", {"batch_size": 32}),
    "vocab1024": ("BPE vocabulary 1024", "BPE 词表 1024", {"vocab_size": 1024}),
    "vocab4096": ("BPE vocabulary 4096", "BPE 词表 4096", {"vocab_size": 4096}),
    "wide": ("d_model 128, 2 layers", "d_model 128，2 层", None),
    "deep": ("d_model 64, 8 layers", "d_model 64，8 层", None),
    "untied": ("output head apart from the embedding", "输出头与嵌入不共享权重", None),
    "qk-norm": ("RMS-normed queries and keys", "对 query 和 key 做 RMS 归一化", None),
}


def settings(name: str) -> dict:
    """The TrainConfig settings of variant ``name`` (``a+b``: both); SystemExit naming the known ones."""
    merged: dict = {}
    for part in name.split("+"):
        if part not in VARIANTS:
            raise SystemExit(f"unknown variant {part!r}; choose from {', '.join(VARIANTS)} (a+b combines)")
        merged |= VARIANTS[part][2] if VARIANTS[part][2] is not None else model_variant(part)
    return merged


def describe(name: str, lang: str = "en") -> str:
    """What variant ``name`` changes, in ``lang`` (en or zh); the parts of ``a+b`` joined."""
    return " + ".join(VARIANTS[part][0 if lang == "en" else 1] for part in name.split("+"))


def model_variant(name: str) -> dict:
    """The settings of a variant that changes the model (built when asked for)."""
    return {"wide": lambda: demo_model(d_model=128, num_layers=2),
            "deep": lambda: demo_model(d_model=64, num_layers=8),
            "untied": lambda: demo_sections(head={"tie": False}),
            "qk-norm": lambda: demo_sections(attention={"qk_norm": True})}[name]()


def run_variant(name: str, minutes: float, seed: int, threads: int | None = None) -> dict:
    """Train variant ``name`` for ``minutes``; the run's summary with the variant's name."""
    plan = settings(name)
    if threads and "threads" not in plan:
        plan["threads"] = threads
    return {"variant": name} | bpc_run(minutes, seed=seed, **plan)


def pin_to_core(cores) -> None:
    """A worker's initializer: run on the next core of the queue ``cores`` only."""
    os.sched_setaffinity(0, {cores.get()})


def run_all(names: list[str], minutes: float, seed: int, jobs: int) -> list[dict]:
    """Each variant's summary, in ``names``' order: ``jobs`` at a time on a core each, or one after the other."""
    alone = [n for n in names if jobs == 1 or (settings(n).get("threads") or 1) > 1]
    pooled = [n for n in names if n not in alone]
    done: dict[str, dict] = {}
    if pooled:
        ctx = multiprocessing.get_context("spawn")
        cores = ctx.Queue()
        for core in sorted(os.sched_getaffinity(0))[:jobs]:
            cores.put(core)
        with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=pin_to_core, initargs=(cores,)) as pool:
            for i, s in enumerate(pool.map(run_variant, pooled, [minutes] * len(pooled), [seed] * len(pooled),
                                           [1] * len(pooled))):
                done[s["variant"]] = s | {"batch": i // jobs + 1}  # map hands out the variants in order
                report(s)
    for name in alone:
        done[name] = run_variant(name, minutes, seed)
        report(done[name])
    return [done[n] for n in names]


def report(s: dict) -> None:
    print(f"{s['variant']}: val bpc {s['val_bpc']:.3f} (xz -9e {s['xz_bpc']:.3f}) after {s['steps']} steps on "
          f"{s['threads']} thread(s)", flush=True)


HEADER = {"en": ["variant", "what it changes", "batch", "steps", "tok/s", "threads", "val bpc", "bpc / xz -9e",
                 "vs baseline"],
          "zh": ["变体", "改动", "批次", "步数", "tok/s", "线程", "验证 bpc", "bpc / xz -9e", "相对 baseline"]}


def result_table(runs: list[dict], lang: str = "en") -> str:
    """The runs as a Markdown table; "vs baseline" where the baseline ran beside them."""
    base = next((s["val_bpc"] for s in runs if s["variant"] == "baseline"), None)
    rows = [[f"`{s['variant']}`", describe(s["variant"], lang), s.get("batch") or ALONE[lang], s["steps"],
             f"{s['tokens_per_s']:.0f}", s["threads"],
             f"{s['val_bpc']:.3f}", f"{s['val_bpc'] / s['xz_bpc']:.3f}",
             f"{s['val_bpc'] - base:+.3f}" if base is not None else ""] for s in runs]
    return table(rows, HEADER[lang])


ALONE = {"en": "alone", "zh": "单独"}
PAGE = {
    "en": ("Generated by `{command}` on {date} at commit `{commit}`. Machine: {machine}.",
           "Each variant trained the demo (`qkv train`, embedded corpus) for {minutes:g} minutes of wall clock "
           "and was scored on the same held-out text: gzip -9 {gzip:.3f} and xz -9e {xz:.3f} bits per character. "
           "{how} Lower is better; \"vs baseline\" is the difference in bits per character."),
    "zh": ("由 `{command}` 于 {date} 在提交 `{commit}` 上生成。机器：{machine}。",
           "每个变体训练 demo（`qkv train`，内置语料）{minutes:g} 分钟墙钟时间，在同一段留出文本上评分："
           "gzip -9 为 {gzip:.3f}、xz -9e 为 {xz:.3f} 比特/字符。{how}越低越好；“相对 baseline”是比特/字符之差。"),
}
HOW = {"en": ("They ran {jobs} at a time, each pinned to its own core on one thread (variants that ask for more "
              "threads ran alone), so the variants of a batch saw the same machine: compare within a batch, as "
              "the machine's speed may differ between batches (see tok/s).",
              "They ran one after the other on the threads qkv chose."),
       "zh": ("每次并行 {jobs} 个，各自绑定一个核心、单线程运行（要求更多线程的变体单独运行），同一批次的变体面对相同的机器负载："
              "请在同一批次内比较，不同批次之间机器的速度可能不同（见 tok/s）。",
              "依次运行，线程数由 qkv 选择。")}


def stamp_now(command: str) -> dict:
    """The command, today's date, the source's commit and this machine, for a page written now."""
    return {"command": command, "date": datetime.date.today().isoformat(), "commit": source_commit(),
            "machine": machine()}


def write_page(docs: Path, runs: list[dict], minutes: float, jobs: int, stamp: dict) -> list[Path]:
    """DOCS/generated/demo-levers.md, .zh.md and .json from ``runs`` under ``stamp`` (``stamp_now``, or a saved
    run's); the paths written."""
    if not docs.is_dir():
        raise SystemExit(f"--markdown {docs}: expected the documentation folder (e.g. docs), found no such directory")
    out, written = docs / "generated", []
    out.mkdir(exist_ok=True)
    for lang, suffix in (("en", ""), ("zh", ".zh")):
        how = HOW[lang][0 if jobs > 1 else 1].format(jobs=jobs)
        made, said = PAGE[lang]
        text = "\n\n".join([made.format(**stamp), said.format(minutes=minutes, gzip=runs[0]["gzip_bpc"],
                                                              xz=runs[0]["xz_bpc"], how=how), result_table(runs, lang)])
        written.append(out / f"demo-levers{suffix}.md")
        atomic_text(written[-1], text + "\n")
    written.append(out / "demo-levers.json")
    atomic_text(written[-1], json.dumps(stamp | {"minutes": minutes, "jobs": jobs, "runs": runs}, indent=1) + "\n")
    return written


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=3.0, help="wall-clock budget of each run (default 3, the demo's)")
    p.add_argument("--variant", action="append", metavar="NAME", help="a variant to run (repeatable; a+b "
                   "combines two; default: every variant)")
    p.add_argument("--seed", type=int, default=1337, help="the runs' seed (default 1337, the demo's)")
    p.add_argument("--jobs", type=int, default=1, help="variants trained at a time, each pinned to its own core "
                   "on one thread (default 1: one after the other, on the threads qkv chooses)")
    p.add_argument("--markdown", type=Path, metavar="DOCS", help="also write DOCS/generated/demo-levers.md and "
                   ".zh.md (date, commit, machine, command)")
    p.add_argument("--list", action="store_true", help="list the variants and stop")
    p.add_argument("--from-json", type=Path, metavar="FILE", help="write the --markdown pages again from a saved "
                   "demo-levers.json (its numbers and stamp; no training)")
    args = p.parse_args(argv)
    if args.from_json:
        return rewrite(args.from_json, args.markdown)
    if args.list:
        out = table([[name, what] for name, (what, _, _) in VARIANTS.items()], ["variant", "what it changes"])
        print(out)
        return out
    cores = len(os.sched_getaffinity(0))
    if not 1 <= args.jobs <= cores:
        raise SystemExit(f"--jobs must be between 1 and the {cores} core(s) this process may use, got {args.jobs}")
    names = list(dict.fromkeys(args.variant or VARIANTS))
    for name in names:  # a typo stops before any run
        settings(name)
    runs = run_all(names, args.minutes, args.seed, args.jobs)
    out = result_table(runs)
    print(f"\neach variant trained for {args.minutes:g} min (qkv train --max-minutes):")
    print(out)
    if args.markdown:
        command = "python -m benchmarks.demo_levers " + " ".join(sys.argv[1:] if argv is None else argv)
        for path in write_page(args.markdown, runs, args.minutes, args.jobs, stamp_now(command)):
            print(f"wrote {path}")
    return out


def rewrite(saved: Path, docs: Path | None) -> str:
    """The pages of ``docs`` written again from ``saved`` (a demo-levers.json), its stamp kept."""
    if docs is None:
        raise SystemExit("--from-json writes the pages again: give --markdown DOCS too")
    d = json.loads(saved.read_text(encoding="utf-8"))
    stamp = {key: d[key] for key in ("command", "date", "commit", "machine")}
    for path in write_page(docs, d["runs"], d["minutes"], d["jobs"], stamp):
        print(f"wrote {path}")
    return result_table(d["runs"])


if __name__ == "__main__":
    main()
