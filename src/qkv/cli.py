"""The `qkv` command: parse, call the library, print.

Every user error becomes one line on stderr and exit status 2 — no traceback
(set QKV_DEBUG=1 to see one). Each subcommand has a `_add_NAME(sub)` that declares its
arguments and a `_run_NAME(args)` that calls the library.
"""
from __future__ import annotations

import argparse
import os
import sys


class CommandError(Exception):
    """A user error the command reports in one line (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: one line, status 2
        raise CommandError(f"{self.prog}: {message}")


ADDERS: list = []  # each section appends its _add_NAME here, next to its definitions


def add_model_source(p: argparse.ArgumentParser) -> None:
    """--run DIR | --hf DIR, exactly one: where a command's model and tokenizer come from."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", metavar="DIR", help="a run directory written by `qkv train`")
    src.add_argument("--hf", metavar="DIR", help="a Hugging Face model directory (save_pretrained), with its tokenizer")


def load_model_source(args, *, device: str = "cpu"):
    """(model in eval mode, tokenizer) from --run or --hf; one clear error for anything missing."""
    path = args.run or args.hf
    if not os.path.isdir(path):
        kind = "--run {}: no such run directory" if args.run else "--hf {}: no such model directory"
        raise CommandError(kind.format(path))
    if args.run:
        from .checkpoint import load_run

        run = load_run(path, device=device)
        return run.model, run.tokenizer
    from .interop.hf import load_pretrained

    model, tokenizer = load_pretrained(path)
    if tokenizer is None:
        raise CommandError(f"{path} has no tokenizer files (tokenizer.json, vocab.json, vocab.txt …): "
                           "this command needs one to read text")
    return model.to(device).eval(), tokenizer

