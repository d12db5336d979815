"""The GPU check: every command end to end on one CUDA GPU, and the main job's GPU figures in one table.

    python -m benchmarks.gpu                              # every section, one after another
    python -m benchmarks.gpu --only commands default      # some sections
    python -m benchmarks.gpu --nanogpt PATH/model.py      # the step against nanoGPT's model.py
    python -m benchmarks.gpu --pairs PAIRS.tsv            # translation pairs where the machine has no catalogs
    python -m benchmarks.gpu --only decode --device cpu --tiny   # the decode section's code on a CPU, tiny model

Sections:
    commands  qkv train (lm, translate), a run resumed GPU → CPU → GPU, sample (two backends), translate,
              export, verify, study, bench — each a subprocess on ``--device cuda``: passed or the error's last line
    recipe    the gpt2 preset's defaults against nanoGPT's GPT-2 settings (AdamW 6e-4, β2 0.95, cosine to 6e-5)
              on qkv's model, equal steps and batches: held-out bits per character (one run after the other)
    default   ``qkv train`` with no preset for 3 minutes: the GPU's default preset against xz -9e; and its
              loop's steady tokens/s against its own compiled step timed alone
    step      GPT-2 small's shape (vocab 50 304, batch 16 × 1 024), bf16 autocast, compiled, fused AdamW: qkv
              (speed layer; and with cuDNN attention alone) against nanoGPT's model.py on the same weights,
              interleaved; MFU against a measured bf16 matmul peak and against the spec sheet's, peak memory
    decode    a Llama-shaped 1.1 B model in bf16, batch-1 greedy: HF generate (dynamic, static compiled) and
              qkv's eager, cudagraph and inductor backends and int8 weights, against the memory roofline
              measured in the same run (``benchmarks/gpu_decode.py``; at most about 2 minutes)

``--markdown docs`` writes the table to docs/generated/gpu.md (and .zh.md, .json) with date, GPU, torch and commit;
``--from-json FILE --markdown docs`` writes them again from a saved run (``--json FILE``) on any machine.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from .gpu_decode import decode_rows

SECTIONS = ("commands", "recipe", "default", "step", "decode")
CHECKOUT = Path(__file__).resolve().parents[1]


# --- running qkv as a user does -------------------------------------------------------------------------------

def qkv_command(*argv: str, stdin: str | None = None, timeout: float = 300) -> tuple[bool, float, str]:
    """(passed, seconds, the last line of its output or error) of ``python -m qkv ARGV``."""
    env = os.environ | {"PYTHONPATH": str(CHECKOUT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "qkv", *argv], input=stdin, capture_output=True, text=True,
                           env=env, timeout=timeout, cwd=CHECKOUT)
    except subprocess.TimeoutExpired:
        return False, time.perf_counter() - t0, f"timed out after {timeout:.0f} s"
    lines = [ln for ln in (p.stdout + "\n" + p.stderr).splitlines() if ln.strip() and "Warning" not in ln]
    tail = (p.stderr.strip().splitlines() or lines or [""])[-1] if p.returncode else (lines or [""])[-1]
    return p.returncode == 0, time.perf_counter() - t0, tail[:160]


def command_rows(work: Path, pairs: str | None) -> list[list]:
    """Each command once on the GPU: [command, passed, seconds, note]."""
    lm, tr, hf = work / "lm", work / "tr", work / "hf"
    data = ["--data", pairs] if pairs else []
    runs = {
        "train (lm, demo preset)": ["train", "--preset", "demo", "--max-steps", "60", "--eval-interval", "30",
                                    "--device", "cuda", "--out", str(lm), "--sample-tokens", "20", "--quiet"],
        "train (translate)": ["train", "--task", "translate", *data, "--max-steps", "60", "--eval-interval", "30",
                              "--device", "cuda", "--out", str(tr), "--quiet"],
        "sample (auto backend)": ["sample", "--run", str(lm), "--prompt", "def ", "--max-new-tokens", "40",
                                  "--device", "cuda", "--seed", "0"],
        "sample (inductor backend)": ["sample", "--run", str(lm), "--prompt", "def ", "--max-new-tokens", "40",
                                      "--device", "cuda", "--backend", "inductor", "--temperature", "0"],
        "translate": ["translate", "--run", str(tr), "--device", "cuda", "Open file", "Save as"],
        "export (Hugging Face)": ["export", "--run", str(lm), "--hf", str(hf)],
        "verify": ["verify", "--device", "cuda"],
        "study order (quick)": ["study", "order", "--quick", "--device", "cuda", "--out", str(work / "order")],
        "bench (attention, quick)": ["bench", "--quick", "--only", "attention"],
    }
    rows = []
    for name, argv in runs.items():
        ok, seconds, note = qkv_command(*argv)
        if name == "verify" and not ok:
            note = failed_claims(work) or note
        rows.append([name, "passed" if ok else "FAILED", f"{seconds:.0f} s", note])
        print(f"gpu: {name}: {rows[-1][1]} ({note})", file=sys.stderr, flush=True)
    rows.append(resume_row(work))
    count = torch.cuda.device_count()
    rows.append(["train under torchrun (ddp, fsdp)", "not run" if count < 2 else "see below", "",
                 f"{count} GPU(s): NCCL needs one GPU per process, DDP and FSDP two or more"])
    return rows


def failed_claims(work: Path) -> str:
    """The claims ``qkv verify --device cuda`` found not holding, each with what it measured (its table's last
    line alone does not say which); empty when the JSON cannot be read."""
    p = subprocess.run([sys.executable, "-m", "qkv", "verify", "--device", "cuda", "--json"], capture_output=True,
                       text=True, cwd=CHECKOUT, env=os.environ | {"PYTHONPATH": str(CHECKOUT / "src")}, timeout=300)
    try:
        rows = json.loads(p.stdout)
    except ValueError:
        return ""
    return "; ".join(f"{r['name']}: {r['summary']}" for r in rows if r.get("holds") is False)[:600]


def resume_row(work: Path) -> list:
    """A demo run stopped on the GPU, continued on the CPU, finished on the GPU: it ends at its step budget."""
    from qkv.training.recipe import TrainConfig, train

    t0, out = time.perf_counter(), work / "moved"
    try:
        base = dict(preset="demo", max_steps=60, eval_interval=20, progress=False, out=str(out), final_eval=False)
        train(TrainConfig(**base, device="cuda"), stop_at=20)
        train(TrainConfig.for_resume(out, device="cpu", progress=False), stop_at=40)
        done = train(TrainConfig.for_resume(out, device="cuda", progress=False))
        steps = [m["step"] for m in done.metrics]
        ok = steps == [20, 40, 60] and all(m["val_loss"] < 10 for m in done.metrics)
        note = f"evaluated at steps {steps}, val loss {done.metrics[-1]['val_loss']:.3f}"
    except Exception as e:  # noqa: BLE001 — the row says what broke
        ok, note = False, f"{type(e).__name__}: {e}"[:160]
    return ["train resumed GPU → CPU → GPU", "passed" if ok else "FAILED", f"{time.perf_counter() - t0:.0f} s", note]


# --- the recipes at GPT-2 small's shape ---------------------------------------------------------------------------

NANOGPT_RECIPE = dict(optimizer="adamw", schedule="cosine", lr=6e-4, beta2=0.95, weight_decay=0.1, min_lr_ratio=0.1,
                      grad_clip=1.0)  # nanoGPT's train_gpt2 config (its warmup, 2 000 of 600 000 steps, scaled)


def recipe_run(kind: str, steps: int, out: str) -> None:
    """One side of the recipe section, in its own process: the gpt2 preset with qkv's defaults or nanoGPT's."""
    from qkv.training.recipe import TrainConfig, train

    settings = {} if kind == "qkv" else NANOGPT_RECIPE | {"warmup_steps": max(1, round(steps * 2000 / 600_000))}
    cfg = TrainConfig(preset="gpt2", max_steps=steps, eval_interval=steps, device="cuda", bf16=True, compile=True,
                      progress=False, **settings)
    s = train(cfg).summary
    Path(out).write_text(json.dumps({"kind": kind, "val_bpc": s["val_bpc"], "xz_bpc": s["xz_bpc"],
                                     "gzip_bpc": s["gzip_bpc"], "tokens": s["tokens"], "steps": s["steps"],
                                     "recipe": s["recipe"]}))


def recipe_process(kind: str, steps: int, out: Path) -> int:
    """One recipe run in its own process, waited for; its exit status."""
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--recipe-run", kind, str(steps), str(out)],
                          cwd=CHECKOUT).returncode


def recipe_rows(work: Path, steps: int) -> list[list]:
    """Both recipes, one after the other (alone on the GPU, as every section is)."""
    rows = []
    for kind in ("qkv", "nanogpt"):
        path = work / f"recipe-{kind}.json"
        status = recipe_process(kind, steps, path)
        if status or not path.exists():
            rows.append([f"gpt2 preset, {kind} recipe", "FAILED", "", f"exit status {status}"])
            continue
        r = json.loads(path.read_text())
        words = r["recipe"]
        rows.append([f"gpt2 preset, {'qkv defaults' if kind == 'qkv' else 'nanoGPT settings'}",
                     f"{r['val_bpc']:.3f} bpc", f"{r['steps']} steps, {r['tokens'] / 1e6:.1f} M tokens",
                     f"{words['optimizer']} + {words['schedule']}, lr {words['lr']:g}; gzip {r['gzip_bpc']:.3f}"])
    return rows


# --- the default run and its loop against its step -----------------------------------------------------------------

def default_config(minutes: float, out: Path):
    """``qkv train --max-minutes M --out OUT``'s config, as the command builds it."""
    from qkv.cli import build_parser
    from qkv.cli.train import train_config

    return train_config(build_parser().parse_args(["train", "--max-minutes", str(minutes), "--out", str(out),
                                                   "--quiet"]))


