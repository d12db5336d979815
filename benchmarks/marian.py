"""Beam-search translation speed: qkv (``Transformer.generate``: cross K/V projected once per source,
static KV cache) vs Hugging Face ``MarianMTModel.generate`` on the same weights; tokens must agree.

    python -m benchmarks.marian [--quick] [--profile]

A random MarianMTModel of opus-mt-en-zh's shape (d_model 512, 6 + 6 layers, 8 heads, FFN 2048, 65 001
tokens; --quick: d_model 256, 3 + 3 layers, 16 001 tokens) with opus-mt's generation config
(beam 4, length penalty 1.0, pad suppressed and renormalised, forced EOS), loaded into qkv with
``from_hf``. Batches of 1, 8 and 32 right-padded sources of 6-30 tokens; at most 48 new tokens (24 with
--quick); random weights never choose EOS, so every hypothesis runs to that length. Best of 3 rounds
(2 with --quick), qkv and HF interleaved, after a warm-up; wall and CPU seconds. On a CPU both spend
most of their time in the same matrix products (the 65 001-way output projection above all); on a
busy machine OMP_NUM_THREADS=1 gives steadier numbers.
"""
from __future__ import annotations

import argparse
import time

import torch

from qkv.interop import from_hf
from qkv.interop.hf import marian_special

from .common import machine_info, sync, table

OPUS_EN_ZH = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
                  encoder_ffn_dim=2048, decoder_ffn_dim=2048, vocab_size=65001)
QUICK = dict(OPUS_EN_ZH, d_model=256, encoder_layers=3, decoder_layers=3, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
             vocab_size=16001)
EOS = 0


def random_marian(shape: dict, *, seed: int = 0):
    """A MarianMTModel with HF's random initialisation and opus-mt's special tokens and generation config."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    pad = shape["vocab_size"] - 1
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**shape, max_position_embeddings=512, activation_function="swish",
                                       scale_embedding=True, pad_token_id=pad, decoder_start_token_id=pad,
                                       eos_token_id=EOS, forced_eos_token_id=EOS))
    with torch.no_grad():  # random weights never pick EOS: every hypothesis runs to max_new_tokens
        model.final_logits_bias.normal_(0, 0.5)
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]], decoder_start_token_id=pad, eos_token_id=EOS, forced_eos_token_id=EOS, pad_token_id=pad,
        max_length=512, num_beams=4, renormalize_logits=True)
    return model.eval()


def sources(vocab: int, *, batch: int = 32, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded source ids (B, S) ending in EOS, and the mask of real tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, 31, (batch,), generator=g)
    mask = torch.arange(int(lengths.max())) < lengths[:, None]  # (B, S)
    ids = torch.randint(2, vocab - 1, mask.shape, generator=g).masked_fill(~mask, vocab - 1)
    ids[torch.arange(batch), lengths - 1] = EOS
    return ids, mask


def timed(calls: dict, repeats: int) -> dict[str, tuple[float, float]]:
    """Each call's best wall and CPU (process) seconds over ``repeats`` rounds, calls interleaved
    round-robin so that another process's load hits both alike."""
    best = {name: (float("inf"), float("inf")) for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            sync()
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            sync()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def run_batch(model, hf, special, shape: dict, batch: int, new: int, repeats: int, profile_ops: bool) -> list:
    """One row: qkv and HF beam search over the same ``batch`` sources; asserts identical tokens."""
    device = next(model.parameters()).device
    src, mask = (t.to(device) for t in sources(shape["vocab_size"], batch=batch))
    calls = {"qkv": lambda: model.generate(src, src_mask=mask, max_new_tokens=new, num_beams=4, special=special),
             "HF": lambda: hf.generate(input_ids=src, attention_mask=mask.long(), max_new_tokens=new, num_beams=4)}
    with torch.inference_mode():
        ours, theirs = calls["qkv"](), calls["HF"]()  # the tokens, and a warm-up
        assert ours.tolist() == theirs.tolist(), "qkv and HF generated different tokens"
        (t_ours, cpu_ours), (t_hf, cpu_hf) = timed(calls, repeats).values()
        if profile_ops:
            profile(calls)
    return [batch, src.size(1), 4, new, f"{t_ours:.2f}", f"{t_hf:.2f}", f"{t_hf / t_ours:.2f}x",
            f"{cpu_ours:.2f}", f"{cpu_hf:.2f}", f"{cpu_hf / cpu_ours:.2f}x"]


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smaller model, 24 new tokens, two timed rounds")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32], help="numbers of sentences (default: 1 8 32; "
                   "one sentence is 4 rows a step, which go to qkv's kernel)")
    p.add_argument("--profile", action="store_true", help="print torch.profiler's top operators for both")
    args = p.parse_args(argv)
    print(machine_info())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape, new, repeats = (QUICK, 24, 2) if args.quick else (OPUS_EN_ZH, 48, 3)
    hf = random_marian(shape).to(device)
    model = from_hf(hf).to(device)
    special = marian_special({**hf.config.to_dict(), **hf.generation_config.to_dict()})
    print(f"model: {shape}, {model.num_parameters() / 1e6:.0f} M parameters; HF attention: "
          f"{hf.config._attn_implementation}; random weights never choose EOS: {new} new tokens per hypothesis")
    rows = [run_batch(model, hf, special, shape, b, new, repeats, args.profile) for b in args.batches]
    out = table(rows, ["sentences", "source len", "beams", "max new", "qkv s", "HF s", "HF / qkv",
                       "qkv CPU s", "HF CPU s", "HF / qkv CPU"])
    print(out)
    print("qkv and HF generated identical tokens (asserted)")
    return out


def profile(calls: dict) -> None:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    for name, fn in calls.items():
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        print(f"\n{name}:\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