# --- train / sample / info (training issue) -------------------------------------------
_TRAIN_FLAGS = {  # flag -> (TrainConfig field, type, help)
    "--preset": ("preset", str, "model preset (default: demo)"),
    "--data": ("data", str, "a UTF-8 text file or a directory of them (default: the Python standard library)"),
    "--max-steps": ("max_steps", int, "optimizer steps"),
    "--max-minutes": ("max_minutes", float, "wall-clock training budget (default 3 when no budget is given)"),
    "--max-tokens": ("max_tokens", int, "training tokens"),
    "--seed": ("seed", int, "seed of initialisation, batches and dropout (default 1337)"),
    "--tokenizer": ("tokenizer", str, "char or bpe (byte-level BPE, Hugging Face tokenizers); default: "
                    "the demo preset's bpe, char for every other preset"),
    "--vocab-size": ("vocab_size", int, "BPE vocabulary size (default: the preset's, else 1024)"),
    "--batch-size": ("batch_size", int, "sequences per optimizer step, over all processes"),
    "--grad-accum": ("grad_accum", int, "micro-batches per optimizer step"),
    "--lr": ("lr", float, "peak learning rate"),
    "--context": ("context", int, "training context length (default: the preset's max_len)"),
    "--eval-interval": ("eval_interval", int, "steps between validations and checkpoints"),
    "--device": ("device", str, "auto (default), cpu, cuda or cuda:N"),
    "--threads": ("threads", int, "CPU threads (default: the cores other processes leave free)"),
}


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a GPT on the embedded corpus or your text",
                       description="Train a decoder-only Transformer; writes runs/NAME (checkpoint, metrics, "
                                   "loss curve, summary) and ends with validation bits per character beside "
                                   "gzip's and xz's, and a sample. Under torchrun it trains with DDP.")
    for flag, (_, typ, text) in _TRAIN_FLAGS.items():
        p.add_argument(flag, type=typ, default=None, help=text,
                       choices=("char", "bpe") if flag == "--tokenizer" else None)
    p.add_argument("--out", default=None, help="run directory (default: runs/PRESET, or runs/PRESET-2, ... if taken)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped")
    p.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    p.add_argument("--bf16", action="store_true", default=None, help="bfloat16 autocast")
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    p.add_argument("--sample-tokens", type=int, default=300, help="tokens to sample at the end (0: none)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_train)


def _fresh_run_dir(preset: str) -> str:
    from pathlib import Path

    base, n = Path("runs") / preset, 2
    out = base
    while out.exists() and any(out.iterdir()):
        out, n = base.with_name(f"{preset}-{n}"), n + 1
    return str(out)


def _run_train(args) -> int:
    import torch

    from .train import TrainConfig, cpu_threads, train

    given = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _, _) in _TRAIN_FLAGS.items()}
    given |= {"bf16": args.bf16, "compile": args.compile}
    given = {k: v for k, v in given.items() if v is not None}
    if args.resume:
        if not args.out:
            raise CommandError("--resume needs --out RUN_DIR (the run to continue)")
        cfg = TrainConfig.for_resume(args.out, progress=not args.quiet, **given)
    else:
        if not any(k in given for k in ("max_steps", "max_minutes", "max_tokens")):
            given["max_minutes"] = 3.0
        cfg = TrainConfig(**given, overwrite=args.overwrite, progress=not args.quiet)
        cfg.out = args.out or _fresh_run_dir(cfg.preset)
    result = train(cfg)
    if os.environ.get("RANK", "0") != "0":
        return 0
    s = result.summary
    print(f"run: {result.path}  ({s['parameters'] / 1e6:.2f} M parameters, {s['tokenizer']} tokenizer, "
          f"{s['steps']} steps, {s['tokens'] / 1e6:.2f} M tokens, {s['tokens_per_s']:.0f} tokens/s)")
    print(f"validation bits per character: model {s['val_bpc']:.3f} | gzip -9 {s['gzip_bpc']:.3f} | "
          f"xz -9e {s['xz_bpc']:.3f}   ({s['val_chars']} characters held out)")
    if args.sample_tokens > 0:
        from .checkpoint import Run

        if result.model.lm_head.weight.device.type == "cpu":
            torch.set_num_threads(cfg.threads or cpu_threads())  # one token at a time: busy cores hurt most
        run = Run(model=result.model, tokenizer=result.tokenizer, config=result.config, path=result.path)
        prompt = next((p for p in ("def ", "\n", " ") if _encodable(run.tokenizer, p)), run.tokenizer.decode([0]))
        print(f"sample (temperature 0.8, seed {cfg.seed}):")
        print(run.sample(prompt, args.sample_tokens, temperature=0.8, seed=cfg.seed))
    return 0


def _encodable(tokenizer, text: str) -> bool:
    try:
        return bool(tokenizer.encode(text))
    except ValueError:
        return False


def _add_sample(sub) -> None:
    p = sub.add_parser("sample", help="generate text from a trained run or a Hugging Face model",
                       description="Continue a prompt with a trained run's model, or a Hugging Face GPT-2 / LLaMA "
                                   "directory with its tokenizer (KV-cached decoding).")
    add_model_source(p)
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate (default 200)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling: keep probability mass p")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible samples")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile the one-token decode step (compiles once)")
    p.set_defaults(func=_run_sample)


def _run_sample(args) -> int:
    import contextlib

    import torch

    from .generate import generate_text
    from .models import GPT
    from .train import cpu_threads

    if args.device == "cpu":
        torch.set_num_threads(cpu_threads())  # decoding one token at a time suffers most on busy cores
    model, tokenizer = load_model_source(args, device=args.device)
    if not isinstance(model, GPT):
        raise CommandError(f"{args.hf}: sampling needs a decoder (GPT-2 or LLaMA), got {type(model).__name__}")
    device_type = torch.device(args.device).type
    autocast = torch.autocast(device_type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    with autocast:
        text = generate_text(model, tokenizer, args.prompt, args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, seed=args.seed, compile=args.compile)
    print(text)
    return 0


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="describe a trained run", description="Model, tokenizer, training and results "
                                                                          "of a run directory.")
    p.add_argument("--run", required=True, help="run directory written by qkv train")
    p.set_defaults(func=_run_info)


