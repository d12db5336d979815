"""`qkv serve` at its defaults over a SmolLM2-135M-shaped model (random weights): resident memory, and 16 concurrent
chat-shaped requests that share a system prompt against the same requests one at a time.

    python -m benchmarks.serve_paged                  # prints the figures as JSON
    python -m benchmarks.serve_paged --requests 16 --tokens 128 --system 256

The server is ``qkv.serve`` as the command builds it (the scheduler over a paged KV cache, its defaults: 32 rows,
the model's 8 192 positions, the default memory budget) under FastAPI and uvicorn in this process, asked by the
official ``openai`` client, streaming: the time to first token is the time to the first streamed piece. Prompts are
token ids: ``--system`` ids shared by every request, then a few of its own; ``--tokens`` tokens each, greedy, no end.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

SMOLLM2 = dict(vocab_size=49152, d_model=576, num_layers=30, max_len=8192,  # SmolLM2-135M's shape
               position=dict(kind="rope", base=100000.0), normalization=dict(kind="rmsnorm"), head=dict(tie=True),
               attention=dict(num_heads=9, num_kv_heads=3, q_bias=False, k_bias=False, v_bias=False, out_bias=False),
               feed_forward=dict(d_ff=1536, activation="swiglu", bias=False))


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def ask(client, prompt: list[int], tokens: int) -> tuple[float, float]:
    """(seconds to the first streamed piece, seconds to the end) of one greedy streamed completion."""
    t0 = time.perf_counter()
    first = None
    for _ in client.completions.create(model="smollm2", prompt=prompt, max_tokens=tokens, temperature=0, stream=True):
        first = first or time.perf_counter() - t0
    return first, time.perf_counter() - t0


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--system", type=int, default=256, help="shared system-prompt tokens")
    args = p.parse_args(argv)
    import torch
    from openai import OpenAI

    import qkv
    from qkv.runtime import cpu_threads
    from qkv.serve.app import Served, create_app
    from qkv.serve.scheduler import Scheduler
    from qkv.serve.server import running

    torch.set_num_threads(cpu_threads())
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig(**SMOLLM2)).eval()
    figures = {"after_model_mib": resident_mib()}
    scheduler = Scheduler(model)  # qkv serve's defaults
    figures["plan"] = str(scheduler.plan)
    served = Served(name="smollm2", scheduler=scheduler, encode=lambda s: [1] * len(s),
                    decode=lambda ids: "".join(f" {i}" for i in ids))
    system = torch.randint(0, 49152, (args.system,)).tolist()
    prompts = [system + [100 + i, 200 + i, 300 + i] for i in range(args.requests)]
    with running(create_app(served)) as url:
        figures["after_start_mib"] = resident_mib()
        client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
        figures["first_answer_s"] = ask(client, [1, 2, 3], 4)[1]  # the first request after the start: 4 tokens
        alone = [ask(client, p, args.tokens) for p in prompts[:2]]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.requests) as pool:
            together = list(pool.map(lambda p: ask(client, p, args.tokens), prompts))
        wall = time.perf_counter() - t0
        figures["after_requests_mib"] = resident_mib()
    figures.update(
        one_at_a_time_tokens_per_s=args.tokens / statistics.median(t for _, t in alone),
        one_at_a_time_ttft_s=statistics.median(f for f, _ in alone),
        concurrent_tokens_per_s=args.requests * args.tokens / wall,
        concurrent_median_ttft_s=statistics.median(f for f, _ in together),
        concurrent_wall_s=wall, shared_blocks=scheduler.stats["shared_blocks"],
        max_blocks_used=scheduler.stats["max_blocks_used"], preempted=scheduler.stats["preempted"])
    figures["speedup"] = figures["concurrent_tokens_per_s"] / figures["one_at_a_time_tokens_per_s"]
    print(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
