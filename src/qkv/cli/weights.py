"""--weights none|int8: the one flag `qkv sample`, `qkv chat` and `qkv serve` share for quantised weights
(``qkv.kernels.quant``: torchao's weight-only int8 over the model's linears, its output head kept)."""
from __future__ import annotations

import argparse
import sys

from ..kernels.quant import KINDS
from .errors import CommandError


def add_weights_flag(p: argparse.ArgumentParser) -> None:
    """Declare --weights."""
    p.add_argument("--weights", choices=KINDS, default="none",
                   help="none (default: the checkpoint's weights as they are) or int8 (weight-only int8 through "
                        "torchao: the linears' weights in a quarter of float32's bytes, the output head kept; "
                        "needs the quant extra; docs/speed.md gives its speed and its cost)")


def apply_weights(args: argparse.Namespace, model):
    """``model`` with its weights as --weights says (in place), one line on stderr saying what was quantised;
    CommandError where torchao is missing or the model cannot be quantised."""
    if args.weights == "none":
        return model
    from ..kernels.quant import describe, quantize_weights  # torchao is imported by quantize_weights alone

    try:
        quantize_weights(model, args.weights)
    except (ImportError, ValueError) as e:
        raise CommandError(f"--weights {args.weights}: {e}") from None
    print(f"qkv: {describe(model)}", file=sys.stderr)
    return model
