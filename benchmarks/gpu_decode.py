"""benchmarks.gpu's decode section: batch-1 greedy decoding of a Llama-shaped 1 B model in bf16 on one GPU.

Random weights (no download): a transformers ``LlamaForCausalLM`` of the shape below, loaded into qkv with
``qkv.interop.from_hf``. Rows: Hugging Face ``generate`` with its dynamic cache and with
``cache_implementation="static"`` (which transformers compiles itself on a GPU: ``torch.compile``,
mode "reduce-overhead"), qkv's eager, inductor and cudagraph backends, and qkv with int8 weight-only weights
(torchao) on the default backend. Each: the steady tokens/s of later calls (the steps a call of n tokens takes
beyond one of n/2: the prefill and the graph each ``generate`` records are paid once a call, and shown apart; the
first call's seconds, compiling included, beside it), as a fraction of the memory roofline measured in the same
run (the GB/s of a large device-to-device copy ÷ the bytes of weights each token reads, as stored: the int8 row's
own) and as × HF static. Each qkv row's
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
    """Bytes of weights one decode step reads: every parameter but the input embedding table (one row of it), as
    stored (a quantised weight's int8 values and scales, not the float type it stands for)."""
    embed = model.embed.tok.weight
    return sum(stored_bytes(p) for p in model.parameters() if p is not embed)


def stored_bytes(t: torch.Tensor) -> int:
    """The bytes a tensor's storage holds: a tensor subclass (torchao's Int8Tensor) counted by its inner tensors."""
    if hasattr(t, "__tensor_flatten__") and type(t) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(stored_bytes(getattr(t, name)) for name in names)
    return t.numel() * t.element_size()


def timed(run, device: str, tokens: int) -> dict:
    """{first_s, seconds, call_s, tokens, warned} of ``run(n) -> tokens (1, T + n)``: a first call (compiling or
    recording), then calls of ``tokens // 2`` and ``tokens`` new tokens. ``seconds``: ``tokens`` at the rate of
    the second half of the steps (``steady_seconds``), so that what every call pays once — the prefill, the CUDA
    graph each ``generate`` records anew — is not counted as decoding; ``call_s``: that once-a-call cost.
    ``warned``: the backend's fallback lines, if any."""
    from qkv.generation import BackendFallback

    half = max(1, tokens // 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BackendFallback)
        first, _ = clocked(run, device, tokens)
        short, _ = clocked(run, device, half)
        full, out = clocked(run, device, tokens)
    warned = sorted({str(w.message) for w in caught if issubclass(w.category, BackendFallback)})
    seconds = steady_seconds(short, full, half, tokens)
    return dict(first_s=first, seconds=seconds, call_s=max(0.0, full - seconds), tokens=out.cpu(), warned=warned)


def clocked(run, device: str, n: int) -> tuple[float, torch.Tensor]:
    """(seconds, tokens) of ``run(n)``, the device waited for."""
    t0 = time.perf_counter()
    out = run(n)
    sync(device)
    return time.perf_counter() - t0, out


def steady_seconds(short_s: float, long_s: float, short: int, long: int) -> float:
    """Seconds of ``long`` steps at the rate of the steps that a call of ``long`` takes beyond one of ``short``:
    the per-call cost cancels. Where noise makes the long call no slower, its whole time per step."""
    if long <= short:
        raise ValueError(f"the long call must take more steps than the short one, got {long} and {short}")
    extra = long_s - short_s
    return extra * long / (long - short) if extra > 0 else long_s


def runs(hf, model, ids) -> dict:
    """Each row's name -> a function decoding n tokens, in order of importance (the budget may cut the last)."""
    def qkv_run(backend):
        return lambda n: model.generate(ids, n, temperature=0, backend=backend)

    def int8(n):
        return int8_model(model).generate(ids, n, temperature=0)

    def hf_kw(n):
        return dict(max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return {"qkv eager": qkv_run("eager"), "qkv cudagraph": qkv_run("cudagraph"),
            "HF generate, dynamic cache": lambda n: hf.generate(ids, **hf_kw(n)),
            "HF generate, static cache (compiled)": lambda n: hf.generate(ids, cache_implementation="static",
                                                                          **hf_kw(n)),
            "qkv int8 weights (default backend)": int8, "qkv inductor": qkv_run("inductor")}


QUANTISED: dict[int, object] = {}  # id(model) -> its int8 copy (the bf16 rows keep theirs), made on first use


def int8_model(model):
    """``model``'s int8 weight-only copy, made once (its row decodes with it; its roofline counts its bytes)."""
    from qkv.kernels.quant import quantize_weights

    if id(model) not in QUANTISED:
        QUANTISED.clear()
        QUANTISED[id(model)] = quantize_weights(copy.deepcopy(model), "int8")
    return QUANTISED[id(model)]


def measure(device: str = "cuda", tiny: bool = False, tokens: int = 256, budget_s: float = BUDGET_S) -> dict:
    """The section's measurements: {"roofline": (tok/s, GB/s, bytes), name: timed's dict or {"error": …}}."""
    from qkv.interop import from_hf

    start = time.perf_counter()
    hf = llama(device, tiny)
    model = from_hf(hf, dtype=torch.bfloat16).to(device).eval()
    ids = torch.randint(0, hf.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0)).to(device)
    gbps = copy_gbps(device, (2 << 20) if tiny else (1 << 30))
    nbytes = weight_bytes(model)
    found = {"roofline": (gbps * 1e9 / nbytes, gbps, nbytes)}
    for name, run in runs(hf, model, ids).items():
        if time.perf_counter() - start > budget_s:
            found[name] = {"error": f"not run: the section's {budget_s:.0f} s budget was spent"}
            continue
        try:
            found[name] = timed(run, device, tokens)
            if name.startswith("qkv int8"):  # its roofline: the bytes its own weights take
                found[name]["bytes"] = weight_bytes(int8_model(model))
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
        tps, roof_here = tokens / got["seconds"], gbps * 1e9 / got.get("bytes", nbytes)
        notes = [f"first call {got['first_s']:.1f} s, later calls {got['call_s']:.2f} s each before the steady steps"]
        if "bytes" in got:
            notes.append(f"roofline {roof_here:.0f} tok/s for its {got['bytes'] / 1e6:.1f} MB of weights a token")
        if static_tps:
            notes.append(f"{tps / static_tps:.2f} × HF static")
        if name.startswith("qkv"):
            notes.append(agreement(got["tokens"], eager))
        if name.startswith("qkv int8") and bf16_tps:
            notes.append(f"{tps / bf16_tps:.2f} × qkv cudagraph bf16")
        notes += got["warned"]
        rows.append([f"decode: {name}", f"{tps:.0f} tok/s", f"{tps / roof_here:.3f} × roofline", "; ".join(notes)])
    return rows