def step_alone(cfg, steps: int = 60) -> float:
    """Tokens/s of the run's own compiled optimizer step, timed alone (no loop): the recipe's model, optimizer and
    batches; compiled first (not timed), one wait at the end."""
    from qkv.kernels import accelerated
    from qkv.training.distributed import Dist
    from qkv.training.loop import step_batches
    from qkv.training.recipe import Recipe, train_step

    r = Recipe(replace_out(cfg), Dist())
    r.setup()
    model = torch.compile(r.engine.model, dynamic=False)
    with accelerated(r.engine.model, training=True):
        def one():
            micros, divisors = step_batches(r.task, r.loop.batch_gen, 0, r.cfg, r.dist)
            return train_step(model, r.engine.opt, micros, r.task.loss, grad_clip=r.cfg.grad_clip,
                              autocast=r.engine.autocast, divisors=divisors)
        for _ in range(3):
            one()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            one()
        torch.cuda.synchronize()
        return steps * r.task.tokens_per_step / (time.perf_counter() - t0)


def replace_out(cfg):
    from dataclasses import replace

    return replace(cfg, out=None, resume=False)


def default_rows(work: Path, minutes: float) -> list[list]:
    from qkv.training.recipe import train

    cfg = default_config(minutes, work / "default")
    alone = step_alone(cfg)
    torch._dynamo.reset()
    s = train(cfg).summary
    ratio = s["val_bpc"] / s["xz_bpc"]
    return [[f"qkv train (no preset: {cfg.preset}), {minutes:g} min", f"{s['val_bpc']:.3f} bpc",
             f"{ratio:.3f} × xz -9e", f"{s['parameters'] / 1e6:.1f} M parameters, {s['steps']} steps, "
             f"{s['tokens'] / 1e6:.0f} M tokens; gzip {s['gzip_bpc']:.3f}, xz {s['xz_bpc']:.3f}"],
            ["its loop after compile vs its step alone", f"{s['steady_tokens_per_s']:.0f} tok/s",
             f"{s['steady_tokens_per_s'] / alone:.3f} ×", f"step alone {alone:.0f} tok/s; "
             f"whole run {s['tokens_per_s']:.0f} tok/s (compile counted)"]]


