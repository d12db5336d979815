"""The main job's defaults on both kinds of CPU people have: one with native bf16 (AVX-512 BF16 / AMX) and one
without (AVX2 only, most laptops), the second emulated on the first by ``ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2`` (bf16 products then run as slowly as on an AVX2 CPU; ``qkv.runtime.native_bf16`` says
False, as it does there).

    python -m benchmarks.cpu_profiles                       # every part (about 45 minutes on 2 cores)
    python -m benchmarks.cpu_profiles --only demo pair      # some parts
    python -m benchmarks.cpu_profiles --profile avx2        # one profile
    python -m benchmarks.cpu_profiles --markdown docs       # and docs/generated/cpu-profiles.md (.zh.md, .json)

Parts, each ``qkv train`` as a user runs it (a subprocess; its summary.json read back):
    demo        the default demo (3 minutes), alone on the machine: held-out bpc against xz -9e
    busy        the default demo of both profiles side by side, each pinned to one of two cores: with the other
                core busy, against gzip -9
    translate   the default translation (10 minutes), alone: BLEU and chrF against the translation memory's
    pair        the default optimizer (Muon) against AdamW + cosine, 45 s each side by side on a core each:
                tokens/s
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

PROFILES = {"native": {}, "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}}
PARTS = ("demo", "busy", "pair", "translate")
CHECKOUT = Path(__file__).resolve().parents[1]


def start(profile: str, out: Path, *flags: str, core: int | None = None) -> subprocess.Popen:
    """``qkv train FLAGS --out OUT`` under ``profile``'s variables, pinned to ``core`` if given."""
    env = os.environ | PROFILES[profile] | {"PYTHONPATH": str(CHECKOUT / "src")}
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    return subprocess.Popen([sys.executable, "-m", "qkv", "train", *flags, "--out", str(out), "--quiet",
                             "--sample-tokens", "0"], env=env, preexec_fn=pin, cwd=CHECKOUT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen, out: Path) -> dict:
    _, err = p.communicate()
    if p.returncode:
        raise SystemExit(f"qkv train failed ({out}): {err.strip().splitlines()[-1] if err.strip() else p.returncode}")
    return json.loads((out / "summary.json").read_text())


def run(profile: str, out: Path, *flags: str) -> dict:
    return finish(start(profile, out, *flags), out)


def demo_row(profile: str, s: dict, how: str) -> list:
    r = s["recipe"]
    return [f"demo, {profile}, {how}", f"{s['val_bpc']:.3f}", f"{s['val_bpc'] / s['xz_bpc']:.3f} × xz",
            f"{s['val_bpc'] / s['gzip_bpc']:.3f} × gzip", f"{s['steps']} steps, {s['tokens_per_s']:.0f} tok/s, "
            f"{s['threads']} thread(s); {r['optimizer']} (Newton–Schulz {r.get('muon_newton_schulz', '-')}), "
            f"bf16 {r['bf16']}: {r['bf16_because']}"]


def part_demo(work: Path, profiles: list[str]) -> list[list]:
    return [demo_row(p, run(p, work / f"demo-{p}"), "alone") for p in profiles]


def part_busy(work: Path, profiles: list[str]) -> list[list]:
    procs = {p: start(p, work / f"busy-{p}", core=i % (os.cpu_count() or 1)) for i, p in enumerate(profiles)}
    return [demo_row(p, finish(proc, work / f"busy-{p}"), "one core, the other busy") for p, proc in procs.items()]


def part_pair(work: Path, profiles: list[str], seconds: float = 45) -> list[list]:
    rows = []
    for p in profiles:
        minutes = str(seconds / 60)
        recipes = {"muon": [], "adamw": ["--optimizer", "adamw", "--schedule", "cosine"]}
        procs = {opt: start(p, work / f"pair-{p}-{opt}", "--max-minutes", minutes, *flags, core=i)
                 for i, (opt, flags) in enumerate(recipes.items())}
        rates = {opt: finish(proc, work / f"pair-{p}-{opt}")["tokens_per_s"] for opt, proc in procs.items()}
        rows.append([f"optimizer pair, {p}", f"{rates['muon']:.0f} / {rates['adamw']:.0f} tok/s",
                     f"{rates['muon'] / rates['adamw']:.2f} × adamw", "", f"{seconds:.0f} s each, a core each"])
    return rows


