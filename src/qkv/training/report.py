"""What a run reports: its loss curves (loss.png) and what ``qkv info`` shows of it."""
from __future__ import annotations

import os
from pathlib import Path


from .finetune import base_source
from .run_dir import RunDir
from .tasks import make_task, task_type


def plot_losses(path: Path, records: list[dict], summary: dict | None = None) -> None:
    """Loss curves (nats per token) and, for language modelling, validation bpc beside gzip's and xz's."""
    from matplotlib.figure import Figure

    from ..viz.figures import save_png

    steps, bpc = [r["step"] for r in records], "val_bpc" in records[-1]
    fig = Figure(figsize=(10 if bpc else 5, 4), layout="tight")
    axes = fig.subplots(1, 2 if bpc else 1)
    a = axes[0] if bpc else axes
    a.plot(steps, [r["train_loss"] for r in records], label="train")
    a.plot(steps, [r["val_loss"] for r in records], label="validation")
    a.set(xlabel="step", ylabel="loss (nats / token)", title="cross-entropy")
    a.legend()
    if bpc:
        b = axes[1]
        b.plot(steps, [r["val_bpc"] for r in records], label="model (validation)")
        for key, label, style in (("gzip_bpc", "gzip -9", "--"), ("xz_bpc", "xz -9e", ":")):
            if summary and key in summary:
                b.axhline(summary[key], color="gray", linestyle=style, label=f"{label} ({summary[key]:.2f})")
        b.set(xlabel="step", ylabel="bits per character", title="validation bits per character")
        b.legend()
    save_png(fig, path, dpi=100)



def run_info(path: str | os.PathLike) -> dict:
    """What ``qkv info`` shows: model, tokenizer, training progress and results of a run."""
    run = RunDir(path)
    loaded = run.load()
    c, n = loaded.config, sum(p.numel() for p in loaded.model.parameters())
    info = {"run": str(run), "model": f"{type(loaded.model).__name__}, {n / 1e6:.3f} M parameters: "
            f"d_model={c.d_model}, num_heads={c.attention.num_heads}, num_layers={c.num_layers}, d_ff={c.ff_width}, "
            f"max_len={c.max_len}, positional={c.position.kind}, norm_first={c.normalization.first}, "
            f"activation={c.feed_forward.activation}, "
            f"attention={attention_words(c)}",
            "tokenizer": f"{loaded.tokenizer.kind}, {loaded.tokenizer.vocab_size} tokens",
            "step": int(run.weights_metadata().get("step", 0))}
    t, s = run.read_json(run.TRAIN_CONFIG), run.read_json(run.SUMMARY)
    if isinstance(t, dict):
        info["data"] = data_info(t, s if isinstance(s, dict) else {})
        info["training"] = (f"task={t.get('task', 'lm')}, batch_size={t.get('batch_size')}, lr={t.get('lr')}, "
                            f"seed={t.get('seed')}, budget: steps={t.get('max_steps')}, "
                            f"minutes={t.get('max_minutes')}, tokens={t.get('max_tokens')}")
        base = base_source(t)
        if base:
            info["base"] = f"{base.path} (weights SHA-256 {str(t.get('init_sha256'))[:16]}…)"
        if t.get("lora"):
            info["lora"] = (f"rank {t['lora']}, alpha {t['lora_alpha']:g}, on {t['lora_targets']} "
                            f"({run.ADAPTERS} over the base, merged on loading)")
    if isinstance(s, dict):
        for key, value in make_task(s.get("task", "lm")).info(s).items():
            info[key] = f"{value} after {s['steps']} steps, {s['tokens_per_s']:.0f} tokens/s"
    else:
        info["status"] = "unfinished (continue with qkv train --resume --out RUN)"
    return info


def attention_words(c) -> str:
    """A config's attention kind in a few words: mha (with its KV heads), mla (its latent widths), a window."""
    a = c.attention
    if a.kind == "mla":
        words = f"mla (kv_lora_rank={a.kv_lora_rank}, qk_rope_head_dim={a.qk_rope_head_dim})"
    else:
        words = a.kind + (f" (num_kv_heads={a.num_kv_heads})" if a.num_kv_heads not in (None, a.num_heads) else "")
    return words + (f", sliding_window={a.sliding_window}" if a.sliding_window else "")


def data_info(train_config: dict, summary: dict) -> str:
    """What a run learned from, in words: its --data, else what the summary read (the corpus's own name:
    the catalogs' place and language), else the task's default."""
    task = train_config.get("task", "lm")
    given = train_config.get("data") or train_config.get("pairs")
    source = given or summary.get("corpus") or task_type(task).defaults.data
    lang = summary.get("target_lang") or (train_config.get("task_options") or {}).get("target_lang")
    if task == "translate" and lang:
        source += f", target language {lang}"
    return source if given else f"{source} (the default: no --data given)"
