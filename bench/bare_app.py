"""The baseline for the gateway benchmark: a bare FastAPI endpoint on the same server stack.

It reads the body and answers 202, with no parsing, validation or publishing.
"""

from __future__ import annotations

from fastapi import FastAPI, Request

app = FastAPI()


@app.post("/events", status_code=202)
async def events(request: Request) -> dict[str, int]:
    await request.body()
    return {"accepted": 1}
