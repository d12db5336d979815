"""Weight-only int8 (``--weights int8``, ``qkv.kernels.quant``): its decoding speed beside fp32 and bf16, and its cost.

    python -m benchmarks.quant [--quick] [--run DIR] [--no-compile]   # prints the tables
    python -m benchmarks.quant --markdown docs                        # and docs/generated/quant.md, .zh.md, .json

Speed: batch-1 greedy decoding (prompt 16 tokens, ``--tokens`` new) of random models of two shapes — the demo
preset and a larger one (d 512, 8 layers) — with fp32 weights, bf16 weights and int8 weights (fp32 activations),
each on the auto backend (the model's forward, its plain linears through qkv's CPU kernels) and on inductor's
compiled step; all calls of a shape interleaved in one process, medians of ``--repeats``.
Quality: held-out bits per character of a trained run (``--run``; without one, ``qkv train --preset demo
--max-minutes 2`` trains one into a temporary directory), fp32 against int8, on the run's whole held-out text.
Logits: a random small Llama, saved by ``save_pretrained`` and loaded through ``qkv.interop.from_hf``: the largest
difference of int8's logits from fp32's over a batch of random ids, absolute and over the largest fp32 logit.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

import qkv
from qkv.kernels.quant import quantize_weights

SHAPES = {"demo": {}, "d512 x 8": dict(d_model=512, attention=dict(num_heads=8), num_layers=8)}  # over the demo preset
PROMPT = 16
BACKENDS = ("auto", "inductor")


def variants(shape: str) -> dict[str, qkv.GPT]:
    """fp32, bf16 and int8 copies of one random model of ``shape``."""
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("demo", **SHAPES[shape])).eval()
    return {"fp32": model, "bf16": copy.deepcopy(model).bfloat16(), "int8": quantize_weights(copy.deepcopy(model))}


def weight_megabytes(model) -> float:
    """MB of the weights a decoded token reads: every parameter but the embedding table (one row a token; a tied
    head counted once), int8 weights at one byte an entry plus their scales."""
    total, seen = 0, {id(model.embed.tok.weight)} - {id(model.lm_head.weight)}
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        inner = [p.qdata, p.scale] if hasattr(p, "qdata") else [p]
        total += sum(t.numel() * t.element_size() for t in inner)
    return total / 1e6


def decode_speed(shape: str, new: int, repeats: int, backends) -> list[list]:
    """Rows (weights, backend, MB per token, tok/s, against fp32 on the same backend) for one shape."""
    from .common import time_interleaved

    models = variants(shape)
    ids = torch.randint(0, models["fp32"].config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    calls = {(w, b): (lambda m=m, b=b: m.generate(ids, new, temperature=0, backend=b))
             for w, m in models.items() for b in backends}
    with torch.inference_mode():
        for fn in calls.values():  # compiles inductor's steps before the clock
            fn()
        seconds = time_interleaved(calls, repeats=repeats, warmup=1)
    return [[shape, w, b, f"{weight_megabytes(models[w]):.1f}", f"{new / seconds[w, b]:.0f}",
             f"{seconds['fp32', b] / seconds[w, b]:.2f}x"] for (w, b) in calls]


def trained_run(args) -> Path:
    """``--run``, or a demo run trained for two minutes into a temporary directory."""
    if args.run is not None:
        return args.run
    from qkv.cli import main as qkv_main

    out = Path(tempfile.mkdtemp(prefix="qkv-quant-")) / "demo"
    if qkv_main(["train", "--preset", "demo", "--max-minutes", "2", "--quiet", "--sample-tokens", "0",
                 "--device", "cpu", "--out", str(out)]) != 0:
        raise SystemExit("qkv train failed: no run to measure the quality on")
    return out


def quality(run_dir: Path) -> dict:
    """Held-out bits per character of a trained run, fp32 and int8 weights."""
    from qkv.data import load_corpus
    from qkv.training.run_dir import load_run
    from qkv.training.tasks.language_model import held_out_bpc

    run = load_run(run_dir)
    cfg = json.loads((run_dir / "train_config.json").read_text())
    text, T = load_corpus(cfg["data"]).val, cfg["context"] or run.config.max_len
    with torch.inference_mode():
        bpc = {"fp32": held_out_bpc(run.model, run.tokenizer, text, T),
               "int8": held_out_bpc(quantize_weights(copy.deepcopy(run.model)), run.tokenizer, text, T)}
    stored = json.loads((run_dir / "summary.json").read_text())["val_bpc"]
    return {"parameters": run.model.num_parameters(), "chars": len(text), "summary_bpc": stored, **bpc}


def hf_logits() -> dict:
    """The int8 logits' distance from fp32's for a random small Llama loaded from its save_pretrained directory."""
    import transformers

    from qkv.interop import from_hf

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
    with tempfile.TemporaryDirectory() as d:
        transformers.LlamaForCausalLM(config).save_pretrained(d)
        model = from_hf(d).eval()
    ids = torch.randint(0, config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        want = model(ids).logits
        got = quantize_weights(copy.deepcopy(model))(ids).logits
    gap = (got - want).abs().max().item()
    same = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    return {"model": "Llama (hidden 256, 4 layers, 8 heads / 4 kv heads, vocab 1024, random)", "max_abs": gap,
            "relative": gap / want.abs().max().item(), "argmax_agree": same, "positions": ids.numel()}


HEADER = {"en": ["model", "weights", "backend", "MB read per token", "tokens/s", "against fp32"],
          "zh": ["模型", "权重", "后端", "每 token 读取 MB", "tokens/s", "相对 fp32"]}


def render(saved: dict, lang: str) -> str:
    """The generated page's body: the speed table, then the quality and logits lines."""
    from .common import table

    q, h = saved["quality"], saved["logits"]
    en = lang == "en"
    speed = table(saved["speed"], HEADER[lang])
    cost = (f"{q['bpc_delta']:+.6f} bits per character ({q['int8']:.6f} against fp32's {q['fp32']:.6f}, "
            f"{q['int8'] / q['fp32'] - 1:+.4%}) on the {q['chars']:,} held-out characters of a demo run "
            f"({q['parameters'] / 1e6:.2f} M parameters, {q['trained']})" if en else
            f"每字符比特 {q['bpc_delta']:+.6f}（int8 {q['int8']:.6f}，fp32 {q['fp32']:.6f}，{q['int8'] / q['fp32'] - 1:+.4%}），"
            f"在一个 demo 运行（{q['parameters'] / 1e6:.2f} M 参数，{q['trained']}）的 {q['chars']:,} 个留出字符上")
    logits = (f"{h['model']}, loaded through qkv.interop.from_hf: int8 logits differ from fp32's by at most "
              f"{h['max_abs']:.4f} ({h['relative']:.2%} of the largest fp32 logit); the argmax agrees at "
              f"{h['argmax_agree']:.1%} of {h['positions']} positions" if en else
              f"{h['model']}，经 qkv.interop.from_hf 载入：int8 的 logits 与 fp32 相差至多 {h['max_abs']:.4f}"
              f"（最大 fp32 logit 的 {h['relative']:.2%}）；{h['positions']} 个位置中 argmax 一致的比例为 "
              f"{h['argmax_agree']:.1%}")
    gpu = ("GPU figures need a GPU run (not measured here)." if en else "GPU 上的数字需要在 GPU 上运行（此处未测）。")
    if en:
        return f"{speed}\n\nQuality: {cost}.\n\nLogits: {logits}.\n\n{gpu}"
    return f"{speed}\n\n质量：{cost}。\n\nLogits：{logits}。\n\n{gpu}"


