"""Batch-1 greedy decoding of mixture-of-experts models: qkv's backends vs Hugging Face ``generate``, on a CPU.

    python -m benchmarks.moe_decode [--quick] [--threads 2] [--markdown docs]

Models: random-initialised ``Qwen3MoeForCausalLM`` (d_model 512, 8 layers, 8 query / 4 KV heads of 64, 32 experts
of width 256, top-4, renormalised, every layer MoE) and ``MixtralForCausalLM`` (d_model 512, 8 layers, 8 / 4 heads,
8 experts of width 1024, top-2), vocabulary 32000, untied head, fp32; the routers' weights × 10 so that routing
decides (no near-tie for rounding to flip between the two implementations). Saved with ``save_pretrained`` and
loaded by ``qkv.interop.from_hf``: the same weights on both sides. Prompt 16 tokens, 32 new (16 with --quick).

Contenders, called round-robin in one process (each time the median of its rounds, so ratios come from the same
rounds): qkv ``backend="eager"`` (the modules as written), ``"auto"`` (for an MoE model on a CPU the fused C++ step
where it accepts the model, as here: one parallel region a token, the chosen experts' weights read in place; the
backend that ran is in the table), ``"inductor"`` (the one-token step compiled, its MoE layers through qkv's MoE
kernel; the compile is the untimed first call), HF ``generate(do_sample=False)`` with its default cache, and with
``cache_implementation="static"``. Every contender's tokens are asserted equal to qkv eager's.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from qkv.generation.backends import choose
from qkv.interop import from_hf

from .common import inductor_cache_per_capability, isa_profile, machine_info, table, time_interleaved, write_generated

COMMON = dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
              max_position_embeddings=1024, tie_word_embeddings=False)
SHAPES = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        head_dim=64, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=256, intermediate_size=1024,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(
        num_local_experts=8, num_experts_per_tok=2, intermediate_size=1024, sliding_window=None)),
}
PROMPT = 16


def hf_model(kind: str):
    """A random-initialised HF model of ``kind`` (a key of SHAPES), routers × 10, in eval mode."""
    import transformers

    config_name, model_name, extra = SHAPES[kind]
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**COMMON, **extra)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.mul_(10)
    return model


def contenders(model, hf, ids: torch.Tensor, new: int) -> dict:
    """{name: one greedy decode of ``new`` tokens after ``ids`` -> the new tokens (1, new)}."""
    def hf_generate(**kw):
        return lambda: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                   do_sample=False, pad_token_id=0, **kw)[:, ids.size(1):]
    def qkv(backend):
        return lambda: model.generate(ids, new, temperature=0, backend=backend, eos_id=None)[:, ids.size(1):]
    return {"qkv eager": qkv("eager"), "qkv auto": qkv("auto"), "qkv inductor": qkv("inductor"),
            "HF generate": hf_generate(), "HF generate, static cache": hf_generate(cache_implementation="static")}


def measure(kind: str, new: int, repeats: int) -> list:
    """One row: the model, each contender's tokens/s, the ratios of qkv's to HF's (default and static cache)."""
    hf = hf_model(kind)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        model = from_hf(d).eval()
    ids = torch.randint(0, COMMON["vocab_size"], (1, PROMPT), generator=torch.Generator().manual_seed(1))
    calls = contenders(model, hf, ids, new)
    with torch.inference_mode():
        tokens = {name: fn() for name, fn in calls.items()}  # also inductor's compile
        wrong = [name for name, t in tokens.items() if not torch.equal(t, tokens["qkv eager"])]
        assert not wrong, f"{kind}: {wrong} decoded other tokens than qkv eager"
        seconds = time_interleaved(calls, repeats=repeats, warmup=0)
    rate = {name: new / s for name, s in seconds.items()}
    ratios = [f"{rate[q] / rate[h]:.2f}×" for q in ("qkv auto", "qkv inductor")
              for h in ("HF generate", "HF generate, static cache")]
    ran = choose(model, 1, "auto")
    return [kind, f"{model.num_parameters() / 1e6:.0f} M", ran, *[f"{r:.1f}" for r in rate.values()], *ratios]


HEADER = {"en": ["model", "parameters", "auto ran", "qkv eager tok/s", "qkv auto tok/s", "qkv inductor tok/s",
                 "HF tok/s", "HF static-cache tok/s", "auto / HF", "auto / HF static", "inductor / HF",
                 "inductor / HF static"],
          "zh": ["模型", "参数", "auto 实际后端", "qkv eager tok/s", "qkv auto tok/s", "qkv inductor tok/s",
                 "HF tok/s", "HF 静态缓存 tok/s", "auto / HF", "auto / HF 静态", "inductor / HF",
                 "inductor / HF 静态"]}
NOTE = {"en": "batch 1, prompt {p}, {n} new tokens, greedy, fp32, {t} threads; medians of round-robin rounds in one "
              "process; every contender's tokens equal qkv eager's (asserted).",
        "zh": "batch 1，提示 {p} 个 token，生成 {n} 个，贪心，fp32，{t} 个线程；同一进程内轮流调用各轮的中位数；"
              "各方生成的 token 与 qkv eager 相同（已断言）。"}


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="16 new tokens, 2 rounds (else 32 and 3)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--markdown", metavar="DOCS", default=None, help="write DOCS/generated/moe_decode.md, .zh.md, .json")
    args = p.parse_args(argv)
    from qkv.runtime import machine, source_commit

    torch.set_num_threads(args.threads)
    inductor_cache_per_capability()
    print(machine_info())
    new, repeats = (16, 2) if args.quick else (32, 3)
    rows = []
    for kind in SHAPES:
        rows.append(measure(kind, new, repeats))
        print(f"{kind} done", file=sys.stderr, flush=True)
    note = {lang: text.format(p=PROMPT, n=new, t=args.threads) for lang, text in NOTE.items()}
    saved = {"stamp": f"{time.strftime('%Y-%m-%d')}, commit {source_commit()}, {machine()}, {isa_profile()}",
             "command": "python -m benchmarks.moe_decode " + " ".join(argv if argv is not None else sys.argv[1:]),
             "rows": rows}
    if args.markdown:
        write_generated(Path(args.markdown), "moe_decode", saved,
                        lambda lang: table(saved["rows"], HEADER[lang]) + "\n\n" + note[lang])
    out = table(rows, HEADER["en"])
    print(out)
    print(note["en"])
    print(json.dumps({"stamp": saved["stamp"]}))
    return out


if __name__ == "__main__":
    main()
