"""qkv's C++ kernels with and without AVX-512, each against what would run instead on that CPU.

    python -m benchmarks.kernels_isa [--quick] [--isa avx512 avx2] [--threads N ...] [--no-fused] [--csrc DIR]

One child process per instruction set (``QKV_KERNELS_ISA``); for AVX2 a CPU without AVX-512 is simulated
throughout: qkv's kernels built with ``-mno-avx512f``, oneDNN capped at AVX2 (``ONEDNN_MAX_CPU_ISA``), ATen's
and inductor's generated code at AVX2 (``ATEN_CPU_CAPABILITY``). In each:

- the matrix-vector kernel (``torch.ops.qkv.matvec``) against oneDNN's product (``qkv.kernels.linear
  .onednn_linear``), at 1, 2 and 4 rows, on each weight shape of GPT-2-shaped models (d_model 512 and 768)
  and on a whole model's weights, one product each, back to back (a decoding step's products);
- the fused decode step (``generate(backend="fused")``) against inductor's (``backend="inductor"``), greedy
  at batch 1 on ``MODEL`` (tokens asserted equal).

Each figure is oneDNN's (or inductor's) time over qkv's: above 1, qkv's kernel is faster. The two are timed
in rounds, alternately (each round in the other order from the last), and the figure is the median of the
rounds' ratios, the quartiles beside it. ``--csrc DIR`` builds the kernels from DIR's matvec.cpp,
decoder_step.cpp and dot.h instead (another commit's, e.g. ``git show REV:src/qkv/kernels/csrc/dot.h``).
What the build does with the results is ``qkv.kernels.build.USED_ON``; docs/kernels-isa.md has a run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from qkv.kernels.build import cpu_isas

SHAPES = [(512, 512), (1536, 512), (2048, 512), (512, 2048), (768, 768), (3072, 768)]  # (N, K): GPT-2's, d 512 and 768
ROWS = (1, 2, 4)
SIMULATED = {"avx2": {"QKV_KERNELS_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
             "avx512": {"QKV_KERNELS_ISA": "avx512"}}


def ratio_rounds(ours, theirs, *, rounds: int, seconds: float = 0.005) -> tuple[float, float, float]:
    """(median, lower and upper quartile) of theirs' time over ours' in ``rounds`` rounds of about ``seconds``
    each, the two alternating within a round (and which goes first, between rounds)."""
    calls = max(1, round(seconds / max(min(time_once(ours) for _ in range(3)), 1e-7)))
    ratios = []
    for r in range(rounds):
        first, second = (ours, theirs) if r % 2 == 0 else (theirs, ours)
        t_first, t_second = time_calls(first, calls), time_calls(second, calls)
        t_ours, t_theirs = (t_first, t_second) if r % 2 == 0 else (t_second, t_first)
        ratios.append(t_theirs / t_ours)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return statistics.median(ratios), q[0], q[2]


def time_once(fn) -> float:
    fn()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_calls(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - t0


def model_products(config):
    """(weight, x) of each matrix-vector product of one decoding step of a random ``qkv.GPT(config)``."""
    import torch
    import qkv

    torch.manual_seed(0)
    model = qkv.GPT(config).eval()
    return model, [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]


def matvec_rows(rounds: int, model_weights) -> list[dict]:
    """The kernel against oneDNN's product for each shape and row count, then for a model's weights."""
    import torch
    from qkv.kernels.linear import onednn_linear

    torch.manual_seed(0)
    rows_out = []
    cases = [(f"{n}x{k}", [torch.randn(n, k)]) for n, k in SHAPES]
    megabytes = sum(w.numel() * 4 for w in model_weights) / 1e6
    cases.append((f"a model's {len(model_weights)} weights, {megabytes:.1f} MB", model_weights))
    with torch.inference_mode():
        for name, weights in cases:
            for rows in ROWS:
                xs = [torch.randn(rows, w.size(1)) for w in weights]
                ours = lambda: [torch.ops.qkv.matvec(x, w, None) for x, w in zip(xs, weights)]  # noqa: E731
                theirs = lambda: [onednn_linear(x, w, None) for x, w in zip(xs, weights)]  # noqa: E731
                for x, w in zip(xs, weights):
                    torch.testing.assert_close(torch.ops.qkv.matvec(x, w, None), onednn_linear(x, w, None),
                                               rtol=1e-4, atol=1e-4)
                median, low, high = ratio_rounds(ours, theirs, rounds=rounds)
                rows_out.append({"what": f"matvec {name}", "rows": rows, "ratio": median, "q1": low, "q3": high})
    return rows_out


def fused_row(model, rounds: int, tokens: int) -> dict:
    """The fused step against inductor's, greedy at batch 1, tokens asserted equal."""
    import torch

    ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    run = {b: (lambda b=b: model.generate(ids, tokens, temperature=0, backend=b)) for b in ("fused", "inductor")}
    with torch.inference_mode():
        assert torch.equal(run["fused"](), run["inductor"]()), "the fused step's tokens differ from inductor's"
        median, low, high = ratio_rounds(run["fused"], run["inductor"], rounds=rounds, seconds=0)
    return {"what": f"fused step vs inductor, greedy, {tokens} tokens", "rows": 1, "ratio": median, "q1": low,
            "q3": high}


