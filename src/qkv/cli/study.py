"""`qkv study STUDY`: experiments on positional encodings, run on this machine."""
from __future__ import annotations

import argparse
from pathlib import Path

from .errors import CommandError, Parser


def add_run_options(p: argparse.ArgumentParser, name: str) -> None:
    """The options every training study shares: its first seed, its text, its budget, its device, its folder."""
    p.add_argument("--seed", type=int, default=1337, help="first seed (default 1337)")
    p.add_argument("--data", default=None, help="a UTF-8 text file or directory (default: the Python standard library)")
    p.add_argument("--max-tokens", type=int, default=None, help="training tokens per model (overrides the budget)")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    p.add_argument("--out", default=f"runs/study-{name}", metavar="DIR",
                   help=f"output directory (default runs/study-{name})")


def add_study_pe(studies) -> argparse.ArgumentParser:
    """Declare `qkv study pe`."""
    p = studies.add_parser("pe", help="train GPTs differing only in PE at L, score bpc at L, 2L, 4L, 8L",
                           description="Train identical small GPTs that differ only in positional scheme (none, "
                           "sinusoidal, learned, rope, alibi) at length L with one token budget and seed, and score "
                           "validation bits per character at L, 2L, 4L, 8L on non-overlapping windows. Writes "
                           "results.csv, results.md, positions.csv (loss per position), pe.png and summary.json. "
                           "Default: five models of 2^20 training tokens each (results.md says how long it took); "
                           "--quick: a smaller model and budget, a smoke test.")
    p.add_argument("--quick", action="store_true", help="a smaller model and budget (a smoke test)")
    p.add_argument("--schemes", nargs="+", metavar="KIND", default=None,
                   help="the positional schemes to train (default: none sinusoidal learned rope alibi; also t5, "
                        "T5's bucketed relative bias)")
    p.add_argument("--seeds", type=int, default=1, help="models per scheme; > 1 adds std columns (default 1)")
    p.add_argument("--train-len", type=int, default=64, help="training length L (default 64)")
    add_run_options(p, "pe")
    return p


def study_pe(args: argparse.Namespace):
    """Run the length-extrapolation study and print its table and findings."""
    from ..studies import pe

    overrides = {"seeds": args.seeds, "seed": args.seed, "data": args.data, "train_len": args.train_len,
                 "device": args.device}
    if args.max_tokens is not None:
        overrides["max_tokens"] = args.max_tokens
    if args.schemes:
        overrides["schemes"] = tuple(args.schemes)
    cfg = pe.PEStudyConfig.quick(**overrides) if args.quick else pe.PEStudyConfig(**overrides)
    result = pe.run(cfg, out=args.out, progress=not args.quiet, lang=args.lang)
    print(result.table, "", *result.sentences, "", sep="\n")
    return result


def add_study_order(studies) -> argparse.ArgumentParser:
    """Declare `qkv study order`."""
    p = studies.add_parser("order", help="an Encoder on a task that needs order, with no PE and each PE",
                           description="Train a bidirectional Encoder with a linear head on random sequences "
                           "(reverse: output the token at the mirrored position; shift: the previous token) "
                           "with no PE and with each PE; writes results.csv (scheme, task, accuracy), "
                           "results.md and summary.json.")
    p.add_argument("--quick", action="store_true", help="fewer steps (a smoke test)")
    p.add_argument("--task", action="append", choices=("reverse", "shift"),
                   help="reverse or shift (repeatable; default both)")
    p.add_argument("--seed", type=int, default=1337, help="seed (default 1337)")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    p.add_argument("--out", default="runs/study-order", metavar="DIR", help="default runs/study-order")
    return p


def study_order(args: argparse.Namespace):
    """Run the order study and print its table and findings."""
    from ..studies import order

    overrides = {"seed": args.seed, "device": args.device} | ({"tasks": args.task} if args.task else {})
    cfg = order.OrderStudyConfig.quick(**overrides) if args.quick else order.OrderStudyConfig(**overrides)
    result = order.run(cfg, out=args.out, progress=not args.quiet, lang=args.lang)
    print(order.markdown_table(result.rows, result.chance, result.bag_baseline, args.lang), "", *result.sentences,
          "", sep="\n")
    return result


