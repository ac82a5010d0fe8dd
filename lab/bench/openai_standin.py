"""An OpenAI-compatible server that stands in for an engine's (``vllm serve``): no model, the
same paths and bodies. For ``kvcast tap``'s tests and benchmark.

- ``POST /v1/chat/completions``: the reply is ``answer N`` (N: the number of messages);
  ``usage`` with ``prompt_tokens = 10 * N`` and ``prompt_tokens_details.cached_tokens`` half of
  it; with ``stream``: server-sent events (a role chunk, one chunk a word 10 ms apart, a finish
  chunk, the usage chunk when ``stream_options.include_usage``, ``data: [DONE]``). Built with
  ``hold_after_first_word``, a stream waits after its first word until that event is set (at
  most ``HOLD_S``; ``app[HELD_TOO_LONG]`` then turns True): a test releases it only once its
  client has read the first word, which proves the word was relayed before the stream ended.
- ``GET /v1/models``: one model.
"""

from __future__ import annotations

import asyncio
import json
import uuid

from aiohttp import web

WORD_INTERVAL_S = 0.01
HOLD_S = 5.0
HOLD = web.AppKey("hold", asyncio.Event)
HELD_TOO_LONG = web.AppKey("held_too_long", bool)


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
    # Unique per response, as an engine's: the tap makes it the event's request_id.
    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": 1, "model": body["model"]}
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
    hold = request.app.get(HOLD)
    for position, word in enumerate(text.split(" ")):
        await send({**chunk, "choices": [{"index": 0, "delta": {"content": word + " "}}]})
        await asyncio.sleep(WORD_INTERVAL_S)
        if position == 0 and hold is not None:
            try:
                await asyncio.wait_for(hold.wait(), HOLD_S)
            except TimeoutError:
                request.app[HELD_TOO_LONG] = True
    await send({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        await send({**chunk, "choices": [], "usage": usage})
    await response.write(b"data: [DONE]\n\n")
    return response


async def models(_request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})


def standin_app(hold_after_first_word: asyncio.Event | None = None) -> web.Application:
    app = web.Application()
    if hold_after_first_word is not None:
        app[HOLD] = hold_after_first_word
        app[HELD_TOO_LONG] = False
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    return app


def main() -> None:
    """``python -m kvcast.lab.bench.openai_standin --listen HOST:PORT``: the compose stack's
    engine stand-in (no model, no GPU)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT")
    host, _, port = parser.parse_args().listen.rpartition(":")
    print(f"openai stand-in listening on {host}:{port}", flush=True)
    web.run_app(standin_app(), host=host, port=int(port), print=None)


if __name__ == "__main__":
    main()
