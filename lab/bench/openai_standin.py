"""An OpenAI-compatible server that stands in for an engine's (``vllm serve``): no model, the
same paths and bodies. For ``kvcast tap``'s tests and benchmark.

- ``POST /v1/chat/completions``: the reply is ``answer N`` (N: the number of messages);
  ``usage`` with ``prompt_tokens = 10 * N`` and ``prompt_tokens_details.cached_tokens`` half of
  it; with ``stream``: server-sent events (a role chunk, one chunk a word 10 ms apart, a finish
  chunk, the usage chunk when ``stream_options.include_usage``, ``data: [DONE]``).
- ``GET /v1/models``: one model.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

WORD_INTERVAL_S = 0.01


def reply_to(messages: list[dict]) -> str:
    return f"answer {len(messages)}"


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    messages = body["messages"]
    prompt_tokens = 10 * len(messages)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 3,
             "total_tokens": prompt_tokens + 3,
             "prompt_tokens_details": {"cached_tokens": prompt_tokens // 2}}  # fmt: skip
    text = reply_to(messages)
    base = {"id": f"chatcmpl-{len(messages)}", "created": 1, "model": body["model"]}
    if not body.get("stream"):
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "finish_reason": "stop", "message": message}
        return web.json_response(
            {**base, "object": "chat.completion", "usage": usage, "choices": [choice]}
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)

    async def send(data: dict) -> None:
        await response.write(f"data: {json.dumps(data)}\n\n".encode())

    chunk = {**base, "object": "chat.completion.chunk"}
    await send({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    for word in text.split(" "):
        await send({**chunk, "choices": [{"index": 0, "delta": {"content": word + " "}}]})
        await asyncio.sleep(WORD_INTERVAL_S)
    await send({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        await send({**chunk, "choices": [], "usage": usage})
    await response.write(b"data: [DONE]\n\n")
    return response


async def models(_request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})


def standin_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    return app