# --- the step against nanoGPT ------------------------------------------------------------------------------------------

def bf16_peak_tflops(n: int = 8192, repeats: int = 20) -> float:
    a, b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16), torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * repeats / (time.perf_counter() - t0) / 1e12


def compiled_step(model, loss_fn, x):
    """A compiled bf16 training step with fused AdamW; returns (step, peak bytes of its first call)."""
    from .train_speed import bf16_loss, step_fn

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step = step_fn(torch.compile(model, dynamic=False), bf16_loss(loss_fn), opt, x)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return step, torch.cuda.max_memory_allocated() - base


SDPA_FLAGS = ("flash", "mem_efficient", "math", "cudnn")  # torch.backends.cuda's {name}_sdp switches


@contextlib.contextmanager
def sdpa_only(kernel: str):
    """Only SDPA's ``kernel`` (one of SDPA_FLAGS) allowed while a model is traced (the compiled graph keeps the
    kernel chosen); where it cannot run, SDPA raises instead of taking another. The switches restored after."""
    if kernel not in SDPA_FLAGS:
        raise ValueError(f"kernel must be one of {SDPA_FLAGS}, got {kernel!r}")
    cuda = torch.backends.cuda
    before = {name: getattr(cuda, f"{name}_sdp_enabled")() for name in SDPA_FLAGS}
    for name in SDPA_FLAGS:
        getattr(cuda, f"enable_{name}_sdp")(name == kernel)
    try:
        yield
    finally:
        for name, on in before.items():
            getattr(cuda, f"enable_{name}_sdp")(on)


