"""`qkv study STUDY`: experiments on positional encodings, run on this machine; each study a row of STUDIES."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Callable

from .errors import CommandError, Parser


@dataclass(frozen=True)
class Study:
    """One `qkv study NAME`: its words, its own options, how its flags become the fields of its config (the class
    ``config`` of ``qkv.studies.NAME``) and the figures its run draws."""

    help: str
    description: str
    config: str
    options: tuple[tuple[tuple[str, ...], dict], ...]  # (flags, add_argument's keywords), before the shared ones
    fields: tuple[str, ...]  # config fields taken from the option of the same name
    given: tuple[str, ...] = ()  # ... only when that option was given
    derived: Callable[[argparse.Namespace, ModuleType], dict] | None = None  # the fields computed from options
    figures: tuple[str, ...] = ()  # what --markdown copies beside the page
    training: bool = True  # with the options of TRAINING


def option(*flags: str, **kwargs) -> tuple[tuple[str, ...], dict]:
    """One option of a study: ``add_argument(*flags, **kwargs)``."""
    return flags, kwargs


QUICK = option("--quick", action="store_true", help="a tiny model and budget (a smoke test)")
TRAINING = (  # the options every training study shares: its first seed, its text, its budget, its device
    option("--seed", type=int, default=1337, help="first seed (default 1337)"),
    option("--data", default=None, help="a UTF-8 text file or directory (default: the Python standard library)"),
    option("--max-tokens", type=int, default=None, help="training tokens per model (overrides the budget)"),
    option("--device", default="auto", help="auto (default), cpu, cuda or cuda:N"),
)

CONTEXT_OPTIONS = (
    QUICK,
    option("--schemes", nargs="+", metavar="SCHEME", default=None,
           help="rows to produce (default all: none sinusoidal rope rope+PI rope+NTK 'rope+dynamic NTK' rope+YaRN "
           "alibi t5)"),
    option("--train-lens", nargs="+", type=int, metavar="L", default=None,
           help="training lengths, each on the same tokens (default 64 256)"),
    option("--eval-lens", nargs="+", metavar="kL", default=None,
           help="evaluation lengths as multiples of L, e.g. 1L 2L 4L (default 1L 2L 4L 8L 16L)"),
    option("--finetune", action=argparse.BooleanOptionalAction, default=True,
           help="rows 'rope+PI (ft 4L)' and 'rope+YaRN (ft 4L)': the rope model fine-tuned at 4L with that scaling "
           "(factor 4) for 5 %% of its pre-training tokens (default on; --no-finetune: without)"),
    option("--workers", type=int, default=None,
           help="processes training models side by side, sharing the threads (default: one per thread)"),
    option("--threads", type=int, default=None,
           help="CPU threads for the whole study (default: the cores other processes leave free)"),
    option("--seeds", type=int, default=None, help="models per scheme and L (default 3; --quick 1)"),
)

STUDIES = {
    "pe": Study(
        help="train GPTs differing only in PE at L, score bpc at L, 2L, 4L, 8L",
        description="Train identical small GPTs that differ only in positional scheme (none, sinusoidal, learned, "
        "rope, alibi) at length L with one token budget and seed, and score validation bits per character at L, 2L, "
        "4L, 8L on non-overlapping windows. Writes results.csv, results.md, positions.csv (loss per position), pe.png "
        "and summary.json. Default: five models of 2^20 training tokens each (results.md says how long it took); "
        "--quick: a smaller model and budget, a smoke test.",
        config="PEStudyConfig",
        options=(option("--quick", action="store_true", help="a smaller model and budget (a smoke test)"),
                 option("--schemes", nargs="+", metavar="KIND", default=None,
                        help="the positional schemes to train (default: none sinusoidal learned rope alibi; also t5, "
                        "T5's bucketed relative bias)"),
                 option("--seeds", type=int, default=1, help="models per scheme; > 1 adds std columns (default 1)"),
                 option("--train-len", type=int, default=64, help="training length L (default 64)")),
        fields=("seeds", "seed", "data", "train_len", "device"), given=("max_tokens",),
        derived=lambda args, _: {"schemes": tuple(args.schemes)} if args.schemes else {},
        figures=("pe.png",)),
    "order": Study(
        help="an Encoder on a task that needs order, with no PE and each PE",
        description="Train a bidirectional Encoder with a linear head on random sequences (reverse: output the token "
        "at the mirrored position; shift: the previous token) with no PE and with each PE; writes results.csv "
        "(scheme, task, accuracy), results.md and summary.json.",
        config="OrderStudyConfig",
        options=(option("--quick", action="store_true", help="fewer steps (a smoke test)"),
                 option("--task", action="append", choices=("reverse", "shift"),
                        help="reverse or shift (repeatable; default both)"),
                 option("--seed", type=int, default=1337, help="seed (default 1337)"), TRAINING[-1]),
        fields=("seed", "device"), derived=lambda args, _: {"tasks": args.task} if args.task else {},
        training=False),
    "kv": Study(
        help="the KV cache of MHA, GQA, MQA and MLA: bpc, cache size, decode speed",
        description="Train GPTs at one width and matched parameter count that differ only in attention (MHA, GQA, "
        "MQA, multi-head latent attention), two seeds each on one token budget; report held-out bits per character, "
        "the KV cache per token and layer, and batch-1 decode tokens/s at 512, 2048 and 8192 cached tokens (MLA naive "
        "and absorbed), and whether DeepSeek-V2's claim (MLA as good as MHA with a >= 90 %% smaller cache) holds "
        "here. Writes results.csv, results.md, kv.png and summary.json. Default: eight models of 2^21 tokens (about "
        "half an hour on two cores); --quick: seconds, a smoke test.",
        config="KVStudyConfig",
        options=(QUICK, option("--seeds", type=int, default=2, help="models per variant (default 2)")),
        fields=("seeds", "seed", "data", "device"), given=("max_tokens",), figures=("kv.png",)),
    "context": Study(
        help="long context: RoPE scaling (PI, NTK, dynamic NTK, YaRN) against ALiBi, T5 bias and no PE, bpc at L … "
        "16L",
        description="Train small GPTs (none, sinusoidal, rope, alibi, t5) at L = 64 and 256 on matched tokens, "
        "several seeds, and score validation bits per character at L, 2L, 4L, 8L, 16L on non-overlapping windows; the "
        "trained rope model is also scored with PI, NTK-aware, dynamic NTK and YaRN scaling applied at evaluation "
        "(factor T / L). Writes results.csv, results.md, positions.csv, context.png and summary.json. --quick: a smoke "
        "test.",
        config="ContextStudyConfig",
        options=CONTEXT_OPTIONS,
        fields=("seed", "device", "finetune", "workers", "threads"),
        given=("seeds", "data", "max_tokens", "schemes", "train_lens"),
        derived=lambda args, context: ({"eval_factors": tuple(context.parse_eval_len(t) for t in args.eval_lens)}
                                       if args.eval_lens else {}),
        figures=("context.png",)),
    "moe": Study(
        help="a dense GPT against MoE GPTs (equal active, equal total parameters), with the load-balancing loss, "
        "without, and aux-loss-free",
        description="Train a dense GPT and MoE GPTs on the same tokens: MoE of the dense model's active parameters "
        "with the load-balancing loss, without balancing and with DeepSeek-V3's aux-loss-free bias, and MoE of its "
        "total parameters; report validation bits per character, tokens/s and MaxVio over training. Writes "
        "results.csv, results.md, moe.png and summary.json. --quick: seconds (a smoke test).",
        config="MoEStudyConfig", options=(QUICK,), fields=("seed", "data", "device"), given=("max_tokens",),
        figures=("moe.png",)),
}


def study_config(study: Study, args: argparse.Namespace, module: ModuleType):
    """The study's config from its options: ``Config.quick(**fields)`` with --quick, else ``Config(**fields)``."""
    fields = {name: getattr(args, name) for name in study.fields}
    fields |= {name: getattr(args, name) for name in study.given if getattr(args, name) is not None}
    fields |= study.derived(args, module) if study.derived else {}
    config = getattr(module, study.config)
    return config.quick(**fields) if args.quick else config(**fields)


