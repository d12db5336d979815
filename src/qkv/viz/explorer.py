"""The attention explorer: one self-contained HTML page (or a loopback server) showing what
every head of a qkv model does on a piece of text.

    text → tokens.encode_text → ids → maps.attention_maps (L, H, T, T) → JSON → page (canvas + DOM)
    text → maps.translation_attention → encoder (L, H, S, S), decoder (L, H, T, T), cross (L, H, T, S)
         → JSON with three views → the same page, with a view selector

A GPT or Encoder page has one view (its data keeps the original flat fields); an encoder-decoder
page has ``views``, each with its own query (row) and key (column) tokens, layers and heads.

Shapes: L layers, H heads, T tokens (target), S source tokens, C model width.

Safety: every user string (text, token labels, title) travels as JSON inside a
``<script type="application/json">`` block with ``<``, ``>``, ``&`` escaped as ``\\u003c`` …,
and the page writes it with ``textContent`` only. A Content-Security-Policy with a per-page
nonce forbids any other script, any network load, and inline event handlers.
"""
from __future__ import annotations

import base64
import html
import json
import os
import secrets
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ..fileio import atomic_text
from ..models import Transformer
from .labels import readable_tokens
from .maps import TranslationAttention, attention_maps, model_device, pair_attention, translation_attention

ASSETS = Path(__file__).with_name("explorer_assets")
MAX_TOKENS = 512  # the page draws T×T matrices; beyond this they are unreadable anyway
MAX_VALUES = 1 << 23  # L·H·T·T floats (32 MiB of float32) in one page
MAX_CHARS = 1000  # default input bound of the server
LOOPBACK = "127.0.0.1"

_POSITION_NOTES = {
    "rope": "RoPE rotates queries and keys inside attention by position·θ_i, so there is no additive "
            "positional matrix to show; its effect is in the attention maps.",
    "alibi": "ALiBi adds −m_h·|i−j| to each head's scores inside attention, so there is no additive "
             "positional matrix to show; its effect is in the attention maps.",
    "none": "This model has no positional encoding: bidirectional attention then cannot tell token order; "
            "a causal model can only infer positions from its mask.",
}


def _b64_float32(t: Tensor) -> str:
    """A tensor as base64 of little-endian float32, C order (the page reads it with a DataView)."""
    arr = t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False)
    return base64.b64encode(arr.tobytes()).decode("ascii")


def position_kind(model: nn.Module) -> str | None:
    """The model's ``config.position.kind``; None for a model without a qkv config."""
    return getattr(getattr(getattr(model, "config", None), "position", None), "kind", None)


def _positional(model: nn.Module, T: int, device: torch.device) -> dict[str, Any]:
    """The additive PE rows 0 … T−1 as (T, C) plus their cosine similarity (T, T), or a note why none."""
    from ..nn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

    pos = getattr(getattr(model, "embed", None), "pos", None)
    if isinstance(pos, SinusoidalPositionalEncoding):
        kind, pe = "sinusoidal", pos(torch.arange(T, device=device))  # (T, C)
    elif isinstance(pos, LearnedPositionalEmbedding):
        kind, pe = "learned", pos.weight[:T]  # (T, C)
    else:
        name = position_kind(model) or "none"
        return {"kind": name, "note": _POSITION_NOTES.get(name, f"no additive positional matrix ({name})")}
    pe = pe.detach().float()
    unit = pe / pe.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return {"kind": kind, "T": T, "C": pe.size(-1), "base": getattr(pos, "base", None), "matrix": _b64_float32(pe),
            "similarity": _b64_float32(unit @ unit.T)}  # (T, T) cosine similarity of positions


