"""The FastAPI application: OpenAI's endpoints over a Scheduler, streaming by server-sent events.

    GET  /health                 {"status": "ok", "active": n, "waiting": w} (no key needed)
    GET  /v1/models              the one model served
    POST /v1/completions         a prompt continued
    POST /v1/chat/completions    a conversation answered, rendered with the checkpoint's chat template

Every error is OpenAI's JSON with a 4xx code (5xx for a failure of qkv's own), and the server goes on serving.
A stream's events are ``data: {chunk}`` lines and a last ``data: [DONE]``; a client that goes away frees its row.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Callable

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from . import protocol
from .request import QueueFull, Request as Job, Settings
from .scheduler import Scheduler


@dataclass
class Served:
    """What the server serves: its name, the scheduler, and the text around the ids (the command builds it)."""

    name: str
    scheduler: Scheduler
    encode: Callable[[str], list[int]]  # a completion's prompt
    decode: Callable[[list[int]], str]  # a completion's tokens
    chat_ids: Callable[[list[dict]], list[int]] | None = None  # a conversation, the assistant's turn opened
    chat_decode: Callable[[list[int]], str] | None = None  # a reply's tokens (default: decode)
    eos_ids: tuple[int, ...] = ()  # where a completion ends
    chat_eos_ids: tuple[int, ...] = ()  # where a reply ends


class APIError(Exception):
    """An error the client gets as OpenAI's JSON with ``status``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, protocol.error(message, type=type, param=param, code=code)


def create_app(served: Served, *, api_key: str | None = None) -> FastAPI:
    """The application; its lifespan starts ``served.scheduler``'s thread unless the scheduler runs already (or a
    caller claimed it: ``serve_forever``), and stops it. ``api_key``: /v1/* then need
    ``Authorization: Bearer KEY``."""
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if not served.scheduler.started:
            served.scheduler.start()
        yield
        served.scheduler.stop()

    app = FastAPI(title="qkv", lifespan=lifespan)
    add_error_handlers(app)
    created = int(time.time())
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(bearer(api_key))])

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "active": served.scheduler.active, "waiting": len(served.scheduler.waiting)}

    @v1.get("/models")
    async def models() -> dict:
        return protocol.model_list(served.name, created)

    @v1.post("/completions")
    async def completions(body: protocol.CompletionRequest):
        return await answer(served, body, completion_ids(served, body), chat=False)

    @v1.post("/chat/completions")
    async def chat_completions(body: protocol.ChatRequest):
        check_model(served, body.model)
        if served.chat_ids is None:
            raise APIError(400, f"{served.name} cannot chat (no chat template): use /v1/completions", param="messages")
        try:
            ids = served.chat_ids([m.as_dict() for m in body.messages])
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None
        return await answer(served, body, ids, chat=True)

    app.include_router(v1)
    return app


def bearer(api_key: str | None):
    """The dependency that checks the bearer token (nothing without a key)."""
    async def check(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer KEY' (qkv serve "
                                "--api-key)", code="invalid_api_key")
    return check


