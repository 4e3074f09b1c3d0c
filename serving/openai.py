"""The OpenAI-compatible completions protocol, apart from any transport.

What KServe's Hugging Face runtime serves at ``/openai/v1/completions`` and
``/openai/v1/chat/completions``: requests validated with pydantic (a bad field is a 400 naming
it, in OpenAI's error shape), responses and stream chunks built as plain dicts, and Server-Sent
Events framing (``data: {...}`` per chunk, ``data: [DONE]`` at the end). The model server
(``serving/modelserver.py``) runs the generation; the activator only routes by ``model``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

COMPLETIONS, CHAT = "/openai/v1/completions", "/openai/v1/chat/completions"
MODELS = "/openai/v1/models"
DONE = b"data: [DONE]\n\n"


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields a small server does not use

    model: str = Field(min_length=1, max_length=253)
    max_tokens: int = Field(default=16, ge=1, le=4096)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stream: bool = False
    seed: int | None = None


class CompletionRequest(_Sampling):
    prompt: str = Field(max_length=100_000)


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=100_000)


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)


def parse(path: str, body: bytes) -> CompletionRequest | ChatRequest:
    """The request for ``path``; ValueError with OpenAI's error body (``param`` names the field) when invalid."""
    kind: type[CompletionRequest] | type[ChatRequest] = ChatRequest if path == CHAT else CompletionRequest
    try:
        return kind.model_validate_json(body or b"{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or "body"
        raise ValueError(json.dumps(error(f"{param}: {first['msg']}", param))) from exc


def error(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def chat_prompt(messages: list[ChatMessage]) -> str:
    """The turns in the fine-tune's chat template (``<|role|>`` lines), ending where the assistant speaks."""
    return "".join(f"<|{m.role}|>\n{m.content}\n" for m in messages) + "<|assistant|>\n"


def _head(kind: str, model: str, ident: str | None = None) -> dict[str, Any]:
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {"id": ident or f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
            "model": model}


def completion(request: CompletionRequest | ChatRequest, text: str, finish: str, prompt_tokens: int,
               completion_tokens: int) -> dict[str, Any]:
    """The whole answer, for a request without ``stream``."""
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    if isinstance(request, ChatRequest):
        return {**_head("chat.completion", request.model), "usage": usage, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}]}
    return {**_head("text_completion", request.model), "usage": usage,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}


def chunk(request: CompletionRequest | ChatRequest, ident: str, piece: str, finish: str | None = None,
          first: bool = False) -> dict[str, Any]:
    """One streamed piece: a ``delta`` for chat (the first one names the role), ``text`` for completions."""
    if isinstance(request, ChatRequest):
        delta: dict[str, str] = {"role": "assistant", "content": piece} if first else {"content": piece} if piece else {}
        return {**_head("chat.completion.chunk", request.model, ident),
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return {**_head("text_completion", request.model, ident),
            "choices": [{"index": 0, "text": piece, "finish_reason": finish, "logprobs": None}]}


def stream_id(request: CompletionRequest | ChatRequest) -> str:
    return f"{'chatcmpl' if isinstance(request, ChatRequest) else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def model_list(models: list[tuple[str, str]]) -> dict[str, Any]:
    """``GET /openai/v1/models``: (name, owning project) pairs."""
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": owner}
                                       for name, owner in models]}
