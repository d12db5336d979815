"""`qkv serve`'s throughput: completion tokens per second at 1, 4, 8 and 32 concurrent clients, against one at a time.

    python -m benchmarks.serve                     # prints the table
    python -m benchmarks.serve --markdown docs     # and writes docs/generated/serve.md (.zh.md, .json)

Each model (random weights: the speed of a step does not depend on them) is served on loopback as `qkv serve` serves
it (``qkv.serve``: the scheduler under FastAPI and uvicorn, in this process) and asked by the official ``openai`` client:
``--requests`` completions of ``--tokens`` tokens each, greedy, no end of sequence, sent by C threads at once. A
concurrency's figure is the median of ``--repeats`` rounds, the rounds interleaved over the concurrencies.
"""
from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

SHAPES = {"tiny": dict(max_len=128), "demo": dict()}  # qkv's presets, as the tests and `make demo` train them
CONCURRENCY = (1, 4, 8, 32)


def served_model(preset: str):
    """A ``Served`` for a random model of ``preset``: prompts are token ids, text is the ids written out."""
    import torch

    import qkv
    from qkv.serve.app import Served
    from qkv.serve.scheduler import Scheduler

    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset(preset, **SHAPES[preset])).eval()
    text = lambda ids: "".join(f" {i}" for i in ids)  # noqa: E731
    return Served(name=preset, scheduler=Scheduler(model, max_batch=32, max_queue=64), encode=lambda s: [1] * len(s),
                  decode=text)


def tokens_per_second(url: str, model: str, clients: int, requests: int, tokens: int) -> float:
    """Completion tokens per second of ``requests`` requests sent by ``clients`` threads."""
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

    def ask(i: int) -> int:
        return client.completions.create(model=model, prompt=[1 + i % 7, 2, 3], max_tokens=tokens,
                                         temperature=0).usage.completion_tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = sum(pool.map(ask, range(requests)))
    return done / (time.perf_counter() - t0)


def measure(preset: str, requests: int, tokens: int, repeats: int) -> dict[int, float]:
    """Median tokens/s at each concurrency, over interleaved rounds."""
    from qkv.serve.app import create_app
    from qkv.serve.server import running

    rates: dict[int, list[float]] = {c: [] for c in CONCURRENCY}
    with running(create_app(served_model(preset))) as url:
        tokens_per_second(url, preset, 4, 4, tokens)  # warm-up
        for _ in range(repeats):
            for c in CONCURRENCY:
                rates[c].append(tokens_per_second(url, preset, c, max(requests, c), tokens))
    return {c: statistics.median(r) for c, r in rates.items()}


def table(saved: dict, lang: str) -> str:
    from .common import table as markdown

    rows = []
    for preset, rates in saved["results"].items():
        one = rates["1"]
        rows += [[preset, c, f"{rate:.0f}", f"{rate / one:.1f} ×"] for c, rate in rates.items()]
    header = (["model", "concurrent clients", "tokens/s", "against one at a time"] if lang == "en" else
              ["模型", "并发客户端", "tokens/s", "相对逐个处理"])
    return markdown(rows, header)



def main(argv=None) -> str:
    import torch

    from qkv.runtime import cpu_threads

    from .common import publish

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=32, help="requests per round (at least the concurrency)")
    p.add_argument("--tokens", type=int, default=64, help="completion tokens per request")
    p.add_argument("--repeats", type=int, default=3, help="rounds per concurrency (the median is reported)")
    p.add_argument("--markdown", metavar="DOCS", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(cpu_threads())  # as `qkv serve` does
    results = {preset: {str(c): r for c, r in measure(preset, args.requests, args.tokens, args.repeats).items()}
               for preset in SHAPES}
    saved = {"results": results}
    return publish("serve", saved, lambda lang: table(saved, lang), argv, args.markdown)


if __name__ == "__main__":
    main()
