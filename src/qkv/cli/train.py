"""`qkv train`, `qkv sample`, `qkv info`: train a GPT, continue a prompt, describe a run."""
from __future__ import annotations

import argparse
import os
import sys
import typing
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..generation.backends import BACKENDS
from .errors import CommandError
from .model_flags import add_model_flags, apply_overrides, model_overrides
from .chat import conversation_ids, end_of_turn, stream_chat
from .sources import check_directory_kind, load_model_source, model_command, source_name
from .weights import apply_weights

GROUPS = {  # a flag's group -> its title in `qkv train --help`, in that order
    "task": "what to train",
    "shape": "the model's shape (over the preset's)",
    "data": "data",
    "budget": "budget (the first reached ends the run)",
    "optimizer": "optimization",
    "machine": "speed and hardware",
    "run": "the run",
    "options": "task options (each task's own, declared by its options dataclass: qkv.training.tasks)",
}


@dataclass(frozen=True)
class Flag:
    """A `qkv train` flag made from a dataclass field: a TrainConfig ``setting`` or the task options of that name
    (``qkv.training.tasks.base.option``)."""

    name: str  # the field
    kind: type
    help: str  # a task option's: "sft, dpo: …" or "translate: …; dpo: …"
    choices: typing.Container[str] | None
    negatable: bool  # a switch that is not off by default: --NAME / --no-NAME
    group: str  # a key of GROUPS


def flag_name(name: str) -> str:
    """A field's flag: ``max_steps`` -> ``--max-steps``."""
    return "--" + name.replace("_", "-")


def train_flags() -> dict[str, Flag]:
    """--NAME -> its Flag, for every TrainConfig field declared by ``setting`` (and the other flags it names)."""
    from ..training.config import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    flags = {}
    for f in fields(TrainConfig):
        if "help" not in f.metadata:
            continue
        kind = next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))
        flag = Flag(f.name, kind, f.metadata["help"], f.metadata["choices"], kind is bool and f.default is not False,
                    f.metadata["group"])
        flags[flag_name(f.name)] = flag
        flags |= {other: replace(flag, help=text) for other, text in f.metadata["also"].items()}
    return flags


def task_flags() -> dict[str, Flag]:
    """--NAME -> its Flag, for every option of every registered task: each declared once, in its options
    dataclass; an option two tasks share is one flag whose help names both."""
    from ..training.tasks import TASKS

    found: dict[str, list] = {}
    for task, cls in TASKS.items():
        for f in fields(cls.options_type):
            found.setdefault(f.name, []).append((task, f))
    flags = {}
    for name, owners in found.items():
        kinds = {type(f.default) for _, f in owners}
        if len(kinds) > 1:
            raise TypeError(f"task option {name!r} has defaults of types {sorted(k.__name__ for k in kinds)}")
        texts: dict[str, list[str]] = {}
        for task, f in owners:
            texts.setdefault(f.metadata.get("help", ""), []).append(task)
        text = "; ".join(f"{', '.join(tasks)}: {t}" for t, tasks in texts.items())
        flags[flag_name(name)] = Flag(name, kinds.pop(), text, owners[0][1].metadata.get("choices"),
                                      any(f.default is True for _, f in owners), "options")
    return flags


def all_flags() -> dict[str, Flag]:
    """``train_flags`` and ``task_flags``: TypeError where a task option takes the name of a TrainConfig setting."""
    general, options = train_flags(), task_flags()
    if general.keys() & options.keys():
        raise TypeError(f"task options {sorted(general.keys() & options.keys())} take flags of TrainConfig settings")
    return general | options


def add_flag(group, flag: str, f: Flag) -> None:
    """Declare ``flag`` (default None: not given) in ``group`` of a parser."""
    if f.kind is bool:
        kind = {"action": argparse.BooleanOptionalAction if f.negatable else "store_true"}
    else:
        kind = {"type": f.kind, "choices": None if f.choices is None else tuple(f.choices)}
    group.add_argument(flag, default=None, help=f.help.replace("%", "%%"), **kind)


