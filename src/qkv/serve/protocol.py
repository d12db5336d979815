"""OpenAI's protocol as typed models: the requests (validated before anything runs), the responses, the error JSON.

Fields qkv does not use (``logprobs``, ``presence_penalty`` …) are accepted and ignored, as OpenAI-compatible servers
do; ``n`` must be 1. Error bodies are OpenAI's: ``{"error": {"message", "type", "param", "code"}}``.
"""
from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Sampling(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: dict | None = None
    ignore_eos: bool = False  # vLLM's and llama.cpp's extension: decode past end-of-sequence to max_tokens

    @field_validator("stop")
    @classmethod
    def at_most_four(cls, v):
        if isinstance(v, list) and len(v) > 4:
            raise ValueError(f"stop takes at most 4 strings, got {len(v)}")
        return v

    @property
    def stops(self) -> tuple[str, ...]:
        return () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def as_dict(self) -> dict:
        """{"role", "content"} as a chat template reads it (text parts joined)."""
        parts = self.content if isinstance(self.content, list) else [TextPart(type="text", text=self.content or "")]
        return {"role": "system" if self.role == "developer" else self.role, "content": "".join(p.text for p in parts)}


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens


class CompletionRequest(Sampling):
    prompt: str | list[int] = Field(min_length=1)


def ids(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def choice(chat: bool, text: str, finish_reason: str | None, *, delta: bool, first: bool = False) -> dict:
    """One choice of a response (``delta``: of a streamed chunk)."""
    if not chat:
        return {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    if not delta:
        return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason,
                "logprobs": None}
    body = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {})
    return {"index": 0, "delta": body, "finish_reason": finish_reason, "logprobs": None}


def response(rid: str, model: str, chat: bool, choices: list[dict], *, chunk: bool, usage_: dict | None) -> dict:
    """A whole response, or one chunk of a stream."""
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": choices} | (
        {"usage": usage_} if usage_ is not None or not chunk else {})


def error(message: str, *, type: str = "invalid_request_error", param: str | None = None,
          code: str | None = None) -> dict:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def model_list(name: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "qkv"}]}