def study_module(args: argparse.Namespace) -> ModuleType:
    """The module of the study named by ``args.study``: qkv.studies.pe, qkv.studies.order, …"""
    return import_module(f"..studies.{args.study}", __package__)


def train_study(args: argparse.Namespace):
    """Run the study named by ``args.study`` and print its table and findings."""
    module = study_module(args)
    cfg = study_config(STUDIES[args.study], args, module)
    result = module.run(cfg, out=args.out, progress=not args.quiet, lang=args.lang)
    print(result.table, "", *result.sentences, "", sep="\n")
    return result


def rerender(args: argparse.Namespace) -> Path:
    """--from-results DIR: the run's results file written again in --lang from its summary.json; print it."""
    path, table, sentences = study_module(args).rerender(args.from_results, args.lang)
    print(table, "", *sentences, "", sep="\n")
    return path


def shared_options(name: str, training: bool) -> tuple[tuple[tuple[str, ...], dict], ...]:
    """The options of every `qkv study NAME` after its own: its folder, its progress, its page, its language."""
    where = f"output directory (default runs/study-{name})" if training else f"default runs/study-{name}"
    return (
        option("--out", default=f"runs/study-{name}", metavar="DIR", help=where),
        option("--quiet", action="store_true", help="no progress bar"),
        option("--markdown", metavar="DIR", default=None,
               help="also write the results as the docs site's page: DIR/generated/study-STUDY.md (with --lang zh: "
               "study-STUDY.zh.md) and its figure in DIR (e.g. --markdown docs)"),
        option("--lang", choices=("en", "zh"), default="en",
               help="the language of the printed table and sentences and of the results file: en (results.md) or "
               "zh (results.zh.md; the numbers unchanged)"),
        option("--from-results", metavar="DIR", default=None,
               help="train nothing: write DIR's results file again in --lang from the summary.json of a finished run "
               f"in DIR (and with --markdown its page), e.g. --from-results runs/study-{name} --lang zh --markdown "
               "docs; the training options are then unused"),
    )


