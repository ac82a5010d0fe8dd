"""An OpenAI-compatible server that stands in for an engine's (``vllm serve``): no model, the
same paths and bodies. For ``kvcast tap``'s tests and benchmark.

- ``POST /v1/chat/completions``: the reply is ``answer N`` (N: the number of messages);
  ``usage`` with ``prompt_tokens = 10 * N`` and ``prompt_tokens_details.cached_tokens`` half of
  it; with ``stream``: server-sent events (a role chunk, one chunk a word 10 ms apart, a finish
  chunk, the usage chunk when ``stream_options.include_usage``, ``data: [DONE]``). Built with
  ``hold_after_first_word``, a stream waits after its first word until that event is set (at
  most ``HOLD_S``; ``app[GAUGE].held_too_long`` then turns True): a test releases it only once its
  client has read the first word, which proves the word was relayed before the stream ended.
  ``app[GAUGE]`` counts the streams open at once (``open``, ``most``); built with
  ``hold_until_open=N``, every stream waits after its first word until N are open at once (at
  most ``HOLD_S``): a test or the benchmark proves that N streams reached the engine together.
- ``max_tokens`` (benchmark): the reply is that many words instead, ``word_interval_s`` apart
  (after a random phase of up to one interval once held, so streams do not beat in step); with
  ``stamp``, each chunk carries ``"sent_s"``, the stand-in's ``time.monotonic()`` when it was
  written (one clock for every process of the machine), so a client can time each chunk's trip.
- How a response ends (``STANDIN_FINISH``, a request field the stand-in reads, as an engine reads
  its own extensions): ``"standin_finish": REASON`` or a list of one per choice with ``n`` > 1
  (default ``stop``). ``tool_calls``: the reply is a call of the first offered tool (content
  null, ``arguments`` streamed in fragments), finish ``tool_calls``, or ``stop`` when
  ``tool_choice`` names the function (as OpenAI and vLLM answer); ``function_call``: the legacy
  ``function_call`` reply; ``none``: no ``finish_reason`` at all; anything else (``length``,
  ``content_filter``, ``abort``, ...) is the finish_reason of a text reply.
- ``POST /v1/completions`` (the legacy API): the text ``completion of P`` (P: the prompt's
  characters), ``prompt_tokens = 10``, the same finishes for text, streamed or not.
- ``GET /v1/models``: one model.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass, field

from aiohttp import web

WORD_INTERVAL_S = 0.01
HOLD_S = 5.0


@dataclass
class Gauge:
    """Streams open at once: now, the most seen, and ``all_open`` once ``wanted`` were."""

    wanted: int | None = None
    open: int = 0
    most: int = 0
    held_too_long: bool = False  # a hold ran out (what was waited for never came)
    all_open: asyncio.Event = field(default_factory=asyncio.Event)

    def opened(self) -> None:
        self.open += 1
        self.most = max(self.most, self.open)
        if self.wanted is not None and self.open >= self.wanted:
            self.all_open.set()

    def closed(self) -> None:
        self.open -= 1
        if self.open == 0:  # the next wave is held again
            self.all_open.clear()


HOLD = web.AppKey("hold", asyncio.Event)
GAUGE = web.AppKey("gauge", Gauge)
SETTINGS = web.AppKey("settings", dict)


STANDIN_FINISH = "standin_finish"


def reply_to(messages: list[dict]) -> str:
    return f"answer {len(messages)}"


def _finishes(body: dict) -> list[str]:
    """The finish of each choice (``n`` of them) the request asks the stand-in for."""
    n = body.get("n") if isinstance(body.get("n"), int) and body["n"] > 0 else 1
    wanted = body.get(STANDIN_FINISH, "stop")
    finishes = wanted if isinstance(wanted, list) else [wanted] * n
    return [str(f) for f in (finishes + ["stop"] * n)[:n]]


def _tool_call(body: dict, messages: list) -> dict:
    """A call of the first tool the request offers (its arguments name the history length)."""
    tools = body.get("tools") or [{"function": {"name": "tool"}}]
    name = tools[0].get("function", {}).get("name", "tool")
    arguments = json.dumps({"n": len(messages)})
    return {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


def _finish_reason(finish: str, body: dict) -> str | None:
    if finish == "none":
        return None
    if finish == "tool_calls" and isinstance(body.get("tool_choice"), dict):
        return "stop"  # a named tool_choice: OpenAI says stop although the reply is a call
    return finish


def _message(finish: str, text: str, body: dict, messages: list) -> dict:
    if finish == "tool_calls":
        return {"role": "assistant", "content": None, "tool_calls": [_tool_call(body, messages)]}
    if finish == "function_call":
        call = _tool_call(body, messages)["function"]
        return {"role": "assistant", "content": None, "function_call": call}
    return {"role": "assistant", "content": text}


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    messages = body["messages"]
    prompt_tokens = 10 * len(messages)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 3,
             "total_tokens": prompt_tokens + 3,
             "prompt_tokens_details": {"cached_tokens": prompt_tokens // 2}}  # fmt: skip
    settings = request.app[SETTINGS]
    words = body.get("max_tokens") if settings["long_replies"] else None
    text = (
        " ".join(["word"] * words) if isinstance(words, int) and words > 0 else reply_to(messages)
    )
    finishes = _finishes(body)
    # Unique per response, as an engine's: the tap makes it the event's request_id.
    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": 1, "model": body["model"]}
    if not body.get("stream"):
        choices = [
            {"index": i, "finish_reason": _finish_reason(f, body),
             "message": _message(f, text, body, messages)}
            for i, f in enumerate(finishes)
        ]  # fmt: skip
        return web.json_response(
            {**base, "object": "chat.completion", "usage": usage, "choices": choices}
        )
    gauge = request.app[GAUGE]
    gauge.opened()
    try:
        pieces = [_deltas(f, text, body, messages) for f in finishes]
        finished = [_finish_reason(f, body) for f in finishes]
        chunk = {**base, "object": "chat.completion.chunk"}
        return await _stream(request, body, chunk, pieces, finished, usage, settings)
    finally:
        gauge.closed()


def _deltas(finish: str, text: str, body: dict, messages: list) -> list[dict]:
    """The deltas of one choice after its role chunk: a word each, or a tool call in pieces."""
    if finish in ("tool_calls", "function_call"):
        call = _tool_call(body, messages)
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        if finish == "function_call":
            return [{"function_call": {"name": call["function"]["name"], "arguments": ""}},
                    {"function_call": {"arguments": arguments[:half]}},
                    {"function_call": {"arguments": arguments[half:]}}]  # fmt: skip
        head = {**call, "index": 0, "function": {"name": call["function"]["name"], "arguments": ""}}
        parts = [arguments[:half], arguments[half:]]
        rest = [{"tool_calls": [{"index": 0, "function": {"arguments": a}}]} for a in parts]
        return [{"tool_calls": [head]}, *rest]
    return [{"content": word + " "} for word in text.split(" ")]


async def _stream(request: web.Request, body: dict, chunk: dict, pieces: list[list[dict]],
                  finished: list[str | None], usage: dict,
                  settings: dict) -> web.StreamResponse:  # fmt: skip
    """Server-sent events: each choice's role chunk, its deltas (choice by choice at each
    position), the finish chunks, the usage chunk when asked for, ``[DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    stamp, interval = settings["stamp"], settings["word_interval_s"]

    async def send(data: dict) -> None:
        if stamp:
            data["sent_s"] = time.monotonic()
        await response.write(f"data: {json.dumps(data)}\n\n".encode())

    for index in range(len(pieces)):
        delta = {"role": "assistant", "content": ""}
        await send({**chunk, "choices": [{"index": index, "delta": delta}]})
    hold = request.app.get(HOLD)
    gauge = request.app[GAUGE]
    for position in range(max(len(p) for p in pieces)):
        for index, deltas in enumerate(pieces):
            if position < len(deltas):
                choice = {"index": index, "delta": deltas[position]}
                await send({**chunk, "choices": [choice]})
        await asyncio.sleep(interval)
        if position == 0 and hold is not None:
            try:
                await asyncio.wait_for(hold.wait(), HOLD_S)
            except TimeoutError:
                gauge.held_too_long = True
        if position == 0 and gauge.wanted is not None:
            try:
                await asyncio.wait_for(gauge.all_open.wait(), HOLD_S)
            except TimeoutError:
                gauge.held_too_long = True
            await asyncio.sleep(random.uniform(0, interval))  # out of step
    for index, reason in enumerate(finished):
        if reason is not None:  # "none": a stream that never says how it ended
            choice = {"index": index, "delta": {}, "finish_reason": reason}
            await send({**chunk, "choices": [choice]})
    if (body.get("stream_options") or {}).get("include_usage"):
        await send({**chunk, "choices": [], "usage": usage})
    await response.write(b"data: [DONE]\n\n")
    return response


async def completions(request: web.Request) -> web.StreamResponse:
    """The legacy completions API: a prompt in, text out, with the finishes chat has for text."""
    body = await request.json()
    prompt = body.get("prompt")
    text = f"completion of {len(prompt) if isinstance(prompt, str) else 0}"
    usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    finishes = [_finish_reason(f, body) for f in _finishes(body)]
    base = {"id": f"cmpl-{uuid.uuid4().hex}", "created": 1, "model": body["model"],
            "object": "text_completion"}  # fmt: skip
    if not body.get("stream"):
        choices = [{"index": i, "text": text, "finish_reason": reason, "logprobs": None}
                   for i, reason in enumerate(finishes)]  # fmt: skip
        return web.json_response({**base, "usage": usage, "choices": choices})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)

    async def send(data: dict) -> None:
        await response.write(f"data: {json.dumps(data)}\n\n".encode())

    for word in text.split(" "):
        for index in range(len(finishes)):
            choice = {"index": index, "text": word + " ", "finish_reason": None, "logprobs": None}
            await send({**base, "choices": [choice]})
    for index, reason in enumerate(finishes):
        if reason is not None:
            choice = {"index": index, "text": "", "finish_reason": reason, "logprobs": None}
            await send({**base, "choices": [choice]})
    if (body.get("stream_options") or {}).get("include_usage"):
        await send({**base, "choices": [], "usage": usage})
    await response.write(b"data: [DONE]\n\n")
    return response


