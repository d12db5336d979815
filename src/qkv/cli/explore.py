"""`qkv explore`: every head's attention on a text, as one HTML page or served on 127.0.0.1."""
from __future__ import annotations

import argparse
import os
import sys

from .errors import CommandError
from .sources import add_model_source


def add_explore(sub) -> argparse.ArgumentParser:
    """Declare `qkv explore`."""
    p = sub.add_parser("explore", help="explore a model's attention in the browser (one HTML file or a local server)",
                       description="Write one self-contained HTML page showing every head's attention on TEXT, "
                       "or serve it on 127.0.0.1 with a text box (--serve). For a --run that trained a mixture of "
                       "experts, the page also shows its expert load (from the run's metrics.jsonl).")
    add_model_source(p)
    p.add_argument("--text", help="the text to look at (required unless --serve)")
    p.add_argument("--out", default="qkv-explore.html", metavar="FILE.html", help="where to write the page")
    p.add_argument("--title", help="page title (default: the model's directory)")
    p.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 with a text box")
    p.add_argument("--port", type=int, default=8765, help="port for --serve (0: any free port; default 8765)")
    p.add_argument("--max-chars", type=int, default=1000, help="longest text --serve accepts (default 1000)")
    p.add_argument("--device", default="cpu", help="torch device for the model (default cpu)")
    p.add_argument("--target", help="an encoder-decoder: show this translation instead of the model's own")
    p.add_argument("--num-beams", type=int, default=4, help="an encoder-decoder: beam width of its translation "
                   "(default 4; 1 = greedy)")
    return p


def run_explore(args: argparse.Namespace) -> int:
    """Write the page (or serve it until Ctrl-C)."""
    from ..viz import explorer
    from ..viz.experts import expert_load_data
    from . import sources  # load_model_source through its module: tests/test_explorer.py replaces it there

    if not args.serve and args.text is None:
        raise CommandError("explore: give --text TEXT (or --serve for a page with a text box)")
    model, tokenizer = sources.load_model_source(args, device=args.device)
    title = args.title or f"qkv explorer: {os.path.basename(os.path.normpath(args.run or args.hf))}"
    load = expert_load_data(args.run, model) if args.run else None  # a mixture of experts' training log
    if args.serve:
        server = explorer.make_server(model, tokenizer, port=args.port, max_chars=args.max_chars,
                                      title=title, text=args.text, experts=load)
        try:
            explorer.serve(server)
        except KeyboardInterrupt:
            print("qkv explore: stopped", file=sys.stderr)
        return 0
    data = explorer.text_data(model, tokenizer, args.text, title=title, target=args.target, num_beams=args.num_beams)
    path = explorer.write_html(args.out, explorer.page(data, title=title, experts=load))
    shown = f"translation: {data['translation']!r}" if "views" in data else f"{len(data['tokens'])} tokens"
    shown += f"; expert load of {len(load['layers'])} MoE layers" if load else ""
    print(f"wrote {path} ({shown}); open it in a browser")
    return 0