# Dense bf16 tensor-core TFLOP/s of the spec sheets (no sparsity), by a piece of torch.cuda.get_device_name()
SPEC_BF16_TFLOPS = (("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("H800", 989.4), ("B200", 2250.0),
                    ("A100", 312.0), ("A800", 312.0), ("L40S", 362.05), ("L4", 121.0), ("A10G", 70.0),
                    ("A10", 125.0), ("RTX 4090", 165.2))


def spec_bf16_tflops(name: str) -> float | None:
    """The spec sheet's dense bf16 TFLOP/s of the GPU called ``name`` (the first entry it contains), or None."""
    return next((tflops for key, tflops in SPEC_BF16_TFLOPS if key in name), None)


def mfu_words(rate: float, flops_per_token: float, measured_tflops: float, name: str) -> str:
    """Model FLOPs utilisation of ``rate`` tokens/s both ways: against the bf16 matmul peak measured here, and
    against the spec sheet's (where the GPU is in SPEC_BF16_TFLOPS)."""
    flops = rate * flops_per_token / 1e12
    words = f"MFU {100 * flops / measured_tflops:.1f} % of the measured {measured_tflops:.0f} TFLOP/s bf16 matmul"
    spec = spec_bf16_tflops(name)
    return words + (f", {100 * flops / spec:.1f} % of the spec sheet's {spec:g}" if spec else
                    f", no spec sheet figure for {name}")


def step_rows(nanogpt: str | None, batch: int = 16, T: int = 1024) -> list[list]:
    import qkv
    from qkv.kernels import accelerate_training

    from .common import time_interleaved
    from .train_speed import build_nanogpt, flops_per_token, load_nanogpt, nanogpt_loss, qkv_loss

    torch.manual_seed(0)
    config = qkv.ModelConfig.preset("gpt2", vocab_size=50304, feed_forward=dict(activation="gelu"))
    ours = qkv.GPT(config).cuda()
    x = torch.randint(0, config.vocab_size, (batch, T + 1), device="cuda")
    contenders = {}
    if nanogpt:
        theirs = build_nanogpt(load_nanogpt(nanogpt), ours.cpu()).cuda()
        ours.cuda()
        contenders["nanoGPT model.py"] = compiled_step(theirs, nanogpt_loss, x)
    fast = accelerate_training(copy.deepcopy(ours))
    contenders["qkv + speed layer"] = compiled_step(fast, qkv_loss, x)
    with sdpa_only("cudnn"):
        cudnn = accelerate_training(copy.deepcopy(ours))
        contenders["qkv + speed layer, cuDNN attention"] = compiled_step(cudnn, qkv_loss, x)
    times = time_interleaved({k: step for k, (step, _) in contenders.items()}, repeats=15, warmup=3)
    peak, tokens = bf16_peak_tflops(), batch * T
    base = times.get("nanoGPT model.py")
    rows = []
    for name, seconds in times.items():
        rate = tokens / seconds
        vs = f"{base / seconds:.3f} × nanoGPT" if base else ""
        rows.append([f"GPT-2 small step: {name}", f"{rate:.0f} tok/s", vs,
                     f"{mfu_words(rate, flops_per_token(config, T), peak, torch.cuda.get_device_name())}; peak "
                     f"memory {contenders[name][1] / 2**30:.1f} GiB"])
    return rows


# --- the whole check -------------------------------------------------------------------------------------------------

def stamp() -> str:
    from qkv.runtime import source_commit

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU (a CPU dry run)"
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {device}, torch "
            f"{torch.__version__}, CUDA {torch.version.cuda}, commit {source_commit()}")


