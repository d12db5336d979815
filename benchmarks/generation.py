"""Greedy decoding against the memory roofline: qkv's backends (auto, compiled, eager) vs Hugging Face ``generate``.

    python -m benchmarks.generation [--quick] [--no-compile] [--compile-cost] [--batches N ...]

Model: GPT-2's shape at CPU size (6 layers, d_model 512, 8 heads, vocabulary 8192, 23.6 M parameters,
fp32), HF ``GPT2LMHeadModel`` on the identical weights (``qkv.interop.to_hf``). Prompt 16 tokens, 128 new
(32 with --quick), batch 1, 8 and 32; contenders interleaved, median tokens/s; every contender's tokens
equal qkv auto's (asserted). "auto" is ``generate``'s default backend (the model's forward with its linears
served by ``qkv.kernels``); "compiled" is ``backend="fused"`` (qkv's C++ step, ``qkv.kernels.fused_step``) up
to 4 rows, where "inductor" (``backend="inductor"``, torch.compile's step) is timed beside it, and inductor's
beyond. At batch 1 also "eager" (``backend="eager"``: the reference modules as written) and qkv without its
KV cache.

Roofline: at batch 1 each new token reads every weight once, so tokens/s ≤ bandwidth / weight bytes.
The bandwidth is measured in the same run, twice. First the peak: the fastest that any of five kernels
streams a 128 MB matrix (a plain read, MKL's matrix-vector product, oneDNN's, inductor's fused one and
qkv's; best of 15 each). Then, since this machine's bandwidth drifts with the other jobs on its host (a
plain read gave 45 to 89 GB/s within minutes), the roofline itself: the fastest of those reads (the plain
``sum``, qkv's kernel and inductor's reduction) of a matrix exactly as large as the model's weights
(92.4 MB, so that whatever the L3 cache keeps of one it keeps of the other), each read again and again
for about as long as a decoder's call, timed as more contenders in the batch-1 rounds; the fastest median
is the rounds' bandwidth. A 128 MB read in the same rounds is printed beside it (memory alone). Those medians
are moments seconds apart, over which the host's bandwidth moves by a third, so last each batch-1 decoder
call is timed again between two reads of the weights' bytes, its roofline theirs (``paired_roofline``): the
table's "of roofline" is the median of those calls' fractions, the rounds' figure printed beside it. "weights only" runs the model's own matrix-vector products back
to back and nothing else — eagerly and compiled into one function —: the best a decoder that calls
one kernel per weight matrix can do here.

--compile-cost times ``generate(backend="inductor")``'s first call in two fresh processes sharing an empty
inductor cache directory (the first compiles, the second reads inductor's on-disk cache), then the fused
step's in two sharing an empty qkv cache (the first builds qkv's C++ kernels, the second loads them).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import qkv
from qkv.generation import paths
from qkv.kernels import build as matvec
from qkv.generation.backends import unguarded
from qkv.interop import to_hf
from qkv.kernels.linear import linear as qkv_linear

from .common import bandwidths, machine_info, stream_matrix, stream_reads, table, time_interleaved

CONFIG = qkv.ModelConfig.preset("gpt2", d_model=512, attention=dict(num_heads=8), num_layers=6, vocab_size=8192)
PROMPT = 16


def build(seed: int = 0):
    """qkv GPT and HF GPT2LMHeadModel with the same random weights, in eval mode."""
    torch.manual_seed(seed)
    model = qkv.GPT(CONFIG).eval()
    return model, to_hf(model).eval()


def weight_bytes(model) -> int:
    """Bytes one decoding step must read: every Linear's weight and bias (the tied LM head once)."""
    seen, total = set(), 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            for p in (module.weight, module.bias):
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel() * p.element_size()
    return total


def products(model) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(weight, bias) of each matrix-vector product of a decoding step, in the model's order."""
    return [(m.weight, m.bias) for m in model.modules() if isinstance(m, torch.nn.Linear)]


def weights_only(model, tokens: int, compile: bool = True) -> dict[str, tuple[int, object]]:
    """{name: (tokens, fn)}: ``fn`` runs the model's matrix-vector products alone, in the model's order,
    ``tokens`` times: through ``qkv.kernels.linear.linear`` (what backend "auto" runs), through ``F.linear``
    (MKL's, one core: backend "eager") and, with ``compile``, ``qkv.kernels.linear.linear`` compiled into one
    function (what inductor's step runs: qkv's kernel where it is built, else inductor's fused reductions)."""
    def one_pass(fn):
        weights = products(model)
        inputs = [torch.randn(1, w.size(1)) for w, _ in weights]
        return lambda: [fn(x, w, b) for (w, b), x in zip(weights, inputs)]

    passes = {"qkv.kernels.linear": one_pass(qkv_linear), "F.linear": one_pass(F.linear)}
    if compile:
        compiled = torch.compile(one_pass(qkv_linear), dynamic=False)
        with torch.inference_mode():
            compiled()  # compiles
        passes["compiled"] = lambda: unguarded_call(compiled)  # as generate's steps: guards checked once
    with torch.inference_mode():
        for fn in passes.values():
            fn()  # compiles
    return {f"weights only, {name}": (tokens, lambda fn=fn: [fn() for _ in range(tokens)])
            for name, fn in passes.items()}


