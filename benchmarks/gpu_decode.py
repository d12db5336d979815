"""benchmarks.gpu's decode section: batch-1 greedy decoding of a Llama-shaped 1 B model in bf16 on one GPU.

Random weights (no download): a transformers ``LlamaForCausalLM`` of the shape below, loaded into qkv with
``qkv.interop.from_hf``. Rows: Hugging Face ``generate`` with its dynamic cache and with
``cache_implementation="static"`` (which transformers compiles itself on a GPU: ``torch.compile``,
mode "reduce-overhead"), qkv's eager, inductor and cudagraph backends, and qkv with int8 weight-only weights
(torchao) on the default backend. Each: tokens/s of a second call (the first call's seconds, compiling or
recording included, beside it), as a fraction of the memory roofline measured in the same run (the GB/s of a
large device-to-device copy ÷ the bytes of weights each token reads) and as × HF static. Each qkv row's
tokens are compared with qkv eager's. A row that breaks says what broke; the others still run. Rows not
started within the section's budget say so.

``--device cpu --tiny`` runs the same code on a tiny model on a CPU (what tests/test_cuda_backend.py checks).
"""
from __future__ import annotations

import copy
import time
import traceback
import warnings

import torch

SHAPE = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
             vocab_size=32_000, intermediate_size=5632, max_position_embeddings=2048)  # TinyLlama-1.1B's
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            intermediate_size=128, max_position_embeddings=256)
PROMPT = 8  # tokens of the prompt
BUDGET_S = 120.0  # rows not started by then are skipped: the whole check stays within its minutes
QKV_ROWS = ("eager", "cudagraph", "inductor")


def llama(device: str, tiny: bool):
    """A random bf16 LlamaForCausalLM of SHAPE (or TINY) on ``device``, never stopping at an eos."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**(TINY if tiny else SHAPE), tie_word_embeddings=False, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = None
    return model


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def copy_gbps(device: str, nbytes: int, repeats: int = 10) -> float:
    """GB/s of a device-to-device copy of ``nbytes`` (each copy reads and writes them: 2 × nbytes moved)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        b.copy_(a)
    sync(device)
    return 2 * nbytes * repeats / (time.perf_counter() - t0) / 1e9


def weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every parameter but the input embedding table (one row of it)."""
    embed = model.embed.tok.weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed)


def timed_twice(run, device: str) -> dict:
    """{first_s, seconds, tokens, warned} of two calls of ``run() -> tokens (1, T + n)``: the first compiles or
    records, the second is timed; ``warned``: the backend's fallback lines, if any."""
    from qkv.generation import BackendFallback

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BackendFallback)
        t0 = time.perf_counter()
        run()
        sync(device)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        tokens = run()
        sync(device)
    warned = sorted({str(w.message) for w in caught if issubclass(w.category, BackendFallback)})
    return dict(first_s=first, seconds=time.perf_counter() - t0, tokens=tokens.cpu(), warned=warned)


def runs(hf, model, ids, tokens: int) -> dict:
    """Each row's name -> a function running its decode, in order of importance (the budget may cut the last)."""
    from qkv.kernels.quant import quantize_weights

    def qkv_run(backend):
        return lambda: model.generate(ids, tokens, temperature=0, backend=backend)

    int8_model = []  # a quantised copy (the bf16 rows keep theirs), made on the row's first call

    def int8():
        if not int8_model:
            int8_model.append(quantize_weights(copy.deepcopy(model), "int8"))
        return int8_model[0].generate(ids, tokens, temperature=0)

    hf_kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    return {"qkv eager": qkv_run("eager"), "qkv cudagraph": qkv_run("cudagraph"),
            "HF generate, dynamic cache": lambda: hf.generate(ids, **hf_kw),
            "HF generate, static cache (compiled)": lambda: hf.generate(ids, cache_implementation="static", **hf_kw),
            "qkv int8 weights (default backend)": int8, "qkv inductor": qkv_run("inductor")}


def measure(device: str = "cuda", tiny: bool = False, tokens: int = 256, budget_s: float = BUDGET_S) -> dict:
    """The section's measurements: {"roofline": (tok/s, GB/s, bytes), name: timed_twice's dict or {"error": …}}."""
    from qkv.interop import from_hf

    start = time.perf_counter()
    hf = llama(device, tiny)
    model = from_hf(hf, dtype=torch.bfloat16).to(device).eval()
    ids = torch.randint(0, hf.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0)).to(device)
    gbps = copy_gbps(device, (2 << 20) if tiny else (1 << 30))
    nbytes = weight_bytes(model)
    found = {"roofline": (gbps * 1e9 / nbytes, gbps, nbytes)}
    for name, run in runs(hf, model, ids, tokens).items():
        if time.perf_counter() - start > budget_s:
            found[name] = {"error": f"not run: the section's {budget_s:.0f} s budget was spent"}
            continue
        try:
            found[name] = timed_twice(run, device)
        except Exception as e:  # noqa: BLE001 — a row that breaks says so; the others still run
            traceback.print_exc()
            found[name] = {"error": f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:140] if str(e) else ''}"}
    return found


def agreement(tokens, reference) -> str:
    """"tokens = qkv eager" or where they first differ."""
    if reference is None:
        return "no eager tokens to compare"
    if tokens.shape == reference.shape and torch.equal(tokens, reference):
        return "tokens = qkv eager"
    n = min(tokens.size(1), reference.size(1))
    differ = (tokens[0, :n] != reference[0, :n]).nonzero()  # (k, 1)
    first = int(differ[0]) if len(differ) else n
    return f"tokens differ from qkv eager's from new token {first - PROMPT} of {reference.size(1) - PROMPT}"


def decode_rows(device: str = "cuda", tiny: bool = False, tokens: int = 256, budget_s: float = BUDGET_S) -> list[list]:
    """The section's table rows: [what, tok/s, × roofline, details]."""
    found = measure(device, tiny, tokens, budget_s)
    roof, gbps, nbytes = found.pop("roofline")
    shape = "tiny Llama" if tiny else "Llama 1.1 B shape"
    rows = [[f"decode roofline ({shape}, bf16, batch 1)", f"{roof:.0f} tok/s", "1.000 × roofline",
             f"copy {gbps:.1f} GB/s ÷ {nbytes / 1e6:.1f} MB of weights a token; {tokens} new tokens after {PROMPT}"]]
    eager = found.get("qkv eager", {}).get("tokens")
    static = found.get("HF generate, static cache (compiled)", {})
    static_tps = tokens / static["seconds"] if "seconds" in static else None
    bf16_tps = tokens / found["qkv cudagraph"]["seconds"] if "seconds" in found.get("qkv cudagraph", {}) else None
    for name, got in found.items():
        if "error" in got:
            rows.append([f"decode: {name}", "FAILED" if got["error"].startswith("FAILED") else "not run", "",
                         got["error"]])
            continue
        tps = tokens / got["seconds"]
        notes = [f"first call {got['first_s']:.1f} s"]
        if static_tps:
            notes.append(f"{tps / static_tps:.2f} × HF static")
        if name.startswith("qkv"):
            notes.append(agreement(got["tokens"], eager))
        if name.startswith("qkv int8") and bf16_tps:
            notes.append(f"{tps / bf16_tps:.2f} × qkv cudagraph bf16")
        notes += got["warned"]
        rows.append([f"decode: {name}", f"{tps:.0f} tok/s", f"{tps / roof:.3f} × roofline", "; ".join(notes)])
    return rows
