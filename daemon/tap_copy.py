"""The tap's copy of a response, for the event: bounded, linear, and never in the relay's way.

The tap relays the upstream's bytes untouched and feeds the same bytes to one of these. Whatever
they hold (a malformed server-sent event, JSON nested past the parser's depth, bytes that are
not UTF-8, a compressed body, a line without end), the worst outcome is that the event gives up
(:attr:`ResponseCopy.gave_up` says why); the relay never sees an exception from here.

- :class:`StreamCopy` (``text/event-stream``): splits lines as bytes arrive, scanning each byte
  once (a stream without newlines is linear, not quadratic), holds at most ``max_line_bytes``
  of an unfinished line (a longer line is skipped up to its newline), and keeps only the reply's
  text, the id, the usage, the first choice's ``finish_reason`` and which tool calls it made
  (their indices, not their arguments), at most ``max_bytes`` in all.
- :class:`BodyCopy` (a JSON body): a copy of at most ``max_bytes``; parsed later, off the event
  loop (:meth:`BodyCopy.body`).

Compressed bodies (``Content-Encoding``: gzip, deflate; br when the ``brotli`` package is
installed) are decoded on a copy, output bounded by ``max_bytes``; an encoding it cannot decode
gives up on the counts (the event is still recorded, without them).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

__all__ = ["BodyCopy", "ResponseCopy", "StreamCopy", "copy_for"]

MAX_LINE_BYTES = 1 << 20  # one server-sent event line; an engine's are under a kilobyte


class _Decoder:
    """Incremental decoding of one ``Content-Encoding``, output bounded (bytes)."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._zlib: Any = None
        self._brotli: Any = None
        self._first = True
        if encoding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "br":
            try:
                import brotli  # optional: only for engines that send br
            except ImportError:
                raise LookupError("br (the brotli package is not installed)") from None
            self._brotli = brotli.Decompressor()
        elif encoding != "deflate":
            raise LookupError(encoding)

    def decode(self, data: bytes, limit: int) -> bytes:
        """Up to ``limit`` bytes decoded from ``data``; OverflowError beyond."""
        if self.encoding == "deflate" and self._first:
            # "deflate" is zlib-wrapped per RFC 9110, but some servers send it raw.
            zlib_header = (
                len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            )
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)
        self._first = False
        if self._brotli is not None:
            out = self._brotli.process(data)
        else:
            out = self._zlib.decompress(data, limit + 1)
            if self._zlib.unconsumed_tail:
                raise OverflowError
        if len(out) > limit:
            raise OverflowError
        return out


class ResponseCopy:
    """What the tap keeps of one response for its event. ``gave_up``: why the event gave up
    (None while it holds). ``counts_lost``: the body could not be read (an encoding it cannot
    decode); the event is still recorded, without token counts."""

    def __init__(self, max_bytes: int, encoding: str | None) -> None:
        self.max_bytes = max_bytes
        self.gave_up: str | None = None
        self.counts_lost: str | None = None
        self._decoder: _Decoder | None = None
        self._decoded = 0
        encoding = (encoding or "").strip().lower()
        if encoding not in ("", "identity"):
            try:
                self._decoder = _Decoder(encoding)
            except LookupError as exc:
                self.counts_lost = f"Content-Encoding {exc} not decoded"

    def feed(self, chunk: bytes) -> None:
        """One chunk as relayed; never raises."""
        if self.gave_up is not None or self.counts_lost is not None:
            return
        try:
            if self._decoder is not None:
                chunk = self._decoder.decode(chunk, self.max_bytes - self._decoded)
                self._decoded += len(chunk)
            self._take(chunk)
        except OverflowError:
            self.gave_up = f"response over {self.max_bytes} bytes"
        except zlib.error as exc:
            self.counts_lost = f"Content-Encoding {self._decoder.encoding}: {exc}"  # type: ignore[union-attr]
        except Exception as exc:  # the copy must never break the relay
            self.gave_up = f"response not understood ({type(exc).__name__})"

    def _take(self, data: bytes) -> None:
        raise NotImplementedError

    def body(self) -> dict[str, Any] | None:
        """The response as ``EventBuilder.build`` takes it (``{}`` when the counts were lost)."""
        raise NotImplementedError


class BodyCopy(ResponseCopy):
    """A JSON response body, copied up to ``max_bytes``; parsed by :meth:`body`."""

    def __init__(self, max_bytes: int, encoding: str | None) -> None:
        super().__init__(max_bytes, encoding)
        self._data = bytearray()

    def _take(self, data: bytes) -> None:
        if len(self._data) + len(data) > self.max_bytes:
            self._data = bytearray()
            raise OverflowError
        self._data += data

    def body(self) -> dict[str, Any] | None:
        """The parsed body (CPU: proportional to its size; call it off the event loop)."""
        if self.counts_lost is not None:
            return {}
        try:
            value = json.loads(bytes(self._data))
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            return {}
        return value if isinstance(value, dict) else {}