def unguarded_call(compiled):
    """``compiled()`` without evaluating its guards (74 weight tensors: 0.13 ms a call), as ``generate`` runs
    its compiled steps after the first (``qkv.generation.backends.unguarded``)."""
    with unguarded(True):
        return compiled()


def contenders(model, hf, ids: torch.Tensor, new: int, compile: bool) -> dict:
    """{name: a call of generate}: "qkv auto" (the default backend: the forward, linears through the kernels),
    "qkv compiled" (the fused step where it runs the batch, else inductor's) with "qkv inductor" beside it, and
    at batch 1 "qkv eager" (the reference modules as written) and "qkv no cache"."""
    calls = {"qkv auto": lambda: model.generate(ids, new, temperature=0)}
    if compile:
        fused = paths.refuses("fused", model, batch=ids.size(0)) is None
        calls["qkv compiled"] = lambda: model.generate(ids, new, temperature=0,
                                                       backend="fused" if fused else "inductor")
        if fused:
            calls["qkv inductor"] = lambda: model.generate(ids, new, temperature=0, backend="inductor")
    if ids.size(0) == 1:  # the reference modules, and what the KV cache buys: a full forward per token
        calls["qkv eager"] = lambda: model.generate(ids, new, temperature=0, backend="eager")
        calls["qkv no cache"] = lambda: model.generate(ids, new, temperature=0, use_cache=False)
    calls["HF generate"] = lambda: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                               min_new_tokens=new, do_sample=False, pad_token_id=0)
    return calls


def prompt(batch: int) -> torch.Tensor:
    return torch.randint(0, CONFIG.vocab_size, (batch, PROMPT), generator=torch.Generator().manual_seed(batch))


def run_batch(model, hf, batch: int, new: int, *, compile: bool, repeats: int, beside: dict = None) -> dict:
    """Tokens/s of each contender at this batch size; asserts they all produce qkv auto's tokens.
    ``beside`` {name: (units, fn)} are timed in the same rounds, their rate in units/s."""
    calls = contenders(model, hf, prompt(batch), new, compile)
    with torch.inference_mode():
        reference = calls["qkv auto"]()
        for name, fn in calls.items():
            assert torch.equal(fn(), reference), f"{name} generated different tokens from qkv auto"
        units = dict.fromkeys(calls, batch * new)
        for name, (n, fn) in (beside or {}).items():
            units[name], calls[name] = n, fn
        seconds = time_interleaved(calls, repeats=repeats, warmup=0)
    return {name: units[name] / s for name, s in seconds.items()}


DECODERS = ("qkv auto", "qkv compiled", "qkv inductor", "qkv eager")


def paired_roofline(model, hf, new: int, nbytes: int, compile: bool, repeats: int) -> dict[str, list[float]]:
    """{decoder: its batch-1 calls' fractions of the roofline, sorted}: each call timed between two reads of
    the weights' bytes (each side the faster of a plain ``sum`` and qkv's kernel, median of three), its
    roofline the mean of the two. The rounds' medians compare moments seconds apart, over which this
    host's bandwidth moves by a third; a call and the reads on either side of it share one moment."""
    w = stream_matrix(nbytes / 2**20)
    x = torch.randn(1, w.size(1), device=w.device)
    kernel = w.is_cpu and matvec.available()  # qkv's matrix-vector kernel is a CPU kernel
    reads = [lambda: w.sum()] + ([lambda: torch.ops.qkv.matvec(x, w, None)] if kernel else [])
    calls = {n: fn for n, fn in contenders(model, hf, prompt(1), new, compile).items() if n in DECODERS}
    fractions = {name: [] for name in calls}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, fn in calls.items():
                before = bandwidth_now(reads, nbytes)
                t0 = time.perf_counter()
                fn()
                seconds = time.perf_counter() - t0
                roofline = (before + bandwidth_now(reads, nbytes)) / 2 / nbytes
                fractions[name].append(new / seconds / roofline)
    return {name: sorted(f) for name, f in fractions.items()}


