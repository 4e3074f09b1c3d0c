"""Text generation for the model server: a causal language model answering whole or streamed.

``TextModel`` wraps a transformers model and its tokenizer (a ``huggingface`` folder, or a
``lora-adapter`` merged into its base): ``complete`` returns the answer with its token counts,
``stream`` yields the text as the model produces it (transformers' ``TextIteratorStreamer``, the
generation on a thread of its own). ``openai_routes`` adds the OpenAI-compatible completions
and chat completions (``serving/openai.py``) to the model server's FastAPI application, with
Server-Sent Events when the request asks for ``stream``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from cascade.serving import openai


class TextModel:
    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer
        self._lock = threading.Lock()  # one generation at a time: the model is not shared between threads

    def _options(self, max_tokens: int, temperature: float, top_p: float, seed: int | None) -> dict[str, Any]:
        import torch

        options: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": temperature > 0,
                                   "pad_token_id": self.tokenizer.pad_token_id or self.tokenizer.eos_token_id}
        if temperature > 0:
            options.update(temperature=temperature, top_p=top_p)
            if seed is not None:
                torch.manual_seed(seed)
        return options

    def complete(self, prompt: str, max_tokens: int = 32, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None) -> tuple[str, str, int, int]:
        """(text, finish reason ``stop`` | ``length``, prompt tokens, completion tokens)."""
        import torch

        encoded = self.tokenizer(prompt, return_tensors="pt")
        with self._lock, torch.no_grad():
            tokens = self.model.generate(**encoded, **self._options(max_tokens, temperature, top_p, seed))
        new = tokens[0][encoded["input_ids"].shape[1]:]
        text = str(self.tokenizer.decode(new, skip_special_tokens=True))
        return text, "length" if len(new) >= max_tokens else "stop", int(encoded["input_ids"].shape[1]), len(new)

    def stream(self, prompt: str, max_tokens: int = 32, temperature: float = 0.0, top_p: float = 1.0,
               seed: int | None = None) -> Iterator[str | tuple[str, int]]:
        """The answer's pieces as they are generated, then ``(finish reason, completion tokens)``."""
        import torch
        from transformers import TextIteratorStreamer

        encoded = self.tokenizer(prompt, return_tensors="pt")
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        made: dict[str, Any] = {}

        def run() -> None:
            with self._lock, torch.no_grad():
                try:
                    made["tokens"] = self.model.generate(**encoded, **self._options(max_tokens, temperature, top_p, seed),
                                                         streamer=streamer)
                except Exception as exc:  # noqa: BLE001 - ends the stream; the caller reports it
                    made["error"] = exc
                    streamer.end()  # type: ignore[no-untyped-call]

        worker = threading.Thread(target=run, name="generate", daemon=True)
        worker.start()
        for piece in streamer:
            if piece:
                yield piece
        worker.join()
        if "error" in made:
            raise RuntimeError(f"generation failed: {made['error']}")
        count = int(made["tokens"].shape[1] - encoded["input_ids"].shape[1])
        yield "length" if count >= max_tokens else "stop", count

    def __call__(self, prompts: list[str], max_new_tokens: int = 32) -> list[str]:
        """V1/V2 text generation: greedy answers for a batch of prompts."""
        return [self.complete(p, max_new_tokens)[0] for p in prompts]


def openai_routes(app: FastAPI, lookup: Callable[[str], tuple[str, TextModel | None] | None]) -> None:
    """``POST /openai/v1/completions`` and ``/openai/v1/chat/completions``; ``lookup(name)`` gives the served
    model's format and its TextModel (None for a model that does not generate text), or None if not served."""

    async def handle(request: Request) -> Response:
        try:
            req = openai.parse(request.url.path, await request.body())
        except ValueError as exc:
            return Response(str(exc), 400, media_type="application/json")
        found = lookup(req.model)
        if found is None:
            return JSONResponse(openai.error(f"model {req.model!r} is not served here", "model", "not_found_error"), 404)
        fmt, text = found
        if text is None:
            return JSONResponse(openai.error(f"model {req.model!r} ({fmt}) does not generate text", "model"), 400)
        prompt = openai.chat_prompt(req.messages) if isinstance(req, openai.ChatRequest) else req.prompt
        options = (req.max_tokens, req.temperature, req.top_p, req.seed)
        if not req.stream:
            answer, finish, used, made = await asyncio.to_thread(text.complete, prompt, *options)
            return JSONResponse(openai.completion(req, answer, finish, used, made))
        ident = openai.stream_id(req)

        def events() -> Iterator[bytes]:
            first = True
            try:
                for piece in text.stream(prompt, *options):
                    if isinstance(piece, tuple):
                        yield openai.sse(openai.chunk(req, ident, "", finish=piece[0]))
                    else:
                        yield openai.sse(openai.chunk(req, ident, piece, first=first))
                        first = False
            except RuntimeError as exc:
                yield openai.sse(openai.error(str(exc), None, "server_error"))
            yield openai.DONE

        return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-cache"})

    for path in (openai.COMPLETIONS, openai.CHAT):
        app.add_api_route(path, handle, methods=["POST"], include_in_schema=True)