class StreamCopy(ResponseCopy):
    """Server-sent events (``data: {...}`` lines) assembled into the id, reply and usage."""

    def __init__(self, max_bytes: int, encoding: str | None,
                 max_line_bytes: int = MAX_LINE_BYTES) -> None:  # fmt: skip
        super().__init__(max_bytes, encoding)
        self.max_line_bytes = min(max_line_bytes, max_bytes)
        self._line = bytearray()
        self._skipping = False  # inside a line over max_line_bytes: dropped up to its newline
        self.skipped_lines = 0
        self.id: str | None = None
        self.usage: dict[str, Any] | None = None
        self._parts: list[str] = []
        self._kept = 0  # bytes of reply text kept (UTF-8)
        self.finish_reason: str | None = None  # the first choice's, as its last chunk says
        self._tool_calls: set[int] = set()  # indices of the tool calls streamed (bounded: ints)
        self._function_call = False  # the legacy function_call was streamed

    @property
    def pending_bytes(self) -> int:
        """Bytes held of the unfinished line (at most ``max_line_bytes``)."""
        return len(self._line)

    def _take(self, data: bytes) -> None:
        start, end = 0, len(data)
        while start < end:
            newline = data.find(b"\n", start)  # each byte scanned once
            if newline < 0:
                if not self._skipping:
                    if len(self._line) + end - start > self.max_line_bytes:
                        self._skipping, self._line = True, bytearray()
                        self.skipped_lines += 1
                    else:
                        self._line += data[start:]
                return
            if self._skipping:
                self._skipping = False
            elif self._line:
                self._line += data[start:newline]
                line, self._line = bytes(self._line), bytearray()
                if len(line) <= self.max_line_bytes:
                    self._line_done(line)
                else:
                    self.skipped_lines += 1
            elif newline - start <= self.max_line_bytes:
                self._line_done(data[start:newline])
            else:
                self.skipped_lines += 1
            start = newline + 1

    def _line_done(self, line: bytes) -> None:
        line = line.strip()
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        try:
            data = json.loads(payload)
        except (ValueError, RecursionError):  # malformed or nested too deep: skip the line
            self.skipped_lines += 1
            return
        if not isinstance(data, dict):
            self.skipped_lines += 1
            return
        if self.id is None and isinstance(data.get("id"), str):
            self.id = data["id"]
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        choices = data.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self.finish_reason = reason[:64]
            text = None
            if isinstance(delta, dict):
                text = delta.get("content")
                if "tool_calls" in delta or "function_call" in delta:  # rare: skip the call
                    self._calls(delta)
            if text is None:
                text = choice.get("text")  # completions
            if isinstance(text, str) and text:
                self._kept += len(text.encode("utf-8", "surrogatepass"))
                if self._kept > self.max_bytes:
                    self._parts = []
                    raise OverflowError
                self._parts.append(text)

    def _calls(self, delta: dict[str, Any]) -> None:
        """Note the tool calls a delta streams (at most 1,024 indices: a bound, not a limit
        any engine reaches)."""
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                index = call.get("index", 0) if isinstance(call, dict) else None
                if type(index) is int and len(self._tool_calls) < 1024:
                    self._tool_calls.add(index)
        if isinstance(delta.get("function_call"), dict):
            self._function_call = True

    def body(self) -> dict[str, Any] | None:
        if self.counts_lost is not None:
            return {}
        if self._line and not self._skipping:  # a last line without its newline
            line, self._line = bytes(self._line), bytearray()
            try:
                self._line_done(line)
            except OverflowError:
                return None
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._parts)}
        if self._tool_calls:
            message["tool_calls"] = [{"index": i} for i in sorted(self._tool_calls)]
        if self._function_call:
            message["function_call"] = {}
        choice: dict[str, Any] = {"message": message}
        if self.finish_reason is not None:
            choice["finish_reason"] = self.finish_reason
        return {"id": self.id, "usage": self.usage or {}, "choices": [choice]}


def copy_for(content_type: str | None, encoding: str | None, max_bytes: int) -> ResponseCopy:
    """The copy for a response with these headers: server-sent events or one JSON body."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media == "text/event-stream":
        return StreamCopy(max_bytes, encoding)
    return BodyCopy(max_bytes, encoding)