def main(argv=None) -> str:
    from qkv.runtime import cpu_threads, machine, source_commit

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="32 new tokens, 3 repeats")
    p.add_argument("--tokens", type=int, default=128, help="new tokens per decode (default 128)")
    p.add_argument("--repeats", type=int, default=5, help="timed decodes per variant (the median is reported)")
    p.add_argument("--run", type=Path, default=None, help="a trained LM run (default: train a demo run for 2 minutes)")
    p.add_argument("--no-compile", action="store_true", help="the auto backend only")
    p.add_argument("--markdown", metavar="DOCS", default=None, help="write DOCS/generated/quant.md (.zh.md, .json)")
    p.add_argument("--from-json", type=Path, metavar="FILE", default=None,
                   help="measure nothing: write the pages again from a saved run (DOCS/generated/quant.json)")
    args = p.parse_args(argv)
    if args.from_json is not None:
        return publish(json.loads(args.from_json.read_text(encoding="utf-8")), args.markdown)
    stamp = f"{time.strftime('%Y-%m-%d')}, commit {source_commit()}, {machine()}"  # the source measured, at the start
    new, repeats = (32, 3) if args.quick else (args.tokens, args.repeats)
    torch.set_num_threads(cpu_threads())  # as `qkv sample` does
    backends = BACKENDS[:1] if args.no_compile else BACKENDS
    speed = [row for shape in SHAPES for row in decode_speed(shape, new, repeats, backends)]
    print(speed, flush=True)
    run_dir = trained_run(args)
    q = quality(run_dir)
    q["bpc_delta"] = q["int8"] - q["fp32"]
    q["trained"] = "qkv train --preset demo --max-minutes 2" if args.run is None else f"the run {args.run.name}"
    saved = {"stamp": stamp,
             "command": "python -m benchmarks.quant " + " ".join(sys.argv[1:] if argv is None else argv),
             "speed": speed, "quality": q, "logits": hf_logits()}
    return publish(saved, args.markdown)


def publish(saved: dict, docs: str | None) -> str:
    """Print the English page's body; with ``docs``, write DOCS/generated/quant.md, .zh.md and .json."""
    from .common import write_generated

    if docs:
        write_generated(Path(docs), "quant", saved, lambda lang: render(saved, lang))
    text = render(saved, "en")
    print(text)
    return text


if __name__ == "__main__":
    main()