PRESET_NOTES = {  # preset -> what it is for, one line in `qkv train --help` (the shapes come from qkv.models.PRESETS)
    "tiny": "unit tests: trains in seconds",
    "demo": "--task lm's default on a CPU: 3 minutes on 2 CPU cores, 2048-token BPE",
    "gpu": "--task lm's default on a GPU: 3 minutes, 4096-token BPE, compiled, batch 128",
    "paper-base": "the paper's base model (its Table 3), post-LN",
    "translate": "--task translate's default: the encoder-decoder at CPU size",
    "gpt2": "GPT-2 small's shape (124 M parameters)",
}


def presets_help() -> str:
    """The presets as a table, one line each: name, shape, what it is for."""
    from ..models import PRESETS

    lines = ["presets (--preset NAME; why each is shaped so: docs/design-notes.md):",
             f"  {'name':<11} {'layers':>6} {'heads':>5} {'d_model':>7} {'max_len':>7}  {'PE':<11} for"]
    for name, c in PRESETS.items():
        lines.append(f"  {name:<11} {c.num_layers:>6} {c.attention.num_heads:>5} {c.d_model:>7} {c.max_len:>7}  "
                     f"{c.position.kind:<11} {PRESET_NOTES.get(name, 'a preset of qkv.models.PRESETS')}")
    return "\n".join(lines)


