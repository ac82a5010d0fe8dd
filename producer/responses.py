"""OpenAI-compatible response bodies as a proxy or a router sees them: one JSON document, or
server-sent events (``"stream": true``) to assemble. Standard library only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["StreamedResponse", "json_object", "response_body"]


class StreamedResponse:
    """A response body assembled from server-sent events: the id, the reply, the usage, the
    first choice's ``finish_reason`` (its last chunk's) and the indices of its tool calls."""

    def __init__(self) -> None:
        self._pending = b""
        self.id: str | None = None
        self.parts: list[str] = []
        self.usage: Mapping[str, Any] | None = None
        self.finish_reason: str | None = None
        self.tool_calls: set[int] = set()
        self.function_call = False

    def feed(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            try:
                data = json.loads(line[5:])
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            self.id = self.id or data.get("id")
            if isinstance(data.get("usage"), dict):
                self.usage = data["usage"]
            for choice in data.get("choices") or []:
                if isinstance(choice, dict) and choice.get("index", 0) == 0:
                    delta = choice.get("delta") or {}
                    reason = choice.get("finish_reason")
                    if isinstance(reason, str) and reason:
                        self.finish_reason = reason
                    if isinstance(delta, dict):
                        self._calls(delta)
                    text = delta.get("content") if isinstance(delta, dict) else None
                    text = text if text is not None else choice.get("text")  # completions
                    if isinstance(text, str):
                        self.parts.append(text)

    def _calls(self, delta: Mapping[str, Any]) -> None:
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                index = call.get("index", 0) if isinstance(call, dict) else None
                if type(index) is int:
                    self.tool_calls.add(index)
        if isinstance(delta.get("function_call"), dict):
            self.function_call = True

    def body(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.parts)}
        if self.tool_calls:
            message["tool_calls"] = [{"index": i} for i in sorted(self.tool_calls)]
        if self.function_call:
            message["function_call"] = {}
        choice: dict[str, Any] = {"message": message}
        if self.finish_reason is not None:
            choice["finish_reason"] = self.finish_reason
        return {"id": self.id, "usage": self.usage or {}, "choices": [choice]}


def json_object(body: bytes) -> dict[str, Any] | None:
    """``body`` as a JSON object, or None."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def response_body(content: bytes, streamed: bool) -> dict[str, Any] | None:
    """The response as :meth:`kvcast.producer.EventBuilder.build` takes it: the JSON body, or
    the events of a stream assembled (its id, reply and ``usage`` chunk)."""
    if not streamed:
        return json_object(content)
    assembled = StreamedResponse()
    assembled.feed(content + b"\n")
    return assembled.body()
