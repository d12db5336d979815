"""`qkv verify` (the spec's claims, measured) and `qkv plot FIGURE` (PNG figures)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .errors import CommandError, Parser
from .sources import add_model_source, load_model_source


def add_verify(sub) -> argparse.ArgumentParser:
    """Declare `qkv verify`."""
    p = sub.add_parser("verify", help="measure every claim of the spec on qkv's own modules",
                       description="Check every section and FAQ entry of the spec by measuring qkv's modules: each "
                       "claim holds or fails with its numbers (the spec's own code is checked beside the right one), "
                       "and the few that cannot be measured are listed with the reason. Fast by default; --full adds "
                       "the timing measurements (Q4 O(n²), Q15 RNNs, Q19 additive attention). Exit status 1 if any "
                       "claim fails.")
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
    p.add_argument("--device", default="auto", help="where the measurements and --run's model run: auto (default: a "
                                                     "GPU where there is one, else the CPU), cpu, cuda or cuda:N")
    p.add_argument("--full", action="store_true", help="also the heavy measurements (time and memory over n; "
                   "a few minutes)")
    p.add_argument("--lang", choices=("en", "zh"), default="en", help="the language of the table and the --markdown "
                   "report: en, or zh (each claim in the spec's own Chinese wording, every measured sentence, header "
                   "and summary line in Chinese; the numbers unchanged)")
    return p


def trained_model(args: argparse.Namespace, names: list[str] | None):
    """(run, model, ids) for --run's head-diversity claim and report figures; Nones without --run."""
    from .. import claims

    if not args.run:
        if args.text is not None:
            raise CommandError("--text is for --run (the text the trained heads are compared on)")
        return None, None, None
    if not os.path.isdir(args.run):
        raise CommandError(f"--run {args.run}: no such run directory")
    from ..training.run_dir import load_run

    from ..runtime import resolve_device

    device = resolve_device(args.device)
    run = load_run(args.run, device=device)
    if names is None or "head-diversity" in names or args.markdown:
        return run, run.model, claims.run_text_ids(run, args.text).to(device)
    return run, None, None


def run_verify(args: argparse.Namespace) -> int:
    """Measure the claims, print a table (or JSON); exit status 1 if any fails."""
    import json

    from .. import claims

    if args.list:
        print("\n".join(claims.claim_names()))
        return 0
    from ..runtime import auto_means, resolve_device

    names = claims.resolve_names(args.only)
    resolve_device(args.device)  # a bad name or a missing GPU: one line, before any work
    run, model, ids = trained_model(args, names)
    with auto_means(args.device):
        results = claims.run_claims(names, full=args.full, unmeasurable=names is None, model=model, ids=ids,
                                    seed=args.seed)
    if args.json:
        print(json.dumps([r.to_dict() for r in results], ensure_ascii=False, indent=2))
    else:
        print(claims.format_table(results, lang=args.lang))
    if args.markdown:
        from ..viz import plots
        from ..viz.labels import readable_labels

        sample = None if ids is None else ids[0, : min(32, ids.size(1))]  # a short window: readable labels
        labels = None if sample is None else readable_labels(run.tokenizer, sample.tolist())
        path = plots.write_report(results, args.markdown, model=model, ids=sample, labels=labels, lang=args.lang)
        print(claims.words(args.lang)["wrote"].format(path=path), file=sys.stderr if args.json else sys.stdout)
    return 0 if claims.all_hold(results) else 1


# --- qkv plot FIGURE: one add_/plot_ pair per figure, listed in FIGURES ---

def add_plot_pe(figures) -> argparse.ArgumentParser:
    """Declare `qkv plot pe`."""
    p = figures.add_parser("pe", help="the sinusoidal PE matrix as a heatmap, and a few dimensions against position")
    p.add_argument("--d-model", type=int, default=128, help="model width (even; default 128)")
    p.add_argument("--length", type=int, default=256, help="positions to draw (default 256)")
    return p


