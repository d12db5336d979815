"""Peak memory of one attention forward: fused path (about linear in n) vs reference path (quadratic).

    python -m benchmarks.memory [--quick]

Each measurement runs in a fresh subprocess: on CUDA the allocator's peak, on CPU the rise
of the resident set's high-water mark (VmHWM, reset through /proc/self/clear_refs once the
inputs exist) over the resident set at that moment.
B=1, H=8, D=64 (d_model 512), fp32, causal.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from .common import machine_info, table

LENGTHS = [1024, 2048, 4096, 8192, 16384]
H, D = 8, 64
LIMIT_GB = 8.0  # the reference path is skipped where its n×n scores alone would pass this
CALLS = {  # path -> the call measured on q, k, v of shape (1, H, n, D)
    "fused": "qkv.scaled_dot_product_attention(q, k, v, is_causal=True)",
    "reference": "qkv.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)",
    "flash": "qkv.flash_attention(q, k, v, is_causal=True)",
    "linear": "qkv.linear_attention(q, k, v, is_causal=True)",
}


def measure(n: int, path: str) -> float:
    """Peak extra memory in MB of one forward at length n on the given path (a key of CALLS), in a fresh process."""
    if path not in CALLS:
        raise ValueError(f"path must be one of {sorted(CALLS)}, got {path!r}")
    code = f"""
import json, torch, qkv
attend = lambda q, k, v: {CALLS[path]}

def status(key):  # kB figures of /proc/self/status
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
cuda = torch.cuda.is_available()
dev = "cuda" if cuda else "cpu"
q, k, v = (torch.randn(1, {H}, {n}, {D}, device=dev) for _ in range(3))
with torch.inference_mode():
    attend(q[..., :8, :], k[..., :8, :], v[..., :8, :])  # warm up kernels and libraries
    if cuda:
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark to the current resident set
        base = status("VmRSS")
    out = attend(q, k, v)
    if cuda:
        torch.cuda.synchronize(); peak = torch.cuda.max_memory_allocated()
    else:
        peak = status("VmHWM")
print(json.dumps((peak - base) / 2**20))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if res.returncode:
        raise RuntimeError(res.stderr.strip().splitlines()[-1])
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="n up to 4k")
    args = p.parse_args(argv)
    print(machine_info())
    rows, crossover = [], None
    for n in LENGTHS[:3] if args.quick else LENGTHS:
        scores_gb = H * n * n * 4 / 2**30
        fused = measure(n, "fused")
        ref = measure(n, "reference") if scores_gb <= LIMIT_GB / 2 else None
        if ref is not None and crossover is None and ref > 2 * fused:
            crossover = n
        rows.append([n, f"{fused:.0f}", "skipped" if ref is None else f"{ref:.0f}",
                     f"{scores_gb * 1024:.0f}", "n/a" if ref is None else f"{ref / max(fused, 1):.1f}x"])
    out = table(rows, ["n", "fused MB", "reference MB", "one n×n fp32 score tensor MB", "reference / fused"])
    print(out)
    print(f"reference path skipped where one score tensor exceeds {LIMIT_GB / 2:.0f} GB (it holds several).")
    if crossover:
        print(f"the reference path needs over twice the fused path's memory from n = {crossover} on")
    return out


if __name__ == "__main__":
    main()
