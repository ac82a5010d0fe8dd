"""What the tap changes in the HTTP messages it relays, and what it answers itself.

Hop-by-hop headers go (RFC 9110 section 7.6.1), every other header is relayed as sent (a
multi-map: two ``Set-Cookie`` stay two); a streaming request gets ``stream_options.include_usage``
spliced into its bytes; the tap's own errors (502, 504) are OpenAI-shaped; the access log has
the path, never the query string.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from multidict import CIMultiDict, CIMultiDictProxy

# Hop-by-hop headers (RFC 9110 section 7.6.1, plus Proxy-Authorization/-Authenticate, which are
# for the proxy itself, section 11.7), and those the next hop's client sets itself (Host,
# Content-Length: the tap may splice stream_options into the body; Expect: the tap has answered
# it and holds the whole body).
HOP_HEADERS = frozenset(
    h.lower()
    for h in ("Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
              "Proxy-Authorization", "TE", "Trailer", "Transfer-Encoding", "Upgrade")
)  # fmt: skip
REQUEST_SET_BY_TAP = frozenset(("host", "content-length", "expect"))
# Headers aiohttp's client would add by itself: the engine gets exactly the client's.
SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
INCLUDE_USAGE = b',"stream_options":{"include_usage":true}'


class TapAccessLogger(AbstractAccessLogger):
    """One line per request: method, path (never the query string), status, bytes, seconds."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info("%s %s %s %d %d %.3f", request.remote, request.method, request.path,
                         response.status, response.body_length, time)  # fmt: skip


def _connection_named(headers: CIMultiDictProxy[str]) -> set[str]:
    """The header names a ``Connection`` header lists (hop-by-hop for this message)."""
    return {
        token.strip().lower()
        for value in headers.getall("Connection", ())
        for token in value.split(",")
        if token.strip()
    }


def relayed_headers(headers: CIMultiDictProxy[str], drop: Iterable[str] = ()) -> CIMultiDict[str]:
    """``headers`` without the hop-by-hop ones, every repeated header kept as sent."""
    skip = HOP_HEADERS | _connection_named(headers) | set(drop)
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in skip)


def with_include_usage(body: bytes) -> bytes | None:
    """``body`` (a JSON object) with ``stream_options.include_usage`` spliced in before its
    closing brace: the client's other bytes unchanged. None if it does not end in ``}``."""
    end = len(body.rstrip())
    if end == 0 or body[end - 1 : end] != b"}":
        return None
    return body[: end - 1] + INCLUDE_USAGE + body[end - 1 :]


def bearer(headers: CIMultiDictProxy[str]) -> str | None:
    scheme, _, token = headers.get("Authorization", "").strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def error_reply(status: int, message: str) -> web.Response:
    """An OpenAI-shaped error the tap itself answers (502, 504)."""
    body = {"error": {"message": message, "type": "upstream_error", "code": status}}
    return web.json_response(body, status=status)