async def models(_request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})


def standin_app(
    hold_after_first_word: asyncio.Event | None = None,
    *,
    hold_until_open: int | None = None,
    word_interval_s: float = WORD_INTERVAL_S,
    long_replies: bool = False,
    stamp: bool = False,
) -> web.Application:
    """The stand-in (see the module's docstring); ``long_replies``: honour ``max_tokens``."""
    app = web.Application()
    app[GAUGE] = Gauge(wanted=hold_until_open)
    app[SETTINGS] = {"word_interval_s": word_interval_s, "long_replies": long_replies,
                     "stamp": stamp}  # fmt: skip
    if hold_after_first_word is not None:
        app[HOLD] = hold_after_first_word
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    return app


def main() -> None:
    """``python -m kvcast.lab.bench.openai_standin --listen HOST:PORT``: the compose stack's
    engine stand-in (no model, no GPU)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT")
    parser.add_argument("--hold-until-open", type=int, default=None, help="streams (benchmark)")
    parser.add_argument("--word-interval", type=float, default=WORD_INTERVAL_S, help="seconds")
    parser.add_argument("--bench", action="store_true", help="max_tokens words, stamped chunks")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    app = standin_app(hold_until_open=args.hold_until_open, word_interval_s=args.word_interval,
                      long_replies=args.bench, stamp=args.bench)  # fmt: skip
    print(f"openai stand-in listening on {host}:{port}", flush=True)
    web.run_app(app, host=host, port=int(port), print=None, backlog=4096, access_log=None)


if __name__ == "__main__":
    main()