def add_train(sub) -> argparse.ArgumentParser:
    """Declare `qkv train`: TrainConfig's settings and the tasks' options (``all_flags``), the model's shape and
    the run's own flags, each in its group of `qkv train --help`."""
    import textwrap

    about = ("Train a decoder-only Transformer (--task lm) and end with validation bits per character beside gzip's "
             "and xz's and a sample, or the paper's encoder-decoder (--task translate) and end with BLEU and chrF of "
             "the held-out pairs beside copying the source and a translation memory. Writes runs/NAME (checkpoint, "
             "metrics, loss curve, summary). Under torchrun it trains with DDP. Progress goes to stderr: a bar on a "
             "terminal, a plain line every 10 s in a log.")
    p = sub.add_parser("train", help="train a GPT on text, or the encoder-decoder to translate",
                       description=textwrap.fill(about, 100), epilog=presets_help(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = {key: p.add_argument_group(title) for key, title in GROUPS.items()}
    for flag, f in all_flags().items():
        add_flag(groups[f.group], flag, f)
    add_model_flags(groups["shape"])
    run = groups["run"]
    run.add_argument("--out", default=None, help="run directory (default: runs/PRESET, or runs/PRESET-2, ... if taken)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped")
    run.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    run.add_argument("--sample-tokens", type=int, default=300, help="tokens to sample at the end (0: none)")
    run.add_argument("--quiet", action="store_true", help="no progress (bar or lines)")
    return p


def token_count(n: int) -> str:
    """``n`` tokens in words: "1,632 tokens" below a million, "2.35 M tokens" from there."""
    return f"{n:,} tokens" if n < 1_000_000 else f"{n / 1e6:.2f} M tokens"


def fresh_run_dir(preset: str) -> str:
    """runs/PRESET, or runs/PRESET-2, -3 … : the first that is missing or empty."""
    base, n = Path("runs") / preset, 2
    out = base
    while out.exists() and any(out.iterdir()):
        out, n = base.with_name(f"{preset}-{n}"), n + 1
    return str(out)


def train_config(args: argparse.Namespace):
    """The TrainConfig the flags ask for: a resumed run's own, or a new one with the task's default budget."""
    from ..training.config import TrainConfig
    from ..training.tasks import task_type

    if args.resume and not args.out:
        raise CommandError("--resume needs --out RUN_DIR (the run to continue)")
    given, options = flag_values(args)
    if options:  # a resumed run's task is its own
        task = given.get("task") or (TrainConfig.for_resume(args.out).task if args.resume else "lm")
        given["task_options"] = given_options(task, options)
    overrides = model_overrides(args)
    if given.get("init_from") and overrides:
        raise CommandError(f"--init-from takes the model's shape from the run; drop the shape flags (they set "
                           f"{', '.join(sorted(overrides))})")
    if given.get("init_from"):  # a Hugging Face directory given as the run: say which flag takes it
        check_directory_kind(given["init_from"], "--init-from", hint=f"give it as --init-from-hf {given['init_from']}")
    if given.get("init_from_hf"):  # a qkv run given as the checkpoint: say how to fine-tune or continue it instead
        run = given["init_from_hf"]
        check_directory_kind(run, "--init-from-hf",
                             hint=f"fine-tune it with --init-from {run}, or continue it with --resume --out {run}")
    if args.resume:
        if overrides:
            given["model"] = shaped(TrainConfig.for_resume(args.out, **given), overrides)
        return TrainConfig.for_resume(args.out, progress=not args.quiet, **given)
    if not any(k in given for k in ("max_steps", "max_minutes", "max_tokens")):
        given["max_minutes"] = task_type(given.get("task", "lm")).defaults.minutes
    if overrides:
        given |= {"model": shaped(TrainConfig(**given), overrides)} | preset_tokenizer(TrainConfig(**given), given)
    cfg = TrainConfig(**given, out=args.out, overwrite=args.overwrite, progress=not args.quiet)
    name = cfg.preset if cfg.task in ("lm", "translate") else cfg.task  # runs/sft, runs/dpo: not runs/demo
    cfg.out = args.out or fresh_run_dir(Path(cfg.base_source.path).name if cfg.base_source else name)
    return cfg


def flag_values(args: argparse.Namespace) -> tuple[dict, dict]:
    """The TrainConfig settings and the task options the flags give (name -> value; a flag not given: absent)."""
    given: dict = {}
    options: dict = {}
    for flag, f in all_flags().items():
        value, into = getattr(args, flag[2:].replace("-", "_")), options if f.group == "options" else given
        if value is not None and into.get(f.name, value) != value:
            raise CommandError(f"{flag} and another flag for {f.name} disagree ({into[f.name]!r} vs {value!r})")
        if value is not None:
            into[f.name] = value
    return given, options


def given_options(task: str, options: dict) -> dict:
    """The options of ``task`` among those the flags give; another task's option is refused unless it asks
    for nothing (``--task lm --no-copy``)."""
    from ..training.tasks import option_owners, task_type

    names = task_type(task).options_type.names()
    for name, value in options.items():
        if name not in names and value is not False:
            raise ValueError(f"{name} is an option of --task {' or '.join(option_owners(name))}, not of --task {task}")
    return {k: v for k, v in options.items() if k in names}


def shaped(cfg, overrides: dict):
    """The model of ``cfg`` (its own, or its preset's) with the shape flags applied."""
    from ..models import PRESETS

    return apply_overrides(cfg.model or PRESETS[cfg.preset], overrides)


def preset_tokenizer(cfg, given: dict) -> dict:
    """The preset's tokenizer, kept when the shape flags change its model (a TrainConfig given a model
    would otherwise fall back to characters)."""
    if cfg.model is not None or "tokenizer" in given:
        return {}
    return {"tokenizer": cfg.tokenizer, "vocab_size": cfg.vocab_size}


def run_train(args: argparse.Namespace) -> int:
    """Train, print the summary and a sample."""
    from ..models import GPT
    from ..training.recipe import train

    cfg = train_config(args)
    result = train(cfg)
    if os.environ.get("RANK", "0") != "0":
        return 0
    from ..training.tasks import make_task

    s = result.summary
    k = s["trainable_parameters"]
    trained = f" ({k:,} trained: {100 * k / s['parameters']:.2f} %)" if k < s["parameters"] else ""
    print(f"run: {result.path}  ({s['parameters'] / 1e6:.2f} M parameters{trained}, {s['tokenizer']} tokenizer, "
          f"{s['steps']} steps, {token_count(s['tokens'])}, {s['tokens_per_s']:.0f} tokens/s)")
    print("\n".join(make_task(cfg.task).result_lines(s)))
    if args.sample_tokens > 0 and isinstance(result.model, GPT) and cfg.task == "lm":  # a chat run: qkv sample --chat
        print_sample(result, cfg, args.sample_tokens)
    return 0


def print_sample(result, cfg, tokens: int) -> None:
    """A sample from a just-trained model at temperature 0.8, printed as it comes, from the start of the
    validation text (the summary's ``sample_prompt``: the data's own language), else the first of a few
    prompts the tokenizer can encode; the line before it says which."""
    import torch

    from ..runtime import cpu_threads

    if result.model.lm_head.weight.device.type == "cpu":
        torch.set_num_threads(cfg.threads or cpu_threads())  # one token at a time: busy cores hurt most
    tok, given = result.tokenizer, result.summary.get("sample_prompt")
    if given and encodable(tok, given):
        prompt, where = given, "the validation text's first characters"
    else:
        prompt = next((p for p in ("\n", " ", "def ") if encodable(tok, p)), tok.decode([0]))
        where = "a prompt the tokenizer can encode"
    print(f"sample (prompt {prompt!r}: {where}; temperature 0.8, seed {cfg.seed}):", flush=True)
    stream_sample(result.model, tok, prompt, tokens, temperature=0.8, seed=cfg.seed)


def encodable(tokenizer, text: str) -> bool:
    """Whether ``tokenizer`` turns ``text`` into at least one token."""
    try:
        return bool(tokenizer.encode(text))
    except ValueError:
        return False


@model_command("generate text from a trained run or a Hugging Face model", gguf=True)
def add_sample(p: argparse.ArgumentParser) -> None:
    """Continue a prompt with a trained run's model, a Hugging Face GPT-2 / LLaMA / GPT-NeoX directory or a GGUF
    file (llama, qwen2, qwen3) with its tokenizer (KV-cached decoding); with --chat, answer it as a chat model does,
    through the checkpoint's chat template."""
    p.add_argument("--prompt", required=True, help="text to continue (with --chat: the user's message)")
    p.add_argument("--chat", action="store_true",
                   help="a chat model: the prompt is a user message, formatted with the checkpoint's own chat "
                        "template (the tokenizer's apply_chat_template, opening the assistant's turn); only the "
                        "reply is printed, without the template's markup, and it stops at the end of the turn "
                        "(the tokenizer's eos and the generation_config's eos ids, e.g. Qwen's <|im_end|>)")
    p.add_argument("--system", metavar="TEXT", default=None,
                   help="with --chat: a system message before the user's (the template decides how it is shown)")
    p.add_argument("--max-new-tokens", type=int, default=200,
                   help=f"tokens to generate (default 200; at most {MAX_NEW_TOKENS:,}, a larger number is capped "
                        "there, saying so: past its max_len the model sees only its last tokens, a sliding window, "
                        "so more adds length, not context). The text is printed as it comes; Ctrl-C stops and "
                        "keeps it")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling: keep probability mass p")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible samples")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast (fp32 weights, each product cast)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="what computes each token: auto (default: on a GPU the cudagraph step; on a CPU the "
                        "fused step for the models it accepts, else the model's forward, its linear products "
                        "through qkv's CPU kernels), eager (the modules as "
                        "written), inductor (the one-token step compiled by torch.compile), fused (qkv's C++ step, "
                        "built once per machine; a model it was not built for falls back to auto, saying why) "
                        "or cudagraph (the one-token step recorded once as a CUDA graph and replayed; on a CPU it "
                        "falls back to auto, saying why). The backend that ran is printed on stderr")