def _run_info(args) -> int:
    from .checkpoint import run_info

    for key, value in run_info(args.run).items():
        print(f"{key + ':':<14} {value}")
    return 0


ADDERS.extend([_add_train, _add_sample, _add_info])
# --- end train / sample / info ----------------------------------------------------------

# --- verify / plot (claims issue) -------------------------------------------------------
def _add_verify(sub) -> None:
    p = sub.add_parser("verify", help="measure every claim of the spec on qkv's own modules",
                       description="Check the spec's claims (§1.3 scaling, §1.4 weights, §2.2 parameters, §2.3 "
                       "FLOPs, §3 permutation equivariance, the PE properties, FAQ Q5/Q12/Q16, and three corrections "
                       "of the spec's code) by measuring qkv's modules. Exit status 1 if any claim fails.")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="run only these claims (repeat, or comma-separate; --list shows the names)")
    p.add_argument("--list", action="store_true", help="print the claim names and exit")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of {name, claim, section, measured, holds, summary}")
    p.add_argument("--markdown", metavar="FILE",
                   help="also write a Markdown report with figures (PNG files next to FILE)")
    p.add_argument("--run", metavar="DIR", help="a run written by `qkv train`: adds the Q3 head-diversity claim")
    p.add_argument("--text", help="with --run: the text for head diversity (default: the run's validation text)")
    p.add_argument("--seed", type=int, default=0, help="seed for every check (default 0)")
    p.set_defaults(func=_run_verify)


def _run_verify(args) -> int:
    import json

    from . import claims

    if args.list:
        print("\n".join(claims.claim_names()))
        return 0
    names = claims.resolve_names(args.only)
    model = ids = None
    if args.run:
        if not os.path.isdir(args.run):
            raise CommandError(f"--run {args.run}: no such run directory")
        from .checkpoint import load_run

        run = load_run(args.run, device="cpu")
        if names is None or "head-diversity" in names or args.markdown:
            model, ids = run.model, claims.run_text_ids(run, args.text)
    elif args.text is not None:
        raise CommandError("--text is for --run (the text the trained heads are compared on)")
    results = claims.run_claims(names, model=model, ids=ids, seed=args.seed)
    if args.json:
        print(json.dumps([r.to_dict() for r in results], ensure_ascii=False, indent=2))
    else:
        print(claims.format_table(results))
    if args.markdown:
        from .viz import plots

        sample = None if ids is None else ids[0, : min(32, ids.size(1))]  # a short window: readable labels
        labels = None if sample is None else run.tokenizer.token_strings(sample.tolist())
        path = plots.write_report(results, args.markdown, model=model, ids=sample, labels=labels)
        print(f"wrote {path} (figures next to it)", file=sys.stderr if args.json else sys.stdout)
    return 0 if all(r.holds for r in results) else 1


def _add_plot(sub) -> None:
    p = sub.add_parser("plot", help="draw figures (PNG): pe, scaling, attention",
                       description="Draw a figure as a PNG file in --out DIR and print its path.")
    figures = p.add_subparsers(dest="figure", metavar="FIGURE", required=True, parser_class=_Parser)
    pe = figures.add_parser("pe", help="the sinusoidal PE matrix as a heatmap, and a few dimensions against position")
    pe.add_argument("--d-model", type=int, default=128, help="model width (even; default 128)")
    pe.add_argument("--length", type=int, default=256, help="positions to draw (default 256)")
    scaling = figures.add_parser("scaling", help="softmax saturation against d_k, with and without 1/√d_k")
    att = figures.add_parser("attention", help="a trained model's attention: one heatmap per layer and head")
    add_model_source(att)
    att.add_argument("--text", required=True, help="the text to look at (at most the model's max_len tokens)")
    for q in (pe, scaling, att):
        q.add_argument("--out", default="plots", metavar="DIR", help="directory for the PNG (default ./plots)")
    p.set_defaults(func=_run_plot)


