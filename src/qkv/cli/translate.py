"""`qkv translate`: translate text with a trained encoder-decoder run (or a Hugging Face Marian directory)."""
from __future__ import annotations

import argparse
import sys

from .errors import CommandError
from .sources import load_model_source, model_command


@model_command("translate text with a trained encoder-decoder (qkv train --task translate)", loading=False)
def add_translate(p: argparse.ArgumentParser) -> None:
    """Translate each TEXT, or each line of standard input when none is given, with beam search (greedy with
    --num-beams 1); one output line per input line, printed as soon as its batch (--batch-size lines; one line at a
    time when you type them) is translated."""
    p.add_argument("text", nargs="*", metavar="TEXT", help="texts to translate (default: lines of stdin)")
    p.add_argument("--num-beams", type=int, default=None, help="beam width (default: 4 for a run, the checkpoint's "
                   "generation config for --hf, 1 where it gives none, as Hugging Face's generate; 1 = greedy)")
    p.add_argument("--length-penalty", type=float, default=None, help="α of score = log p / length^α (default: 0.6, "
                   "the paper's, for a run; the checkpoint's generation config, else 1.0, for --hf)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="longest translation (default: 2 × source + 10)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="sentences decoded together (default 32; one at a time from a terminal)")


def run_translate(args: argparse.Namespace) -> int:
    """Print one translation per input line."""
    from ..models import Transformer
    from ..runtime import resolve_device
    from ..training.progress import is_terminal
    from ..training.tasks.translation import translate_lines

    resolve_device(args.device)
    model, tokenizer = load_model_source(args, device=args.device)
    if not isinstance(model, Transformer):
        raise CommandError(f"{args.run or args.hf} holds a {type(model).__name__}, not an encoder-decoder: "
                           "use `qkv sample` to continue text with it")
    beams, alpha = decoding_defaults(args, model)
    typing = not args.text and is_terminal(sys.stdin)
    if typing:
        print("qkv translate: reading the lines to translate from stdin (each one translated when you press "
              "Enter); end with Ctrl-D", file=sys.stderr)
    texts = args.text or (line.rstrip("\n") for line in sys.stdin)  # read as they come
    lines = (t.replace("\\n", "\n") for t in texts)  # a literal \n in an argument is a line break of the string
    for out in translate_lines(model, tokenizer, lines, num_beams=beams, length_penalty=alpha,
                               max_new_tokens=args.max_new_tokens, batch_size=1 if typing else args.batch_size):
        print(out.replace("\n", "\\n"), flush=True)  # each line as soon as its batch is done
    return 0


def decoding_defaults(args: argparse.Namespace, model) -> tuple[int, float]:
    """(num_beams, length_penalty): the flags, else a run's paper defaults (4, 0.6), else a Hugging Face
    checkpoint's, ``model.generation_config`` (as its ``generate`` uses them: 1 and 1.0 where it gives none)."""
    config = getattr(model, "generation_config", None)
    if args.run or config is None:
        return args.num_beams or 4, 0.6 if args.length_penalty is None else args.length_penalty
    alpha = config.length_penalty if args.length_penalty is None else args.length_penalty
    return args.num_beams or config.num_beams, float(alpha)