def run_sample(args: argparse.Namespace) -> int:
    """Continue the prompt, printing prompt + continuation as the tokens come (Ctrl-C keeps what was printed)."""
    import contextlib

    import torch

    from ..generation.plan import plan_decode
    from ..runtime import cpu_threads, resolve_device

    if args.system is not None and not args.chat:
        raise CommandError("--system needs --chat: a system message is part of a chat template's conversation")
    device = resolve_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads())  # decoding one token at a time suffers most on busy cores
    model, tokenizer = load_model_source(args, device=args.device)
    check_decoder(args, model)
    chat = chat_ids(args, tokenizer)
    tokens = capped_tokens(args.max_new_tokens, model.config.max_len)
    model = apply_weights(args, model)
    plan = plan_decode(model, 1, args.backend, warn=False)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    settings = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, plan=plan)
    with autocast:
        if chat is None:
            stream_sample(model, tokenizer, args.prompt, tokens, **settings)
        else:
            stream_chat(model, tokenizer, chat, tokens, eos_id=end_of_turn(model, tokenizer), **settings)
    print(f"qkv: {plan.backend_line}", file=sys.stderr)
    return 0


MAX_NEW_TOKENS = 100_000  # qkv sample's most in one call; the library's generate takes any number


def capped_tokens(asked: int, max_len: int) -> int:
    """``asked``, or MAX_NEW_TOKENS with a line on stderr saying why."""
    if asked <= MAX_NEW_TOKENS:
        return asked  # a negative number is generate's to refuse
    print(f"qkv: --max-new-tokens {asked} capped at {MAX_NEW_TOKENS:,}: past its max_len ({max_len}) the model "
          f"sees only its last tokens (a sliding window), so more adds length, not context; Ctrl-C stops earlier "
          "and keeps what was printed", file=sys.stderr)
    return MAX_NEW_TOKENS


