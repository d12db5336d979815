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

# --- train / sample / info (training issue) -------------------------------------------
# --- end train / sample / info ----------------------------------------------------------

# --- verify / plot (claims issue) -------------------------------------------------------
# --- end verify / plot ------------------------------------------------------------------

# --- study (positional-encoding studies) ------------------------------------------------
# --- end study --------------------------------------------------------------------------

# --- explore (attention explorer) -------------------------------------------------------
def _add_explore(sub) -> None:
    p = sub.add_parser("explore", help="explore a model's attention in the browser (one HTML file or a local server)",
                       description="Write one self-contained HTML page showing every head's attention on TEXT, "
                       "or serve it on 127.0.0.1 with a text box (--serve).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", metavar="DIR", help="a run directory written by `qkv train`")
    src.add_argument("--hf", metavar="DIR", help="a Hugging Face model directory (save_pretrained)")
    p.add_argument("--text", help="the text to look at (required unless --serve)")
    p.add_argument("--out", default="qkv-explore.html", metavar="FILE.html", help="where to write the page")
    p.add_argument("--title", help="page title (default: the model's directory)")
    p.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 with a text box")
    p.add_argument("--port", type=int, default=8765, help="port for --serve (0: any free port; default 8765)")
    p.add_argument("--max-chars", type=int, default=1000, help="longest text --serve accepts (default 1000)")
    p.add_argument("--device", default="cpu", help="torch device for the model (default cpu)")
    p.set_defaults(func=_run_explore)


def _load_for_explore(args):
    """(model, tokenizer) from --run or --hf."""
    if args.run:
        try:
            from .checkpoint import load_run
        except ImportError as e:
            raise CommandError(f"--run needs qkv.checkpoint, which is not available ({e})") from None
        run = load_run(args.run, device=args.device)
        return run.model, run.tokenizer
    try:
        from .interop.hf import load_pretrained
    except ImportError as e:
        raise CommandError(f"--hf needs the interop module qkv.interop.hf, which is not available ({e})") from None
    model, tokenizer = load_pretrained(args.hf)
    return model.to(args.device), tokenizer


def _run_explore(args) -> int:
    from .inspect import explorer

    if not args.serve and args.text is None:
        raise CommandError("explore: give --text TEXT (or --serve for a page with a text box)")
    model, tokenizer = _load_for_explore(args)
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