def child(isa: str, quick: bool, fused: bool, threads: list[int], csrc: str | None) -> dict:
    """This process's measurements at each thread count (it runs with ``SIMULATED[isa]``'s environment)."""
    import torch
    import qkv
    from qkv.kernels import build
    from qkv.runtime import machine

    build.USED_ON = tuple(build.ISA_FLAGS)  # measure every ISA, whatever the build decides from the results
    if csrc:
        build.SOURCES = tuple(Path(csrc) / f.name for f in build.SOURCES)
        build.HEADERS = tuple(Path(csrc) / f.name for f in build.HEADERS)
    if not build.available():
        raise SystemExit(f"qkv's kernels are not available for {isa}: {build.why_not()}")
    config = qkv.ModelConfig.preset("gpt2", d_model=512, attention=dict(num_heads=8), num_layers=6, vocab_size=8192)
    model, weights = model_products(config)
    runs = {}
    for n in threads:
        torch.set_num_threads(n)
        runs[n] = matvec_rows(11 if quick else 31, weights)
        if fused:
            runs[n].append(fused_row(model, rounds=5 if quick else 11, tokens=16 if quick else 64))
    return {"isa": isa, "build": build.build_name(), "flags": " ".join(build.flags()), "machine": machine(),
            "aten": torch.backends.cpu.get_cpu_capability(), "runs": runs}


def run_child(isa: str, quick: bool, fused: bool, threads: list[int], csrc: str | None) -> dict:
    """One ISA's measurements, in a process of its own: its simulated environment, its own inductor cache (one
    compiled under another ATEN_CPU_CAPABILITY crashed when reused)."""
    env = {k: v for k, v in os.environ.items() if k not in SIMULATED["avx2"]}  # each child sets its own
    argv = [sys.executable, "-m", "benchmarks.kernels_isa", "--child", isa, "--threads", *map(str, threads)]
    argv += ["--csrc", str(Path(csrc).resolve())] if csrc else []
    with tempfile.TemporaryDirectory(prefix=f"inductor-{isa}-") as inductor:
        done = subprocess.run(argv + ["--quick"] * quick + ["--no-fused"] * (not fused), capture_output=True,
                              env=env | SIMULATED[isa] | {"TORCHINDUCTOR_CACHE_DIR": inductor}, text=True)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"the {isa} run failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(children: list[dict]) -> str:
    """A markdown table: one line per measurement, one column per ISA and thread count."""
    columns = [(c["isa"], n, c["runs"][n]) for c in children for n in c["runs"]]
    head = "| what | rows | " + " | ".join(f"{isa}, {n} thread{'s' * (n != '1')}" for isa, n, _ in columns) + " |"
    lines = [head, "|" + "---|" * (2 + len(columns))]
    for i, first in enumerate(columns[0][2]):
        cells = [f"{r[i]['ratio']:.2f} ({r[i]['q1']:.2f}-{r[i]['q3']:.2f})" for _, _, r in columns]
        lines.append(f"| {first['what']} | {first['rows']} | " + " | ".join(cells) + " |")
    notes = [f"- {c['isa']}: build {c['build']}, flags `{c['flags']}`, ATen capability {c['aten']}" for c in children]
    return "\n".join([f"machine: {children[0]['machine']}", *notes, "", *lines])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kernels_isa", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds and tokens")
    p.add_argument("--isa", nargs="+", choices=sorted(SIMULATED), default=cpu_isas(),
                   help="instruction sets to build for (default: this CPU's, AVX-512 first)")
    p.add_argument("--no-fused", dest="fused", action="store_false", help="skip the fused step against inductor")
    p.add_argument("--threads", nargs="+", type=int, default=sorted({1, os.cpu_count() or 1}),
                   help="torch thread counts to measure at (default: 1 and every core)")
    p.add_argument("--csrc", help="a folder holding the C++ sources to build instead of qkv's own")
    p.add_argument("--child", choices=sorted(SIMULATED), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.quick, args.fused, args.threads, args.csrc)))
        return 0
    print(report([run_child(isa, args.quick, args.fused, args.threads, args.csrc) for isa in args.isa]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