def check_decoder(args: argparse.Namespace, model) -> None:
    """CommandError unless ``model`` is a GPT; an encoder-decoder is pointed to `qkv translate`."""
    from ..models import GPT, Transformer

    if isinstance(model, GPT):
        return
    hint = ": use `qkv translate` to translate with an encoder-decoder" if isinstance(model, Transformer) else ""
    raise CommandError(f"{source_name(args)}: sampling needs a decoder (a qkv train --task lm run, GPT-2, "
                       f"LLaMA or GPT-NeoX), got {type(model).__name__}{hint}")


def chat_ids(args: argparse.Namespace, tokenizer) -> list[int] | None:
    """--chat: the --system and --prompt messages in the checkpoint's (or the run's) chat template, as the prompt's
    ids; None without --chat."""
    if not args.chat:
        return None
    system = [] if args.system is None else [{"role": "system", "content": args.system}]
    return conversation_ids(args, tokenizer, system + [{"role": "user", "content": args.prompt}])


def stream_sample(model, tokenizer, prompt: str, tokens: int, **kwargs) -> None:
    """Print prompt + ``tokens`` generated tokens on stdout as they come, then a newline; on Ctrl-C the
    newline first (what was printed stays), then the interruption goes on to ``main``."""
    from ..generation import TextStreamer, generate_text

    streamer = TextStreamer(tokenizer)
    try:
        generate_text(model, tokenizer, prompt, tokens, streamer=streamer, **kwargs)
    finally:
        if streamer.pieces:  # not after an error before the first token (a prompt it cannot encode)
            print(flush=True)


def add_info(sub) -> argparse.ArgumentParser:
    """Declare `qkv info`."""
    p = sub.add_parser("info", help="describe a trained run", description="Model, tokenizer, training and results "
                                                                          "of a run directory.")
    p.add_argument("--run", required=True, help="run directory written by qkv train")
    return p


def run_info(args: argparse.Namespace) -> int:
    """Print qkv.train.run_info, one key per line."""
    from ..training.recipe import run_info as describe

    for key, value in describe(args.run).items():
        print(f"{key + ':':<14} {value}")
    return 0