def run_sections(args: argparse.Namespace, work: Path) -> dict[str, list[list]]:
    """Each section asked for, one after another (none shares the GPU with another: its timings, and verify's,
    are measured alone), a failure reported in its row."""
    calls = {"commands": lambda: command_rows(work, args.pairs),
             "recipe": lambda: recipe_rows(work, args.recipe_steps),
             "default": lambda: default_rows(work, args.minutes),
             "step": lambda: step_rows(args.nanogpt),
             "decode": lambda: decode_rows(args.device, args.tiny, args.decode_tokens)}
    results = {}
    for name in (n for n in SECTIONS if n in args.only):
        t0 = time.perf_counter()
        try:
            results[name] = calls[name]()
        except Exception:  # noqa: BLE001 — one section's failure is reported, the others still run
            results[name] = [[f"{name}: FAILED", "", "", traceback.format_exc().strip().splitlines()[-1][:160]]]
            traceback.print_exc()
        print(f"gpu: section {name} took {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(saved(results), indent=1))
    return results


PAGE = {"en": ("The GPU check, `{command}`: {stamp}. Each command ran once on the GPU (a row says passed or its "
                "error); the figures are side by side in the one run.",
                ["what", "result", "", "details"]),
        "zh": ("GPU 检查 `{command}`：{stamp}。每条命令在 GPU 上各跑一次（每行写明通过或其错误）；数字都来自同一次运行，并排比较。",
               ["项目", "结果", "", "细节"])}


def render(saved: dict, lang: str) -> str:
    """The page of a saved run (``--json``'s file): its stamp and command, then one table."""
    rows = [[str(cell).replace("|", "\\|") for cell in row] for name in SECTIONS
            for row in saved["sections"].get(name, [])]  # a bar in a cell would end it
    text, header = PAGE[lang]
    return text.format(command=saved.get("command", "python -m benchmarks.gpu"), stamp=saved["stamp"]) + \
        "\n\n" + table(rows, header) + "\n"


def write_pages(saved: dict, docs: Path) -> list[Path]:
    """DOCS/generated/gpu.md, gpu.zh.md and gpu.json from a saved run."""
    from qkv.fileio import atomic_text

    if not docs.is_dir():
        raise SystemExit(f"--markdown {docs}: expected the documentation folder (e.g. docs), found no such directory")
    out = docs / "generated"
    out.mkdir(exist_ok=True)
    written = []
    for lang, suffix in (("en", ""), ("zh", ".zh")):
        written.append(out / f"gpu{suffix}.md")
        atomic_text(written[-1], render(saved, lang))
    written.append(out / "gpu.json")
    atomic_text(written[-1], json.dumps(saved, indent=1, ensure_ascii=False) + "\n")
    return written


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description="qkv on one CUDA GPU: every command, and the main job's GPU figures.")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--nanogpt", default=None, help="nanoGPT's model.py for the step section")
    p.add_argument("--pairs", default=None, help="translation pairs (TSV) for a machine without gettext catalogs")
    p.add_argument("--minutes", type=float, default=3.0, help="the default run's budget (default 3)")
    p.add_argument("--recipe-steps", type=int, default=300, help="steps of each recipe run (default 300)")
    p.add_argument("--json", default=None, help="also write the results here (after each section)")
    p.add_argument("--markdown", metavar="DOCS", default=None, help="write DOCS/generated/gpu.md, .zh.md and .json")
    p.add_argument("--from-json", metavar="FILE", default=None, help="render a saved run's pages (no GPU needed)")
    p.add_argument("--decode-tokens", type=int, default=256, help="new tokens of each decode row (default 256)")
    p.add_argument("--device", default="cuda", help="the decode section's device (default cuda; cpu: a dry run)")
    p.add_argument("--tiny", action="store_true", help="the decode section on a tiny model (a dry run)")
    p.add_argument("--recipe-run", nargs=3, metavar=("KIND", "STEPS", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.from_json:
        loaded = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        if args.markdown:
            write_pages(loaded, Path(args.markdown))
        print(render(loaded, "en"))
        return render(loaded, "en")
    if args.recipe_run:
        kind, steps, out = args.recipe_run
        recipe_run(kind, int(steps), out)
        return ""
    if args.device != "cuda" and args.only != ["decode"]:
        raise SystemExit(f"--device {args.device}: only the decode section runs elsewhere than on cuda "
                         f"(pass --only decode), got --only {' '.join(args.only)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("benchmarks.gpu needs a CUDA GPU; this machine has none")
    with tempfile.TemporaryDirectory(prefix="qkv-gpu-") as work:
        results = run_sections(args, Path(work))
    text = render(saved(results), "en")
    if args.markdown:
        write_pages(saved(results), Path(args.markdown))
    print(text)
    return text


def saved(results: dict) -> dict:
    return {"stamp": stamp(), "command": "python -m benchmarks.gpu " + " ".join(sys.argv[1:]), "sections": results}


def table(rows, header):
    from .common import table as markdown

    return markdown(rows, header)


if __name__ == "__main__":
    main()