def _run_plot(args) -> int:
    from pathlib import Path

    from .viz import plots

    out = Path(args.out)
    if args.figure == "pe":
        path = plots.plot_pe(out / "pe.png", d_model=args.d_model, length=args.length)
    elif args.figure == "scaling":
        path = plots.plot_scaling(out / "scaling.png")
    else:
        model, tokenizer = load_model_source(args)
        ids, labels = plots.encode_text(tokenizer, args.text, max_len=model.config.max_len)
        path = plots.plot_attention(model, ids, labels, out / "attention.png")
    print(path)
    return 0


ADDERS.append(_add_verify)
ADDERS.append(_add_plot)
# --- end verify / plot ------------------------------------------------------------------

# --- study (positional-encoding studies) ------------------------------------------------
def _add_study(sub) -> None:
    p = sub.add_parser("study", help="measure what positional encodings do: pe (length extrapolation), order",
                       description="Experiments on positional encodings, run on this machine.")
    studies = p.add_subparsers(dest="study", metavar="STUDY", required=True, parser_class=_Parser)
    pe = studies.add_parser("pe", help="train GPTs differing only in PE at L, score bpc at L, 2L, 4L, 8L",
                            description="Train identical small GPTs that differ only in positional scheme (none, "
                            "sinusoidal, learned, rope, alibi) at length L with one token budget and seed, and score "
                            "validation bits per character at L, 2L, 4L, 8L on non-overlapping windows. Writes "
                            "results.csv, results.md, positions.csv (loss per position), pe.png and summary.json. "
                            "Default: about 20 minutes on 2 free CPU cores; --quick: about a minute.")
    pe.add_argument("--quick", action="store_true", help="a smaller model and budget (about a minute)")
    pe.add_argument("--seeds", type=int, default=1, help="models per scheme; > 1 adds std columns (default 1)")
    pe.add_argument("--seed", type=int, default=1337, help="first seed (default 1337)")
    pe.add_argument("--data", default=None, help="a UTF-8 text file or directory (default: the Python standard library)")
    pe.add_argument("--train-len", type=int, default=64, help="training length L (default 64)")
    pe.add_argument("--max-tokens", type=int, default=None, help="training tokens per model (overrides the budget)")
    pe.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    pe.add_argument("--out", default="runs/study-pe", metavar="DIR", help="output directory (default runs/study-pe)")
    pe.add_argument("--quiet", action="store_true", help="no progress bar")
    order = studies.add_parser("order", help="an Encoder on a task that needs order, with no PE and each PE",
                               description="Train a bidirectional Encoder with a linear head on random sequences "
                               "(reverse: output the token at the mirrored position; shift: the previous token) "
                               "with no PE and with each PE; writes results.csv (scheme, task, accuracy), "
                               "results.md and summary.json.")
    order.add_argument("--quick", action="store_true", help="fewer steps (about a minute)")
    order.add_argument("--task", action="append", choices=("reverse", "shift"),
                       help="reverse or shift (repeatable; default both)")
    order.add_argument("--seed", type=int, default=1337, help="seed (default 1337)")
    order.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    order.add_argument("--out", default="runs/study-order", metavar="DIR", help="default runs/study-order")
    order.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_study)


def _run_study(args) -> int:
    if args.study == "pe":
        from .studies import pe

        overrides = {"seeds": args.seeds, "seed": args.seed, "data": args.data, "train_len": args.train_len,
                     "device": args.device}
        if args.max_tokens is not None:
            overrides["max_tokens"] = args.max_tokens
        cfg = pe.PEStudyConfig.quick(**overrides) if args.quick else pe.PEStudyConfig(**overrides)
        result = pe.run(cfg, out=args.out, progress=not args.quiet)
        print(result.table, "", *result.sentences, "", sep="\n")
    else:
        from .studies import order

        overrides = {"seed": args.seed, "device": args.device} | ({"tasks": args.task} if args.task else {})
        cfg = order.OrderStudyConfig.quick(**overrides) if args.quick else order.OrderStudyConfig(**overrides)
        result = order.run(cfg, out=args.out, progress=not args.quiet)
        print(order.markdown_table(result), "", *result.sentences, "", sep="\n")
    print(f"wrote {args.out}/ (results.csv, results.md{', pe.png' if args.study == 'pe' else ''}) "
          f"in {result.seconds / 60:.1f} min")
    return 0


