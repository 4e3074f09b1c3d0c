"""The OpenAI-compatible protocol as pure functions, and the chunked bodies a streamed answer arrives in."""

from __future__ import annotations

import asyncio
import json

import pytest

from cascade.serving import openai
from cascade.serving.runtime import http11


def test_requests_are_validated_and_a_bad_field_is_named() -> None:
    chat = openai.parse(openai.CHAT, b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 1}')
    assert isinstance(chat, openai.ChatRequest) and chat.max_tokens == 16 and not chat.stream
    assert openai.chat_prompt(chat.messages) == "<|user|>\nhi\n<|assistant|>\n"
    for body, param in [(b'{"model": "m", "prompt": "p", "max_tokens": 0}', "max_tokens"),
                        (b'{"model": "m", "prompt": "p", "temperature": 3}', "temperature"),
                        (b'{"prompt": "p"}', "model"), (b"not json", "body")]:
        with pytest.raises(ValueError) as bad:
            openai.parse(openai.COMPLETIONS, body)
        assert json.loads(str(bad.value))["error"]["param"] == param, body
    with pytest.raises(ValueError, match="messages.0.role"):
        openai.parse(openai.CHAT, b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}')


def test_answers_and_stream_chunks_have_the_openai_shapes() -> None:
    chat = openai.ChatRequest(model="m", messages=[openai.ChatMessage(role="user", content="hi")])
    whole = openai.completion(chat, "yo", "stop", 3, 1)
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"] == {"role": "assistant",
                                                                                       "content": "yo"}
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    first, last = openai.chunk(chat, "c1", "y", first=True), openai.chunk(chat, "c1", "", finish="length")
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"] == {"role": "assistant",
                                                                                           "content": "y"}
    assert last["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length"} and last["id"] == "c1"
    text = openai.chunk(openai.CompletionRequest(model="m", prompt="p"), "c2", "o")
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "o"
    assert openai.sse({"a": 1}) == b'data: {"a":1}\n\n' and openai.DONE == b"data: [DONE]\n\n"


def test_a_chunked_body_is_read_piece_by_piece() -> None:
    async def read() -> list[bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n1;x=y\r\n!\r\n0\r\n\r\n")
        reader.feed_eof()
        head = await http11.read_head(reader)
        assert head is not None and http11.status_of(head) == 200
        return [piece async for piece in http11.chunks(reader, head, 1.0)]

    assert asyncio.run(read()) == [b"hello", b"!"]
