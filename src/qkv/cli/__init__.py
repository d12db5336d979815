"""The `qkv` command: parse, call the library, print.

Each command X is a pair in COMMANDS: ``add_X(sub)`` declares its arguments and returns its parser,
``run_X(args)`` calls the library and returns the exit status (a command that reads a model declares
only its own flags, ``sources.model_command`` adds the model's). A new command is one pair in a
module of this package and its name in HOMES; a new figure or study, one line in
verify.FIGURES or study.STUDIES. Errors: see errors.py (user error 2, bug in qkv 1, Ctrl-C 130).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

from . import bench, chat, explore, export, serve, study, train, translate, verify
from .errors import CommandError, Parser, debugging, report
from .sources import add_model_source, load_model_source

__all__ = ["COMMANDS", "CommandError", "add_model_source", "build_parser", "load_model_source", "main"]

HOMES = {  # command -> the module of its add_X and run_X, in `qkv --help` order
    "train": train, "sample": train, "chat": chat, "serve": serve, "info": train, "export": export,
    "translate": translate, "verify": verify, "plot": verify, "study": study, "explore": explore, "bench": bench,
}
COMMANDS = {  # name -> (add_X(sub) -> parser, run_X(args) -> exit status)
    name: (getattr(home, f"add_{name}"), getattr(home, f"run_{name}")) for name, home in HOMES.items()}


def build_parser() -> argparse.ArgumentParser:
    """The `qkv` parser: one subcommand per entry of COMMANDS, each knowing its run function."""
    from .. import __version__

    parser = Parser(prog="qkv", description="Attention, multi-head attention and positional encodings: "
                    "train, sample, check and look inside Transformer models.")
    parser.add_argument("--version", action="version", version=f"qkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for add, run in COMMANDS.values():
        add(sub).set_defaults(handler=run)  # not "run": --run DIR is a flag
    return parser


def dispatch(argv: list[str] | None) -> int:
    """Parse ``argv`` and run its command."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the (sub)command's own error, which names it and suggests the flag meant
        args.innermost_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line, for pages that cite it
    if args.command is None:
        parser.print_help()
        raise CommandError("choose a command (listed above)")
    return int(args.handler(args) or 0)


def main(argv: list[str] | None = None) -> int:
    """The console entry point: the command's exit status (0 done, 1 a check failed or a bug, 2 user error,
    130 Ctrl-C: one line saying so, 141 the output's reader went away)."""
    try:
        return dispatch(argv)
    except KeyboardInterrupt as e:  # Ctrl-C: one line (training saves a checkpoint first and says where)
        print(f"qkv: {str(e).strip() or 'interrupted'}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of the output went away (`qkv sample … | head`): nothing to say
        with contextlib.suppress(OSError):  # the exit's flush of what is left writes nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a program stopped by a closed pipe
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else 0
    except Exception as e:  # noqa: BLE001 - the policy in errors.py: one line, never a traceback
        if debugging():
            raise
        return report(e)