def add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's JSON: ours, the request's validation (400) and Starlette's (404, 405 …)."""
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        if first.get("type") == "json_invalid":
            return JSONResponse(protocol.error(f"malformed JSON: {first.get('msg')}"), status_code=400)
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(protocol.error(f"{param or 'body'}: {first.get('msg')}", param=param), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(protocol.error(f"{request.method} {request.url.path}: {e.detail}", type=kind),
                            status_code=e.status_code)


def check_model(served: Served, model: str) -> None:
    if model != served.name:
        raise APIError(404, f"The model {model!r} does not exist: this server serves {served.name!r}",
                       param="model", code="model_not_found")


def completion_ids(served: Served, body: protocol.CompletionRequest) -> list[int]:
    """The prompt's ids: the text encoded, or the ids given (each checked against the vocabulary)."""
    check_model(served, body.model)
    if isinstance(body.prompt, str):
        return served.encode(body.prompt)
    vocab = served.scheduler.model.config.vocab_size
    if any(not 0 <= i < vocab for i in body.prompt):
        raise APIError(400, f"prompt: token ids must be in 0 … {vocab - 1}", param="prompt")
    return list(body.prompt)


def settings(served: Served, body: protocol.Sampling, prompt: int, chat: bool) -> Settings:
    """The request's decoding settings; 400 when the prompt and the answer do not fit in the context."""
    M = served.scheduler.max_len
    asked = getattr(body, "max_completion_tokens", None) or body.max_tokens
    if prompt == 0:
        raise APIError(400, "the prompt encodes to no tokens", param="prompt")
    if prompt + (asked or 1) > M:
        raise APIError(400, f"This model's maximum context length is {M} tokens. However, you requested "
                            f"{prompt + (asked or 1)} tokens ({prompt} in the prompt, {asked or 1} for the answer).",
                       param="messages" if chat else "prompt", code="context_length_exceeded")
    return Settings(max_tokens=asked or M - prompt, temperature=body.temperature, top_p=body.top_p,
                    stop=body.stops, seed=body.seed,
                    eos_ids=frozenset(() if body.ignore_eos else served.chat_eos_ids if chat else served.eos_ids))


class Channel:
    """Events from the scheduler's thread into the event loop: every piece (a stream) or the end alone."""

    def __init__(self, every: bool) -> None:
        self.loop, self.queue, self.every = asyncio.get_running_loop(), asyncio.Queue(), every

    def put(self, text: str, finish: str | None) -> None:
        if self.every or finish is not None:
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (text, finish))
            except RuntimeError:  # the loop is closed: the server stopped, nobody is waiting
                pass


async def answer(served: Served, body: protocol.Sampling, ids: list[int], *, chat: bool):
    """Queue the request; a whole response, or a stream of server-sent events."""
    channel = Channel(every=body.stream)
    decode = (served.chat_decode or served.decode) if chat else served.decode
    job = Job(ids, settings(served, body, len(ids), chat), decode, channel.put)
    try:
        served.scheduler.submit(job)
    except QueueFull as e:
        raise APIError(429, f"The server is busy: {e}. Retry later.", type="rate_limit_error",
                       code="rate_limit_exceeded") from None
    except ValueError as e:
        raise APIError(400, str(e), param="prompt") from None
    rid = protocol.ids("chatcmpl" if chat else "cmpl")
    if body.stream:
        return StreamingResponse(events(served, body, job, channel, rid, chat), media_type="text/event-stream")
    try:
        while (await channel.queue.get())[1] is None:
            pass
    finally:
        served.scheduler.cancel(job)  # a no-op once it finished; frees its row if this handler is cancelled
    if job.error is not None:
        raise APIError(500, f"decoding failed: {job.error}", type="server_error")
    choice = protocol.choice(chat, job.answer.text, job.finish_reason, delta=False)
    return protocol.response(rid, served.name, chat, [choice], chunk=False,
                             usage_=protocol.usage(len(ids), len(job.tokens)))


async def events(served: Served, body: protocol.Sampling, job: Job, channel: Channel, rid: str, chat: bool):
    """The stream: a chunk per piece of text, the finish reason, usage when asked, then [DONE]."""
    def sse(payload: dict) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def chunk(choices: list[dict], usage_: dict | None = None) -> str:
        return sse(protocol.response(rid, served.name, chat, choices, chunk=True, usage_=usage_))

    try:
        if chat:
            yield chunk([protocol.choice(chat, "", None, delta=True, first=True)])
        finish = None
        while finish is None:
            text, finish = await channel.queue.get()
            if finish == "error":
                yield sse(protocol.error(f"decoding failed: {job.error}", type="server_error"))
                break
            yield chunk([protocol.choice(chat, text, finish, delta=True)])
        if body.include_usage and finish != "error":
            yield chunk([], protocol.usage(len(job.ids), len(job.tokens)))
        yield "data: [DONE]\n\n"
    finally:
        served.scheduler.cancel(job)  # the client went away mid-stream: its row is freed at the next step