def add_study(sub) -> argparse.ArgumentParser:
    """Declare `qkv study` and one subcommand per entry of STUDIES."""
    p = sub.add_parser("study", help="measure what positional encodings do: pe (length extrapolation), order, context "
                       "(RoPE scaling); the KV cache: kv; mixtures of experts: moe",
                       description="Experiments on positional encodings, run on this machine.")
    studies = p.add_subparsers(dest="study", metavar="STUDY", required=True, parser_class=Parser)
    for name, study in STUDIES.items():
        p_study = studies.add_parser(name, help=study.help, description=study.description)
        training = TRAINING if study.training else ()
        for flags, kwargs in (*study.options, *training, *shared_options(name, study.training)):
            p_study.add_argument(*flags, **kwargs)
    return p


def run_study(args: argparse.Namespace) -> int:
    """Run the study, say where its files are, and write its docs page when asked."""
    from ..studies.pages import RESULTS, say, write_page

    if args.markdown is not None and not Path(args.markdown).is_dir():
        raise CommandError(f"--markdown {args.markdown}: expected the documentation folder (e.g. docs), "
                           "found no such directory")
    figures = STUDIES[args.study].figures
    if args.from_results is not None:
        folder = Path(args.from_results)
        print(say("wrote files", args.lang, files=rerender(args)))
    else:
        folder, result = Path(args.out), train_study(args)
        files = ", ".join(("results.csv", RESULTS[args.lang], *figures))
        print(say("wrote", args.lang, out=args.out, files=files, minutes=result.seconds / 60))
    if args.markdown is not None:
        written = write_page(folder, args.study, args.markdown, "qkv " + " ".join(args.argv), figures, lang=args.lang)
        print(say("wrote files", args.lang, files=", ".join(str(p) for p in written)))
    return 0