def add_study_kv(studies) -> argparse.ArgumentParser:
    """Declare `qkv study kv`."""
    p = studies.add_parser("kv", help="the KV cache of MHA, GQA, MQA and MLA: bpc, cache size, decode speed",
                           description="Train GPTs at one width and matched parameter count that differ only in "
                           "attention (MHA, GQA, MQA, multi-head latent attention), two seeds each on one token budget; "
                           "report held-out bits per character, the KV cache per token and layer, and batch-1 decode "
                           "tokens/s at 512, 2048 and 8192 cached tokens (MLA naive and absorbed), and whether "
                           "DeepSeek-V2's claim (MLA as good as MHA with a >= 90 %% smaller cache) holds here. Writes "
                           "results.csv, results.md, kv.png and summary.json. Default: eight models of 2^21 tokens "
                           "(about half an hour on two cores); --quick: seconds, a smoke test.")
    p.add_argument("--quick", action="store_true", help="a tiny model and budget (a smoke test)")
    p.add_argument("--seeds", type=int, default=2, help="models per variant (default 2)")
    add_run_options(p, "kv")
    return p


def study_kv(args: argparse.Namespace):
    """Run the KV-cache study and print its table and findings."""
    from ..studies import kv

    overrides = {"seeds": args.seeds, "seed": args.seed, "data": args.data, "device": args.device}
    if args.max_tokens is not None:
        overrides["max_tokens"] = args.max_tokens
    cfg = kv.KVStudyConfig.quick(**overrides) if args.quick else kv.KVStudyConfig(**overrides)
    result = kv.run(cfg, out=args.out, progress=not args.quiet, lang=args.lang)
    print(result.table, "", *result.sentences, "", sep="\n")
    return result


def add_study_context(studies) -> argparse.ArgumentParser:
    """Declare `qkv study context`."""
    p = studies.add_parser("context", help="long context: RoPE scaling (PI, NTK, dynamic NTK, YaRN) against "
                           "ALiBi, T5 bias and no PE, bpc at L … 16L",
                           description="Train small GPTs (none, sinusoidal, rope, alibi, t5) at L = 64 and 256 on "
                           "matched tokens, several seeds, and score validation bits per character at L, 2L, 4L, 8L, "
                           "16L on non-overlapping windows; the trained rope model is also scored with PI, NTK-aware, "
                           "dynamic NTK and YaRN scaling applied at evaluation (factor T / L). Writes results.csv, "
                           "results.md, positions.csv, context.png and summary.json. --quick: a smoke test.")
    p.add_argument("--quick", action="store_true", help="a tiny model and budget (a smoke test)")
    p.add_argument("--schemes", nargs="+", metavar="SCHEME", default=None,
                   help="rows to produce (default all: none sinusoidal rope rope+PI rope+NTK 'rope+dynamic NTK' "
                        "rope+YaRN alibi t5)")
    p.add_argument("--train-lens", nargs="+", type=int, metavar="L", default=None,
                   help="training lengths, each on the same tokens (default 64 256)")
    p.add_argument("--eval-lens", nargs="+", metavar="kL", default=None,
                   help="evaluation lengths as multiples of L, e.g. 1L 2L 4L (default 1L 2L 4L 8L 16L)")
    p.add_argument("--finetune", action=argparse.BooleanOptionalAction, default=True,
                   help="rows 'rope+PI (ft 4L)' and 'rope+YaRN (ft 4L)': the rope model fine-tuned at 4L with that "
                        "scaling (factor 4) for 5 %% of its pre-training tokens (default on; --no-finetune: without)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes training models side by side, sharing the threads (default: one per thread)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the whole study (default: the cores other processes leave free)")
    p.add_argument("--seeds", type=int, default=None, help="models per scheme and L (default 3; --quick 1)")
    add_run_options(p, "context")
    return p


def study_context(args: argparse.Namespace):
    """Run the long-context study and print its tables and findings."""
    from ..studies import context

    given = {"seeds": args.seeds, "data": args.data, "max_tokens": args.max_tokens, "schemes": args.schemes,
             "train_lens": args.train_lens,
             "eval_factors": args.eval_lens and tuple(context.parse_eval_len(t) for t in args.eval_lens)}
    overrides = {"seed": args.seed, "device": args.device, "finetune": args.finetune, "workers": args.workers,
                 "threads": args.threads}
    overrides |= {k: v for k, v in given.items() if v is not None}
    cfg = (context.ContextStudyConfig.quick if args.quick else context.ContextStudyConfig)(**overrides)
    result = context.run(cfg, out=args.out, progress=not args.quiet, lang=args.lang)
    print(result.table, "", *result.sentences, "", sep="\n")
    return result


