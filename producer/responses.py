"""OpenAI-compatible response bodies as a proxy or a router sees them: one JSON document, or
server-sent events (``"stream": true``) to assemble. Standard library only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["StreamedResponse", "json_object", "response_body"]


class StreamedResponse:
    """A response body assembled from server-sent events: the id, the reply, the usage."""

    def __init__(self) -> None:
        self._pending = b""
        self.id: str | None = None
        self.parts: list[str] = []
        self.usage: Mapping[str, Any] | None = None

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
                    text = delta.get("content") if isinstance(delta, dict) else None
                    text = text if text is not None else choice.get("text")  # completions
                    if isinstance(text, str):
                        self.parts.append(text)

    def body(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "usage": self.usage or {},
            "choices": [{"message": {"role": "assistant", "content": "".join(self.parts)}}],
        }


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