def plot_pe(args: argparse.Namespace) -> Path:
    """Draw pe.png."""
    from ..viz import plots

    return plots.plot_pe(Path(args.out) / "pe.png", d_model=args.d_model, length=args.length)


def add_plot_scaling(figures) -> argparse.ArgumentParser:
    """Declare `qkv plot scaling`."""
    return figures.add_parser("scaling", help="softmax saturation against d_k, with and without 1/√d_k")


def plot_scaling(args: argparse.Namespace) -> Path:
    """Draw scaling.png."""
    from ..viz import plots

    return plots.plot_scaling(Path(args.out) / "scaling.png")


def add_plot_attention(figures) -> argparse.ArgumentParser:
    """Declare `qkv plot attention`."""
    p = figures.add_parser("attention", help="a trained model's attention: one heatmap per layer and head")
    add_model_source(p)
    p.add_argument("--text", required=True, help="the text to look at (at most the model's max_len tokens)")
    p.add_argument("--kind", choices=("cross", "encoder", "decoder"), default="cross",
                   help="an encoder-decoder: which attention to draw (default cross: target rows × source columns)")
    p.add_argument("--num-beams", type=int, default=4, help="an encoder-decoder: beam width of its translation")
    return p


def plot_attention(args: argparse.Namespace) -> Path:
    """Draw attention.png for --text; an encoder-decoder translates it and draws the cross-attention."""
    from ..models import Transformer
    from ..viz import plots, seq2seq
    from ..viz.labels import readable_tokens

    model, tokenizer = load_model_source(args)
    if isinstance(model, Transformer):
        return seq2seq.plot_translation_attention(model, tokenizer, args.text, Path(args.out) / "attention.png",
                                                  kind=args.kind, num_beams=args.num_beams)
    if args.kind != "cross":
        raise CommandError("--kind is for an encoder-decoder's three kinds of attention")
    ids, labels = readable_tokens(tokenizer, args.text, max_len=model.config.max_len)
    return plots.plot_attention(model, ids, labels, Path(args.out) / "attention.png", text=args.text)


def add_plot_complexity(figures) -> argparse.ArgumentParser:
    """Declare `qkv plot complexity`."""
    p = figures.add_parser("complexity", help="time and peak memory of attention against n (reference, fused, "
                           "flash, linear), log-log, with fitted exponents (a few minutes; --quick: one)")
    p.add_argument("--quick", action="store_true", help="n = 256, 512, 1024 only")
    return p


def plot_complexity(args: argparse.Namespace) -> Path:
    """Measure, then draw complexity.png."""
    from .. import claims
    from ..viz import plots

    lengths = [256, 512, 1024] if args.quick else [256, 512, 1024, 2048, 4096, 8192]
    return plots.plot_complexity(claims.measure_complexity(lengths), Path(args.out) / "complexity.png")


FIGURES = {  # figure -> (add_plot_X(figures), plot_X(args) -> path of the PNG)
    "pe": (add_plot_pe, plot_pe),
    "scaling": (add_plot_scaling, plot_scaling),
    "attention": (add_plot_attention, plot_attention),
    "complexity": (add_plot_complexity, plot_complexity),
}


def add_plot(sub) -> argparse.ArgumentParser:
    """Declare `qkv plot` and one subcommand per entry of FIGURES."""
    p = sub.add_parser("plot", help="draw figures (PNG): " + ", ".join(FIGURES),
                       description="Draw a figure as a PNG file in --out DIR and print its path.")
    figures = p.add_subparsers(dest="figure", metavar="FIGURE", required=True, parser_class=Parser)
    for add, _ in FIGURES.values():
        add(figures).add_argument("--out", default="plots", metavar="DIR",
                                  help="directory for the PNG (default ./plots)")
    return p


def run_plot(args: argparse.Namespace) -> int:
    """Draw the figure and print its path."""
    print(FIGURES[args.figure][1](args))
    return 0
