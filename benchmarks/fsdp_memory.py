"""Memory per rank and training tokens/s of a ~25 M-parameter qkv GPT: one process, then two under
torchrun with DDP and with FSDP, each without and with activation checkpointing.

    python -m benchmarks.fsdp_memory [--quick] [--threads N] [--steps S]

Each configuration is a fresh job (``torchrun --standalone`` for two processes) training the same model on
the same text with ``qkv.training``'s recipe (nothing written, no final evaluation). It reports the recipe's
own numbers: the estimate printed before training (weights, gradients, AdamW state, one micro-batch's
activations) and the peak measured over the first steps, the most of the ranks
(CPU: growth of the peak resident set, which includes the libraries' code and buffers loaded on first use;
CUDA: ``torch.cuda.max_memory_allocated``), and tokens/s over the steps after the first. The processes of one job share
``--threads`` (default: every core), so that tokens/s compares the same machine split two ways.
``--quick``: a tiny model and a few steps, to check that the benchmark runs (its figures mean nothing).
Not one of ``python -m benchmarks``' sections: it starts jobs of its own, each a few minutes on a small CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .common import machine_info, table

FULL = dict(d_model=512, num_heads=8, num_layers=8, max_len=256, batch_size=8, steps=6)  # 25.2 M in the blocks
QUICK = dict(d_model=64, num_heads=2, num_layers=2, max_len=64, batch_size=4, steps=4)
CONFIGS = [("none", 1), ("ddp", 2), ("fsdp", 2)]
ROOT = Path(__file__).resolve().parents[1]


def text() -> str:
    """A deterministic text of about 300 k characters (no file, no download)."""
    return "".join(f"def f{i}(x, y):\n    return (x * {i % 97} + y) // {1 + i % 13}\n\n" for i in range(6000))


def worker(spec: dict) -> None:
    """One configuration, in this process (one rank of a torchrun job): rank 0 prints its numbers as JSON."""
    from qkv.data import Corpus
    from qkv.models import ModelConfig
    from qkv.training.distributed import Dist
    from qkv.training.recipe import Recipe, TrainConfig

    t = text()
    corpus = Corpus(train=t[: -len(t) // 20], val=t[-len(t) // 20:], source="benchmarks.fsdp_memory's text")
    model = ModelConfig(d_model=spec["d_model"], attention=dict(num_heads=spec["num_heads"]),
                        num_layers=spec["num_layers"], max_len=spec["max_len"])
    cfg = TrainConfig(model=model, tokenizer="char", max_steps=spec["steps"], batch_size=spec["batch_size"],
                      eval_interval=10**6, final_eval=False, device="cpu", seed=0, threads=spec["threads"],
                      sharding=spec["sharding"], activation_checkpointing=spec["checkpointing"], progress=False)
    dist = Dist.from_env(cfg.device)
    try:
        recipe = Recipe(cfg, dist, corpus=corpus)
        seconds = timed_steps(recipe)
        summary = recipe.train().summary
        tokens = summary["tokens"] / summary["steps"] * (len(seconds) - 1)
        if dist.is_main:
            result = {"estimate": recipe.engine.estimate.total, "peak": getattr(recipe.engine, "peak_bytes", None),
                      "tokens_per_s": tokens / sum(seconds[1:]), "parameters": summary["parameters"]}
            print("RESULT " + json.dumps(result), flush=True)
    finally:
        dist.close()


def timed_steps(recipe) -> list[float]:
    """Seconds of each optimizer step the recipe takes (filled as it trains); tokens/s leaves out the first,
    which pays for lazy initialisation."""
    seconds, step = [], recipe.loop.step

    def timed(model):
        t0 = time.perf_counter()
        loss = step(model)
        seconds.append(time.perf_counter() - t0)
        return loss

    recipe.loop.step = timed
    return seconds


def launch(spec: dict, processes: int) -> dict:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")]),
                        "OMP_NUM_THREADS": str(spec["threads"])}
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)] \
        if processes > 1 else [sys.executable]
    done = subprocess.run([*head, "-m", "benchmarks.fsdp_memory", "--worker", json.dumps(spec)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{spec['sharding']} on {processes} process(es) failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def row(sharding: str, processes: int, checkpointing: bool, r: dict, one: dict) -> list:
    mib = lambda b: "n/a" if b is None else f"{b / 2**20:.0f}"  # noqa: E731
    return [sharding, processes, "yes" if checkpointing else "no", mib(r["peak"]), mib(r["estimate"]),
            f"{r['tokens_per_s']:.0f}", f"{r['tokens_per_s'] / one['tokens_per_s']:.2f}x"]


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a tiny model and 4 steps: checks that it runs")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads per job, shared by its processes")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per configuration (at least 4)")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # one configuration, as JSON (internal)
    args = p.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return ""
    base = (QUICK if args.quick else FULL) | ({"steps": max(4, args.steps)} if args.steps else {})
    print(machine_info(), flush=True)
    rows, params = [], None
    for checkpointing in (False, True):
        one = None
        for sharding, processes in CONFIGS:
            spec = base | {"sharding": sharding, "checkpointing": checkpointing,
                           "threads": max(1, args.threads // processes)}
            r = launch(spec, processes)
            one, params = one or r, r["parameters"]
            rows.append(row(sharding, processes, checkpointing, r, one))
            print(table(rows[-1:], HEADER).splitlines()[-1], flush=True)
    out = table(rows, HEADER) + (f"\n\n{params / 1e6:.1f} M parameters, batch {base['batch_size']} x {base['max_len']}"
                                 f" tokens, {base['steps']} steps, {args.threads} threads per job; memory per rank in "
                                 "MiB: measured peak over the first 3 steps, the recipe's estimate")
    print(out)
    return out


HEADER = ["sharding", "processes", "act. ckpt", "peak MiB/rank", "estimate MiB/rank", "tokens/s", "vs 1 process"]

if __name__ == "__main__":
    main()
