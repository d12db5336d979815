"""Today's open models at batch 1: qkv's decoding of Qwen2- and Gemma-2-shaped models vs Hugging Face ``generate``,
and the sliding-window ring cache's memory against a full cache.

    python -m benchmarks.open_models [--quick]

Models: random-initialised ``Qwen2ForCausalLM`` (d_model 512, 8 layers, 8 heads, 2 KV heads, q/k/v biased,
d_ff 1280, vocabulary 8000, tied head: 25.3 M parameters) and ``Gemma2ForCausalLM`` (d_model 512, 8 layers,
8 heads, 4 KV heads, head_dim 64, d_ff 1280, sliding window 128 on every other layer, soft caps 50 / 30,
tied head: 26.6 M), saved with ``save_pretrained`` and loaded by ``qkv.interop.from_hf`` — the same weights
on both sides. Prompt 256 tokens, 128 new (32 with --quick), greedy, fp32; contenders interleaved, median
tokens/s. "qkv eager" is ``backend="eager"`` (the reference modules as written), "qkv auto" the default
(linears through ``qkv.kernels``), "qkv fastest" the fused C++ step where ``qkv.kernels.fused_step``
accepts the model, else what ``generate`` falls back to (inductor's compiled step; the first call, the compile,
is not timed), the reason printed.

Ring cache: a Mistral-shaped model (every layer sliding, window W) holds W tokens per layer whatever the
length; a full cache holds the length. Bytes are those of the caches ``new_kv_caches`` allocates for 1×, 4×
and 16× W, beside a ``KVCache`` of the same length.
"""
from __future__ import annotations

import argparse
import tempfile

import torch

from qkv.interop import from_hf
from qkv.generation.backends import backend_for
from qkv.nn.kv_cache import KVCache

from .common import machine_info, table, time_interleaved

SHAPE = dict(vocab_size=8000, hidden_size=512, intermediate_size=1280, num_hidden_layers=8, num_attention_heads=8,
             max_position_embeddings=1024, tie_word_embeddings=True)
PROMPT = 256


def hf_model(kind: str):
    """A random-initialised HF model of ``kind`` ("qwen2", "gemma2"), in eval mode."""
    import transformers

    torch.manual_seed(0)
    if kind == "qwen2":
        config = transformers.Qwen2Config(**SHAPE, num_key_value_heads=2)
    else:
        config = transformers.Gemma2Config(**SHAPE, num_key_value_heads=4, head_dim=64, sliding_window=128,
                                           query_pre_attn_scalar=64, attn_logit_softcapping=50.0,
                                           final_logit_softcapping=30.0)
    config._attn_implementation = "eager"
    cls = transformers.Qwen2ForCausalLM if kind == "qwen2" else transformers.Gemma2ForCausalLM
    return cls(config).eval()


def pair(kind: str):
    """(qkv model, HF model) on the same weights, qkv's read from the HF model's ``save_pretrained``."""
    hf = hf_model(kind)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        model = from_hf(d).eval()
    return model, hf


def contenders(model, hf, ids: torch.Tensor, new: int) -> dict:
    """{name: one greedy decode of ``new`` tokens after ``ids``}."""
    fastest, _ = backend_for(model, 1, "fused")
    return {
        "qkv eager": lambda: model.generate(ids, new, temperature=0, backend="eager"),
        "qkv auto": lambda: model.generate(ids, new, temperature=0),
        "qkv fastest": lambda: model.generate(ids, new, temperature=0, backend=fastest),
        "HF generate": lambda: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                           min_new_tokens=new, do_sample=False, pad_token_id=0)[:, ids.size(1):],
    }


def decode_row(kind: str, new: int, repeats: int) -> list:
    """One table row: the model, its parameters, each contender's tokens/s and its ratio to HF's."""
    model, hf = pair(kind)
    ids = torch.randint(0, SHAPE["vocab_size"], (1, PROMPT), generator=torch.Generator().manual_seed(1))
    calls = contenders(model, hf, ids, new)
    with torch.inference_mode():
        tokens = {name: fn() for name, fn in calls.items()}  # also the compile of the fastest step
        same = all(torch.equal(t[:, -new:], tokens["qkv eager"][:, -new:]) for t in tokens.values())
        seconds = time_interleaved(calls, repeats=repeats, warmup=0)
    hf_rate = new / seconds["HF generate"]
    cells = [f"{new / s:.0f} ({new / s / hf_rate:.2f}×)" for s in seconds.values()]
    chosen, why = backend_for(model, 1, "fused")
    if why:
        print(f"{kind}: {why}")
    return [kind, f"{model.num_parameters() / 1e6:.1f} M", *cells, "yes" if same else "NO", chosen], list(seconds)


def cache_bytes(caches) -> int:
    return sum(b.numel() * b.element_size() for c in caches for b in c.buffers())


def ring_rows(window: int = 128) -> list[list]:
    """Bytes of a Mistral-shaped model's caches at 1×, 4×, 16× the window: ring (qkv's) vs full."""
    import qkv

    config = qkv.ModelConfig(vocab_size=512, d_model=256, num_layers=4, max_len=16 * window,
                             position=dict(kind="rope"),
                             attention=dict(num_heads=4, num_kv_heads=2, sliding_window=window),
                             normalization=dict(kind="rmsnorm"), feed_forward=dict(activation="swiglu", bias=False))
    model = qkv.GPT(config)
    rows = []
    for times in (1, 4, 16):
        n = times * window
        ring = cache_bytes(model.new_kv_caches(1, n))
        full = cache_bytes([KVCache(1, config.kv_heads, n, config.head_dim) for _ in range(config.num_layers)])
        rows.append([f"{times}× W ({n} tokens)", f"{ring:,}", f"{full:,}", f"{full / ring:.0f}×"])
    return rows


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="32 new tokens, 3 repeats")
    args = p.parse_args(argv)
    print(machine_info())
    new, repeats = (32, 3) if args.quick else (128, 3)
    rows, names = [], None
    for kind in ("qwen2", "gemma2"):
        row, names = decode_row(kind, new, repeats)
        rows.append(row)
    out = table(rows, ["model", "parameters", *[f"{n} tok/s" for n in names], "same tokens", "fastest is"])
    print(out)
    print(f"batch 1, prompt {PROMPT}, {new} new tokens, greedy, fp32; ratios to HF generate in the same rounds")
    ring = table(ring_rows(), ["cached length", "ring cache bytes", "full cache bytes", "full / ring"])
    print(ring)
    print("Mistral-shaped: 4 layers, every one sliding, window W = 128, 2 KV heads of 64, fp32, batch 1")
    return out + "\n\n" + ring


if __name__ == "__main__":
    main()