def entropy_bits(weights: Tensor) -> tuple[Tensor, Tensor]:
    """weights (..., T, S) -> (mean row entropy, mean row maximum log2(#allowed keys)), each (...), in bits.

    A row is a query's distribution over keys; a row of zeros (a query that may attend to
    nothing) is left out of both means.
    """
    p = weights.double()
    h = -(p * torch.where(p > 0, p.log2(), torch.zeros_like(p))).sum(-1)  # (..., T)
    allowed = (p > 0).sum(-1)  # (..., T)
    live = (allowed > 0).double()
    n = live.sum(-1).clamp_min(1)
    top = allowed.clamp_min(1).double().log2()
    return (h * live).sum(-1) / n, (top * live).sum(-1) / n


def _one_sequence(ids: Tensor | Sequence[int], labels: Sequence[str]) -> Tensor:
    """ids as a (1, T) long tensor, checked: one sequence of 1 … MAX_TOKENS ids, one string label each."""
    if not isinstance(ids, Tensor):
        if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise TypeError(f"ids must be a list of ints or an integer tensor, got {type(ids).__name__}")
        ids = torch.tensor(ids, dtype=torch.long)
    if ids.dim() == 2 and ids.size(0) == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.is_floating_point():
        raise ValueError(f"ids must be one sequence, (T,) or (1, T) integers, got {ids.dtype} {tuple(ids.shape)}")
    T = ids.numel()
    if not 1 <= T <= MAX_TOKENS:
        raise ValueError(f"the explorer shows 1 … {MAX_TOKENS} tokens, got {T}")
    if isinstance(labels, str) or len(labels) != T or not all(isinstance(s, str) for s in labels):
        got = f"{type(labels).__name__} of {len(labels)}" if hasattr(labels, "__len__") else type(labels).__name__
        raise ValueError(f"token_labels must be a list of {T} strings (one per id), got {got}")
    return ids[None]  # (1, T)


@torch.no_grad()
def attention_data(
    model: nn.Module, ids: Tensor | Sequence[int], token_labels: Sequence[str], *, title: str = "qkv explorer",
    target_ids: Tensor | Sequence[int] | None = None, target_labels: Sequence[str] | None = None,
    translation: str = "",
) -> dict[str, Any]:
    """Run ``model`` on one sequence and gather what the page shows, as a JSON-ready dict.

    Args:
        model: a qkv ``GPT`` or ``Encoder`` (anything whose forward takes ``return_attention=True``
            and returns ``.attentions``, one (1, H, T, T) tensor per layer), or a ``Transformer``
            given ``target_ids`` (see ``translation_data``). Run in eval mode.
        ids: (T,) or (1, T) token ids (a Transformer's source, EOS included). token_labels: T strings.
        target_ids, target_labels: a Transformer's decoder input (START + target), one label each;
            ``translation``: the target text for the header.
    Returns:
        dict with tokens, ids, attention (base64 float32, (L, H, T, T)), entropy (L × H bits),
        positional (the additive PE matrix when the model has one) and model facts.
    """
    if not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}")
    x = _one_sequence(ids, token_labels)  # (1, T)
    if target_ids is not None or target_labels is not None:
        return _pair_data(model, x, token_labels, target_ids, target_labels, title=title, translation=translation)
    T = x.size(1)
    att = attention_maps(model, x)  # (L, H, T, T); TypeError for anything but a qkv GPT / Encoder
    L, H = att.shape[:2]
    _check_size(att.numel(), f"{L} layers × {H} heads × {T}² tokens")
    ent, ent_max = entropy_bits(att)  # (L, H) each
    return {
        "title": title,
        "tokens": list(token_labels),
        "ids": [int(i) for i in x[0].tolist()],
        "num_layers": L, "num_heads": H, "T": T,
        "attention": _b64_float32(att),
        "entropy": _rounded(ent), "entropy_max": _rounded(ent_max),
        "model": _model_facts(model, causal=_is_causal(att)),
        "positional": _positional(model, T, model_device(model)),
    }