def part_translate(work: Path, profiles: list[str]) -> list[list]:
    rows = []
    for p in profiles:
        s = run(p, work / f"translate-{p}", "--task", "translate")
        rows.append([f"translate, {p}, alone", f"BLEU {s['bleu']:.1f} / chrF {s['chrf']:.1f}",
                     f"memory {s['memory_bleu']:.1f} / {s['memory_chrf']:.1f}",
                     f"copy {s['copy_bleu']:.1f} / {s['copy_chrf']:.1f}",
                     f"{s['steps']} steps; {s['recipe']['optimizer']}, bf16 {s['recipe']['bf16']}"])
    return rows


HEADER = {"en": ["run", "result", "against", "against", "details"], "zh": ["运行", "结果", "对比", "对比", "细节"]}
PAGE = {"en": "`{command}`, {stamp}. Native: this CPU as it is; avx2: the same CPU under ONEDNN_MAX_CPU_ISA=AVX2 "
              "ATEN_CPU_CAPABILITY=avx2, where bf16 products are emulated as on an AVX2-only CPU.",
        "zh": "`{command}`，{stamp}。native：本机 CPU 原样；avx2：同一 CPU 设置 ONEDNN_MAX_CPU_ISA=AVX2 "
              "ATEN_CPU_CAPABILITY=avx2，bf16 乘法像在只有 AVX2 的 CPU 上一样被模拟。"}


def render(saved: dict, lang: str) -> str:
    from .common import table

    rows = [[str(cell).replace("|", "\\|") for cell in row] for row in saved["rows"]]
    return PAGE[lang].format(**saved) + "\n\n" + table(rows, HEADER[lang]) + "\n"


def write_pages(saved: dict, docs: Path) -> None:
    """DOCS/generated/cpu-profiles.md, .zh.md and .json."""
    from qkv.fileio import atomic_text

    out = docs / "generated"
    if not out.is_dir():
        raise SystemExit(f"--markdown {docs}: expected the documentation folder (e.g. docs) with generated/ in it")
    for lang, suffix in (("en", ""), ("zh", ".zh")):
        atomic_text(out / f"cpu-profiles{suffix}.md", render(saved, lang))
    atomic_text(out / "cpu-profiles.json", json.dumps(saved, indent=1, ensure_ascii=False) + "\n")


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description="qkv's defaults on a CPU with native bf16 and on one without.")
    p.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--profile", action="append", choices=tuple(PROFILES), default=None)
    p.add_argument("--json", default=None, help="also write the results here (after each part)")
    p.add_argument("--markdown", metavar="DOCS", default=None, help="write DOCS/generated/cpu-profiles.md, .zh.md")
    p.add_argument("--from-json", metavar="FILE", default=None, help="render a saved run's pages")
    args = p.parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
    else:
        saved = measure(args)
    if args.markdown:
        write_pages(saved, Path(args.markdown))
    text = render(saved, "en")
    print(text)
    return text


def measure(args: argparse.Namespace) -> dict:
    from qkv.runtime import machine, source_commit

    profiles = args.profile or list(PROFILES)
    parts = {"demo": part_demo, "busy": part_busy, "pair": part_pair, "translate": part_translate}
    saved = {"stamp": f"{time.strftime('%Y-%m-%d')}, commit {source_commit()}, {machine()}",
             "command": "python -m benchmarks.cpu_profiles " + " ".join(sys.argv[1:]), "rows": []}
    with tempfile.TemporaryDirectory(prefix="qkv-cpu-profiles-") as work:
        for name in (n for n in PARTS if n in args.only):
            t0 = time.perf_counter()
            saved["rows"] += parts[name](Path(work), profiles)
            print(f"cpu_profiles: {name} took {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(saved, indent=1, ensure_ascii=False))
    return saved


if __name__ == "__main__":
    main()