ADDERS.append(_add_study)
# --- end study --------------------------------------------------------------------------

# --- explore (attention explorer) -------------------------------------------------------
def _add_explore(sub) -> None:
    p = sub.add_parser("explore", help="explore a model's attention in the browser (one HTML file or a local server)",
                       description="Write one self-contained HTML page showing every head's attention on TEXT, "
                       "or serve it on 127.0.0.1 with a text box (--serve).")
    add_model_source(p)
    p.add_argument("--text", help="the text to look at (required unless --serve)")
    p.add_argument("--out", default="qkv-explore.html", metavar="FILE.html", help="where to write the page")
    p.add_argument("--title", help="page title (default: the model's directory)")
    p.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 with a text box")
    p.add_argument("--port", type=int, default=8765, help="port for --serve (0: any free port; default 8765)")
    p.add_argument("--max-chars", type=int, default=1000, help="longest text --serve accepts (default 1000)")
    p.add_argument("--device", default="cpu", help="torch device for the model (default cpu)")
    p.set_defaults(func=_run_explore)


def _run_explore(args) -> int:
    from .viz import explorer

    if not args.serve and args.text is None:
        raise CommandError("explore: give --text TEXT (or --serve for a page with a text box)")
    model, tokenizer = load_model_source(args, device=args.device)
    title = args.title or f"qkv explorer: {os.path.basename(os.path.normpath(args.run or args.hf))}"
    if args.serve:
        server = explorer.make_server(model, tokenizer, port=args.port, max_chars=args.max_chars,
                                      title=title, text=args.text)
        try:
            explorer.serve(server)
        except KeyboardInterrupt:
            print("qkv explore: stopped", file=sys.stderr)
        return 0
    ids, labels = explorer.tokenize(tokenizer, args.text)
    path = explorer.write_html(args.out, explorer.render_html(model, ids, labels, title=title))
    print(f"wrote {path} ({len(ids)} tokens); open it in a browser")
    return 0


ADDERS.append(_add_explore)
# --- end explore ------------------------------------------------------------------------

# --- bench ------------------------------------------------------------------------------


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="side-by-side speed and memory measurements (python -m benchmarks)",
                       description="Run benchmarks/ from a source checkout: attention vs nn.MultiheadAttention, "
                                   "memory of fused vs reference attention, generation and training vs Hugging Face.")
    p.add_argument("--quick", action="store_true", help="smaller shapes, fewer repeats")
    p.add_argument("--only", nargs="+", metavar="SECTION",
                   help="attention | memory | generation | train_speed")
    p.set_defaults(func=_run_bench)


def _run_bench(args) -> int:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if not (root / "benchmarks" / "__main__.py").is_file():
        raise CommandError("qkv bench runs the benchmarks/ folder of a source checkout; none found beside this install")
    sys.path.insert(0, str(root))
    from benchmarks.__main__ import SECTIONS, main as bench_main

    unknown = sorted(set(args.only or []) - set(SECTIONS))
    if unknown:
        raise CommandError(f"unknown benchmark section(s) {unknown}; choose from {SECTIONS}")
    return bench_main((["--quick"] if args.quick else []) + (["--only", *args.only] if args.only else []))


ADDERS.append(_add_bench)
# --- end bench --------------------------------------------------------------------------



def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="qkv", description="Attention, multi-head attention and positional encodings: "
                     "train, sample, check and look inside Transformer models.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"qkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for add in ADDERS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            raise CommandError("choose a command (listed above)")
        return int(args.func(args) or 0)
    except KeyboardInterrupt as e:  # Ctrl-C; training saves a checkpoint first and says where
        print(f"qkv: {e or 'interrupted'}", file=sys.stderr)
        return 130
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else 0
    except Exception as e:  # noqa: BLE001 - the command's promise: one line, never a traceback
        if os.environ.get("QKV_DEBUG"):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"qkv: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