def _pair_data(model: nn.Module, x: Tensor, source: Sequence[str], target_ids: Any, target: Any, *,
               title: str, translation: str) -> dict[str, Any]:
    """attention_data for an encoder-decoder: source x (1, S), target ids and labels, checked."""
    y = _one_sequence([] if target_ids is None else target_ids, target or [])  # (1, T)
    if not isinstance(model, Transformer):
        raise TypeError(f"target_ids are for a qkv.Transformer (encoder-decoder), got {type(model).__name__}")
    att = pair_attention(model, x[0].tolist(), source, y[0].tolist(), target, translation=translation)
    return translation_data(model, att, title=title)


def _check_size(values: int, what: str) -> None:
    if values > MAX_VALUES:
        raise ValueError(f"{what} is {values:,} weights, more than the page holds ({MAX_VALUES:,}); "
                         "use a shorter text")


def _rounded(bits: Tensor) -> list[list[float]]:
    """(L, H) -> nested lists of floats to 4 decimals (the page's JSON)."""
    return [[round(float(v), 4) for v in row] for row in bits]


def _is_causal(att: Tensor) -> bool:
    """Square maps (..., T, T) with no weight above the diagonal, T > 1."""
    return att.size(-1) == att.size(-2) > 1 and bool(torch.all(att.triu(1) == 0))


def _model_facts(model: nn.Module, *, causal: bool) -> dict[str, Any]:
    config = getattr(model, "config", None)
    return {"kind": type(model).__name__, "causal": causal, "d_model": getattr(config, "d_model", None),
            "positional": position_kind(model),
            "parameters": sum(p.numel() for p in model.parameters())}


# the encoder-decoder's views: title, caption, and which side's tokens are the rows (queries) and columns (keys)
VIEWS = {
    "encoder": ("encoder self-attention", "source × source: each source token (row) attends to every source "
                                          "token (column)", "source", "source"),
    "decoder": ("decoder self-attention", "target × target, causal: each decoder input (row) attends to itself "
                                          "and the tokens before it (column)", "target", "target"),
    "cross": ("cross-attention", "target × source: each decoder input (row; it predicts the next target token) "
                                 "attends to the encoded source tokens (column) — the paper's alignment figure",
              "target", "source"),
}


def _view(name: str, maps: Tensor, queries: Sequence[str], keys: Sequence[str], query_ids: Sequence[int],
          key_ids: Sequence[int]) -> dict[str, Any]:
    """One view of the page: maps (L, H, T, S) with its row (query) and column (key) tokens."""
    L, H, T, S = maps.shape
    ent, ent_max = entropy_bits(maps)  # (L, H) each
    title, caption, query_side, key_side = VIEWS[name]
    return {"name": name, "title": title, "caption": caption, "same": query_side == key_side,
            "query_side": query_side, "key_side": key_side,
            "queries": list(queries), "keys": list(keys), "query_ids": list(query_ids), "key_ids": list(key_ids),
            "num_layers": L, "num_heads": H, "rows": T, "cols": S, "attention": _b64_float32(maps),
            "entropy": _rounded(ent), "entropy_max": _rounded(ent_max), "causal": _is_causal(maps)}


def translation_data(model: Transformer, att: TranslationAttention, *, title: str = "qkv explorer") -> dict[str, Any]:
    """The page's data for an encoder-decoder: three views (encoder, decoder, cross), the text and its
    translation. ``att``: from ``maps.translation_attention`` (a text) or ``maps.pair_attention`` (ids)."""
    if not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}")
    S, T = len(att.source), len(att.target)
    if not (1 <= S <= MAX_TOKENS and 1 <= T <= MAX_TOKENS):
        raise ValueError(f"the explorer shows 1 … {MAX_TOKENS} tokens per side, got {S} source and {T} target")
    maps = att.views()
    _check_size(sum(m.numel() for m, _, _ in maps.values()), f"source {S} × target {T} tokens over all layers")
    ids = {"encoder": (att.source_ids, att.source_ids), "decoder": (att.target_ids, att.target_ids),
           "cross": (att.target_ids, att.source_ids)}
    views = [_view(name, m, q, k, *ids[name]) for name, (m, q, k) in maps.items()]
    facts = _model_facts(model, causal=False) | {"layers": [v["num_layers"] for v in views[:2]]}
    return {"title": title, "kind": "translation", "text": att.text, "translation": att.translation,
            "views": views, "view": "cross", "model": facts,
            "positional": _positional(model.encoder, S, model_device(model))}


