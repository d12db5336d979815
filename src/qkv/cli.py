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


# --- train / sample / info (training issue) -------------------------------------------
# --- end train / sample / info ----------------------------------------------------------

# --- verify / plot (claims issue) -------------------------------------------------------
# --- end verify / plot ------------------------------------------------------------------

# --- study (positional-encoding studies) ------------------------------------------------
# --- end study --------------------------------------------------------------------------

# --- explore (attention explorer) -------------------------------------------------------
# --- end explore ------------------------------------------------------------------------

# --- bench ------------------------------------------------------------------------------
# --- end bench --------------------------------------------------------------------------

ADDERS: list = []  # each section appends its _add_NAME here, next to its definitions


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
            return 2
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("qkv: interrupted", file=sys.stderr)
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