def bandwidth_now(reads: list, nbytes: int) -> float:
    """Bytes/s: the fastest of ``reads``, each read of ``nbytes`` timed three times (median)."""
    def seconds(fn):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return sorted(times)[1]
    return max(nbytes / seconds(fn) for fn in reads)


def compile_cost(mode: str) -> tuple[float, float]:
    """First-call seconds of generate(compile=mode) in a fresh process, then in a second one sharing its
    caches: for "inductor" an empty inductor cache (then its on-disk cache); for "fused" an empty qkv
    cache, so the first process builds qkv's C++ kernels and the second loads them."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, **({"TORCHINDUCTOR_CACHE_DIR": cache} if mode == "inductor" else {"QKV_CACHE_DIR": cache}))
        cmd = [sys.executable, "-m", "benchmarks.generation", "--compile-child", mode]
        return tuple(float(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
                           .stdout.split()[-1]) for _ in range(2))


def compile_child(mode: str) -> None:
    model, _ = build()
    ids = torch.randint(0, CONFIG.vocab_size, (1, PROMPT))
    t0 = time.perf_counter()
    model.generate(ids, 8, temperature=0, backend=mode)
    print(f"{time.perf_counter() - t0:.2f}")


FLOOR = dataclasses.replace(CONFIG, d_model=64, vocab_size=256)  # the same 6 layers and 8 heads, weights 1/64 of the size


def floor_decoders(new: int, compile: bool) -> dict[str, tuple[int, object]]:
    """{name: (tokens, fn)}: greedy decoding of ``new`` tokens by a model of ``FLOOR``'s shape, eager and
    compiled. Its weights are 1.4 MB, so its time a token is the work that does not grow with the
    weights: Python, dispatch, kernel launches and synchronisation, the same number as the big model's."""
    torch.manual_seed(0)
    small = qkv.GPT(FLOOR).eval()
    ids = torch.randint(0, FLOOR.vocab_size, (1, PROMPT))
    out = {"floor, auto": (new, lambda: small.generate(ids, new, temperature=0))}
    if compile:
        out["floor, compiled"] = (new, lambda: small.generate(ids, new, temperature=0, backend="fused"))
    with torch.inference_mode():
        for _, fn in out.values():
            fn()  # compiles
    return out


def batch_one_beside(model, new: int, compile: bool) -> dict:
    """What is timed in the batch-1 rounds beside the decoders: the reads of a matrix as large as the
    model's weights (the roofline's bandwidth) and of a 128 MB one (memory alone: little of it stays in
    cache), the weights-only passes and the per-token floor, each about as long as one decoder's call."""
    reads = stream_reads(weight_bytes(model) / 2**20, compile)
    dram = {"DRAM " + name: read for name, read in stream_reads(128, compile=False).items()}
    return {**reads, **dram, **weights_only(model, new, compile), **floor_decoders(new, compile)}


def report_roofline(batch_one: dict | None, nbytes: int, peak: float) -> float:
    """The roofline in tokens/s (from the fastest read of the batch-1 rounds, or the peak without them);
    prints it, the 128 MB read's and the weights-only passes, which it takes out of ``batch_one``."""
    if batch_one is None:
        return peak * 1e9 / nbytes
    reads = {name: batch_one.pop(name) for name in list(batch_one) if name.startswith("read ")}
    dram = {name: batch_one.pop(name) for name in list(batch_one) if name.startswith("DRAM read ")}
    bandwidth, dram_bandwidth = max(reads.values()), max(dram.values())
    roofline = bandwidth / nbytes
    print("roofline: the fastest read of the model's weight bytes in the batch-1 rounds (medians: "
          + ", ".join(f"{name} {b / 1e9:.1f} GB/s" for name, b in reads.items())
          + f"), {bandwidth / 1e9:.1f} GB/s ({bandwidth / 1e9 / peak:.2f} of the peak) -> {roofline:.0f} tok/s")
    decoders = [name for name in DECODERS if name in batch_one]
    print(f"memory alone: a 128 MB read in the same rounds, {dram_bandwidth / 1e9:.1f} GB/s "
          f"({dram_bandwidth / bandwidth:.2f} of the roofline's) -> "
          f"{dram_bandwidth / nbytes:.0f} tok/s; " + ", ".join(
              f"{name} {batch_one[name] / (dram_bandwidth / nbytes):.2f} of it" for name in decoders))
    passes = {name.split(", ")[1]: batch_one.pop(name) for name in list(batch_one) if name.startswith("weights only")}
    print("weights only (the model's matrix-vector products back to back, in the same rounds): " + ", ".join(
        f"{name} {tps:.0f} tok/s ({tps / roofline:.2f} of the roofline)" for name, tps in passes.items()))
    floors = {name.split(", ")[1]: batch_one.pop(name) for name in list(batch_one) if name.startswith("floor")}
    print(f"per-token floor (the same layers at d_model {FLOOR.d_model}, vocabulary {FLOOR.vocab_size}, same rounds): "
          + ", ".join(f"{name} {1e6 / tps:.0f} µs a token ({batch_one['qkv ' + name] / tps:.2f} of qkv {name}'s token)"
                      for name, tps in floors.items()))
    return roofline