def text_data(model: nn.Module, tokenizer: Any, text: str, *, title: str = "qkv explorer",
              target: str | None = None, num_beams: int = 4) -> dict[str, Any]:
    """The page's data for ``text``: a ``Transformer`` translates it (``num_beams``; 1: greedy), or reads
    ``target``, and shows its three kinds of attention; a ``GPT`` or ``Encoder`` shows its self-attention."""
    if isinstance(model, Transformer):
        att = translation_attention(model, tokenizer, text, target=target, num_beams=num_beams)
        return translation_data(model, att, title=title)
    if target is not None:
        raise ValueError(f"a target translation is for an encoder-decoder qkv.Transformer, got {type(model).__name__}")
    max_len = getattr(getattr(model, "config", None), "max_len", None)
    ids, labels = readable_tokens(tokenizer, text, max_len=max_len)
    return attention_data(model, ids, labels, title=title)


def _script_json(data: Any) -> str:
    """JSON safe inside a <script> element: no '<', '>', '&' (so no '</script>' or '<!--') survives."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for ch, esc in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def page(data: dict[str, Any] | None, *, title: str = "qkv explorer", server: dict[str, Any] | None = None,
         experts: dict[str, Any] | None = None) -> str:
    """The HTML document for ``data`` (from ``attention_data``; None: an empty page awaiting text), with the
    expert-load panel when given ``experts`` (``qkv.viz.experts.expert_load_data``: a mixture-of-experts run)."""
    nonce = secrets.token_urlsafe(16)
    csp = (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; img-src data:; "
           "connect-src 'self'; base-uri 'none'; form-action 'none'")
    boot = {"data": data, "server": server} | ({"experts": experts} if experts else {})
    return (ASSETS / "explorer.html").read_text(encoding="utf-8").format(
        csp=csp, nonce=nonce, title=html.escape(title),
        css=(ASSETS / "explorer.css").read_text(encoding="utf-8"),
        js=(ASSETS / "explorer.js").read_text(encoding="utf-8"),
        data=_script_json(boot),
    )


def render_html(
    model: nn.Module, ids: Tensor | Sequence[int], token_labels: Sequence[str], *, title: str = "qkv explorer",
    target_ids: Tensor | Sequence[int] | None = None, target_labels: Sequence[str] | None = None,
    translation: str = "",
) -> str:
    """One self-contained HTML page (no network: scripts, styles and data inline) exploring the
    attention of ``model`` on ``ids``. See ``attention_data`` for the arguments."""
    data = attention_data(model, ids, token_labels, title=title, target_ids=target_ids,
                          target_labels=target_labels, translation=translation)
    return page(data, title=title)


def write_html(path: str | os.PathLike, html_text: str) -> Path:
    """Write the page atomically (temp file, then rename)."""
    path = Path(path)
    atomic_text(path, html_text)
    return path


tokenize = readable_tokens  # text -> (ids, labels: 狗₁ 狗₂ 狗₃ for byte pieces); the name `qkv explore` calls


# --- the loopback server ---------------------------------------------------------------

class _Explorer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, model: nn.Module, tokenizer: Any, *, port: int, max_chars: int, title: str,
                 text: str | None, experts: dict[str, Any] | None) -> None:
        super().__init__((LOOPBACK, port), _Handler)  # loopback only: never reachable from the network
        self.model, self.tokenizer, self.max_chars, self.title = model, tokenizer, max_chars, title
        self.lock = threading.Lock()  # one forward at a time
        data = self.run_text(text) if text else None
        server = {"max_chars": max_chars, "text": text or "", "title": title}
        self.html = page(data, title=title, server=server, experts=experts).encode("utf-8")

    def run_text(self, text: str) -> dict[str, Any]:
        if len(text) > self.max_chars:
            raise _TooLarge(f"the text has {len(text):,} characters; this server accepts at most "
                            f"{self.max_chars:,} (restart it with --max-chars to change that)")
        with self.lock:
            return text_data(self.model, self.tokenizer, text, title=self.title)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.server_address[1]}/"


class _TooLarge(ValueError):
    pass


class _Handler(BaseHTTPRequestHandler):
    server: _Explorer
    server_version = "qkv-explore"

    def log_message(self, format: str, *args: Any) -> None:  # quiet; errors still go to stderr
        pass

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj, ensure_ascii=False).encode("utf-8"), "application/json; charset=utf-8")

    def _host_ok(self) -> bool:
        """Refuse other Host names (DNS rebinding: evil.example resolving to 127.0.0.1)."""
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
        return host in (LOOPBACK, "localhost")

    def do_GET(self) -> None:
        if not self._host_ok():
            return self._json(HTTPStatus.FORBIDDEN, {"error": "unexpected Host header"})
        if self.path in ("/", "/index.html"):
            return self._send(HTTPStatus.OK, self.server.html, "text/html; charset=utf-8")
        self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {self.path[:100]}"})

    def do_POST(self) -> None:
        if not self._host_ok():
            return self._json(HTTPStatus.FORBIDDEN, {"error": "unexpected Host header"})
        if self.path != "/api/attention":
            return self._json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {self.path[:100]}"})
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            return self._json(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"error": "send JSON: {\"text\": \"...\"}"})
        try:
            length = int(self.headers.get("Content-Length") or "")
            if length < 0:
                raise ValueError
        except ValueError:
            return self._json(HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length is required"})
        limit = 6 * self.server.max_chars + 64  # JSON escapes: at most 6 bytes per character ("\uXXXX")
        if length > limit:
            self.close_connection = True  # the body is not read
            return self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {
                "error": f"the request is {length:,} bytes; this server accepts texts of at most "
                         f"{self.server.max_chars:,} characters (restart it with --max-chars to change that)"})
        try:
            body = json.loads(self.rfile.read(length).decode("utf-8"))
            text = body.get("text") if isinstance(body, dict) else None
            if not isinstance(text, str):
                raise ValueError('expected a JSON object {"text": "..."}')
        except (UnicodeDecodeError, ValueError) as e:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": f"bad request: {e}"})
        try:
            self._json(HTTPStatus.OK, self.server.run_text(text))
        except _TooLarge as e:
            self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": str(e)})
        except (ValueError, TypeError, KeyError, IndexError) as e:  # unknown characters, too long for the model …
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(e) or type(e).__name__})


def make_server(
    model: nn.Module, tokenizer: Any, *, port: int = 0, max_chars: int = MAX_CHARS,
    title: str = "qkv explorer", text: str | None = None, experts: dict[str, Any] | None = None,
) -> _Explorer:
    """A ThreadingHTTPServer on 127.0.0.1:``port`` (0: any free port) serving the explorer page,
    whose text box POSTs {"text": …} to /api/attention. Call ``serve_forever()``; ``.url`` is its address.
    ``text``: shown when the page opens; ``experts``: the expert-load panel (see ``page``). Texts over
    ``max_chars`` get HTTP 413 and a message."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an int in 0 … 65535, got {port!r}")
    if not isinstance(max_chars, int) or isinstance(max_chars, bool) or not 1 <= max_chars <= 100_000:
        raise ValueError(f"max_chars must be an int in 1 … 100000, got {max_chars!r}")
    return _Explorer(model, tokenizer, port=port, max_chars=max_chars, title=title, text=text, experts=experts)


def serve(server: _Explorer) -> None:
    """Serve until Ctrl-C."""
    print(f"qkv explore: serving on {server.url} (loopback only; Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