def add_study_moe(studies) -> argparse.ArgumentParser:
    """Declare `qkv study moe`."""
    p = studies.add_parser("moe", help="a dense GPT against MoE GPTs (equal active, equal total parameters), "
                           "with the load-balancing loss, without, and aux-loss-free",
                           description="Train a dense GPT and MoE GPTs on the same tokens: MoE of the dense "
                           "model's active parameters with the load-balancing loss, without balancing and with "
                           "DeepSeek-V3's aux-loss-free bias, and MoE of its total parameters; report validation "
                           "bits per character, tokens/s and MaxVio over training. Writes results.csv, results.md, "
                           "moe.png and summary.json. --quick: seconds (a smoke test).")
    p.add_argument("--quick", action="store_true", help="a tiny model and budget (a smoke test)")
    add_run_options(p, "moe")
    return p


def study_moe(args: argparse.Namespace):
    """Run the mixture-of-experts study and print its table and findings."""
    from ..studies import moe

    overrides = {"seed": args.seed, "data": args.data, "device": args.device}
    if args.max_tokens is not None:
        overrides["max_tokens"] = args.max_tokens
    cfg = moe.MoEStudyConfig.quick(**overrides) if args.quick else moe.MoEStudyConfig(**overrides)
    result = moe.run(cfg, out=args.out, progress=not args.quiet, lang=args.lang)
    print(result.table, "", *result.sentences, "", sep="\n")
    return result


def rerender(args: argparse.Namespace) -> Path:
    """--from-results DIR: the run's results file written again in --lang from its summary.json; print it."""
    from importlib import import_module

    study = import_module(f"..studies.{args.study}", __package__)  # qkv.studies.pe, qkv.studies.order
    path, table, sentences = study.rerender(args.from_results, args.lang)
    print(table, "", *sentences, "", sep="\n")
    return path


FIGURES = {"pe": ("pe.png",), "order": (), "kv": ("kv.png",), "context": ("context.png",), "moe": ("moe.png",)}  # what --markdown copies beside the page

STUDIES = {  # study -> (add_study_X(studies), study_X(args) -> result with .seconds; its module qkv.studies.X)
    "pe": (add_study_pe, study_pe),
    "order": (add_study_order, study_order),
    "kv": (add_study_kv, study_kv),
    "context": (add_study_context, study_context),
    "moe": (add_study_moe, study_moe),
}


def add_study(sub) -> argparse.ArgumentParser:
    """Declare `qkv study` and one subcommand per entry of STUDIES."""
    p = sub.add_parser("study", help="measure what positional encodings do: pe (length extrapolation), order, context "
                       "(RoPE scaling); the KV cache: kv; mixtures of experts: moe",
                       description="Experiments on positional encodings, run on this machine.")
    studies = p.add_subparsers(dest="study", metavar="STUDY", required=True, parser_class=Parser)
    for add, _ in STUDIES.values():
        p_study = add(studies)
        p_study.add_argument("--quiet", action="store_true", help="no progress bar")
        p_study.add_argument("--markdown", metavar="DIR", default=None,
                             help="also write the results as the docs site's page: DIR/generated/study-STUDY.md "
                             "(with --lang zh: study-STUDY.zh.md) and its figure in DIR (e.g. --markdown docs)")
        p_study.add_argument("--lang", choices=("en", "zh"), default="en",
                             help="the language of the printed table and sentences and of the results file: en "
                             "(results.md) or zh (results.zh.md; the numbers unchanged)")
        p_study.add_argument("--from-results", metavar="DIR", default=None,
                             help="train nothing: write DIR's results file again in --lang from the summary.json "
                             "of a finished run in DIR (and with --markdown its page), e.g. --from-results "
                             f"runs/study-{p_study.prog.split()[-1]} --lang zh --markdown docs; the training "
                             "options are then unused")
    return p


def run_study(args: argparse.Namespace) -> int:
    """Run the study, say where its files are, and write its docs page when asked."""
    from ..studies.pages import RESULTS, say, write_page

    if args.markdown is not None and not Path(args.markdown).is_dir():
        raise CommandError(f"--markdown {args.markdown}: expected the documentation folder (e.g. docs), "
                           "found no such directory")
    if args.from_results is not None:
        folder = Path(args.from_results)
        print(say("wrote files", args.lang, files=rerender(args)))
    else:
        folder, result = Path(args.out), STUDIES[args.study][1](args)
        files = ", ".join(("results.csv", RESULTS[args.lang], *FIGURES[args.study]))
        print(say("wrote", args.lang, out=args.out, files=files, minutes=result.seconds / 60))
    if args.markdown is not None:
        written = write_page(folder, args.study, args.markdown, "qkv " + " ".join(args.argv), FIGURES[args.study],
                             lang=args.lang)
        print(say("wrote files", args.lang, files=", ".join(str(p) for p in written)))
    return 0
