"""The open families side by side, on the tests' tiny random models: right-padded logits' largest error against
HF eager, 32 greedy tokens against HF ``generate``, ``to_hf`` bit-exact, and what the fused step says.

    python tests/family_table.py        (from the repository root; prints a Markdown table)
"""
import importlib
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import hf_models  # noqa: E402  (beside this file)

from qkv.interop import from_hf, to_hf  # noqa: E402
from qkv.generation import paths  # noqa: E402


def cases() -> dict:
    """{row name: a function building the random HF model}."""
    gemma3, deepseek = (importlib.import_module(m) for m in ("test_interop_gemma3", "test_interop_deepseek"))
    out = {k: (lambda k=k: hf_models.hf_model(k)) for k in hf_models.BUILDERS}
    out |= {f"{k} (no window)": (lambda k=k: hf_models.hf_model(k, use_sliding_window=False)) for k in ("qwen2", "qwen3")}
    out["gemma3_text (linear ×8)"] = lambda: gemma3.hf_model(**gemma3.LINEAR)
    return out | {f"deepseek {v}": (lambda v=v: deepseek.hf_model(v)) for v in deepseek.VARIANTS}


@torch.no_grad()
def row(name: str, hf) -> list[str]:
    """One family's cells, qkv's model read from ``hf``'s save_pretrained."""
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        model = from_hf(d).eval()
    ids = torch.randint(0, hf.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0  # right-padded
    keep = mask.bool()
    err = (model(ids).logits[keep] - hf(ids, attention_mask=mask).logits[keep]).abs().max().item()
    prompt = ids[:1, :12]
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, min_new_tokens=32,
                         do_sample=False, pad_token_id=0)[:, 12:]
    greedy = torch.equal(theirs, model.generate(prompt, 32, temperature=0, backend="eager")[:, -32:])
    back = to_hf(model).state_dict()
    exact = all(torch.equal(back[k], v) for k, v in hf.state_dict().items() if k in back)
    reason = paths.refuses("fused", model)
    return [name, f"{err:.1e}", "yes" if greedy else "NO", "yes" if exact else "NO",
            "accepted" if reason is None else reason.split(" (")[0][:60]]


def main() -> None:
    warnings.simplefilter("ignore")
    print("| family | logits max err (right-padded, vs HF eager) | 32 greedy = HF generate | to_hf bit-exact | fused step |")
    print("|---|---|---|---|---|")
    for name, build in cases().items():
        print("| " + " | ".join(row(name, build())) + " |", flush=True)


if __name__ == "__main__":
    main()