def roofline_rows(results: dict, roofline: float, paired: dict | None = None) -> list[list]:
    """The table's rows; at batch 1 "of roofline" is the median of ``paired``'s calls where it was measured."""
    rows = []
    for batch, tps in results.items():
        hf, rate = tps["HF generate"], lambda n: f"{tps[n]:.0f}" if n in tps else "-"
        fraction = lambda n: statistics.median(paired[n]) if paired else tps[n] / roofline  # noqa: E731
        row = [batch] + [rate(n) for n in DECODERS + ("HF generate",)]
        row += [f"{tps[n] / hf:.2f}x" if n in tps else "-" for n in DECODERS]
        row += [" / ".join(f"{fraction(n):.2f}" for n in DECODERS if n in tps) if batch == 1 else "-"]
        row += [f"{tps['qkv auto'] / tps['qkv no cache']:.1f}x" if "qkv no cache" in tps else "-"]
        rows.append(row)
    return rows


def report_paired(paired: dict, results: dict, roofline: float) -> None:
    print(f"of the roofline, each batch-1 call between two reads of the weights' bytes ({len(next(iter(paired.values())))} "
          "calls each; the table's column): " + ", ".join(
              f"{name} {statistics.median(f):.2f} ({f[0]:.2f}-{f[-1]:.2f})" for name, f in paired.items())
          + "; the rounds' medians over the rounds' roofline: " + ", ".join(
              f"{name} {results[1][name] / roofline:.2f}" for name in paired))


HEADER = ["batch", "qkv auto tok/s", "qkv compiled tok/s", "inductor tok/s", "qkv eager tok/s", "HF tok/s",
          "auto / HF", "compiled / HF", "inductor / HF", "eager / HF",
          "of roofline (auto / compiled / inductor / eager)", "auto / no cache"]


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="32 new tokens, batches 1 and 8, fewer repeats")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd decode step")
    p.add_argument("--compile-cost", action="store_true", help="time the first compiled call in two fresh processes "
                   "(always on without --quick)")
    p.add_argument("--batches", type=int, nargs="+", help="batch sizes (default: 1 8 32; --quick: 1 8)")
    p.add_argument("--compile-child", choices=("fused", "inductor"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.compile_child:
        compile_child(args.compile_child)
        return ""
    print(machine_info())
    model, hf = build()
    streams, nbytes = bandwidths(128), weight_bytes(model)
    peak = max(streams.values())
    print(f"model: 6 layers, d_model 512, vocabulary 8192, {model.num_parameters() / 1e6:.1f} M parameters, "
          f"{nbytes / 1e6:.1f} MB of weights per token; HF attention: {hf.config._attn_implementation}")
    print("peak, streaming one 128 MB matrix (best of 15): " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in streams.items())
          + f" -> {peak:.1f} GB/s, {peak * 1e9 / nbytes:.0f} tok/s")
    new, batches = (32, (1, 8)) if args.quick else (128, (1, 8, 32))
    batches = args.batches or batches
    results = {b: run_batch(model, hf, b, new, compile=not args.no_compile, repeats=3 if args.quick else 5,
                            beside=batch_one_beside(model, new, not args.no_compile) if b == 1 else None)
               for b in batches}
    roofline = report_roofline(results.get(1), nbytes, peak)
    paired = None
    if 1 in results:
        paired = paired_roofline(model, hf, new, nbytes, not args.no_compile, repeats=5 if args.quick else 7)
        report_paired(paired, results, roofline)
    out = table(roofline_rows(results, roofline, paired), HEADER)
    print(out)
    print(f"prompt {PROMPT}, {new} new tokens, greedy; every column produced identical tokens (asserted)")
    if (args.compile_cost or not args.quick) and not args.no_compile:
        first, second = compile_cost("inductor")
        built, loaded = compile_cost("fused")
        print(f"compile cost: inductor's first call {first:.1f} s in a fresh process, {second:.1f} s in a second one "
              f"(inductor's on-disk cache); the fused step's first call {built:.1f} s where qkv's kernels are built "
              f"(once per machine), {loaded:.1f} s where they are loaded")
    return out


if __name__ == "__main__":
    main()
