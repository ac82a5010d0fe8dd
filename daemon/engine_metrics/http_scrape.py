"""One scrape of an engine's /metrics over HTTP, within one deadline for the whole of it
(connect, headers, body), so a peer that hangs or drips cannot stretch it."""

from __future__ import annotations

import base64
import http.client
import io
import socket
import time
from typing import Any
from urllib.parse import unquote, urlsplit

MAX_BODY_BYTES = 8 << 20  # an engine's /metrics is well under this


class ScrapeError(Exception):
    """One scrape failed; ``reason`` is the label of ``kvcast_engine_scrape_errors_total``."""

    def __init__(self, reason: str, message: str) -> None:
        # A peer's bytes end up in the message: one line, printable, bounded (logs, errors).
        line = " ".join("".join(c if c.isprintable() else " " for c in message).split())
        super().__init__(line if len(line) <= 200 else line[:197] + "...")
        self.reason = reason


class _DeadlineSocket:
    """The connected socket, its reads each allowed only what is left of one deadline
    (monotonic seconds), so a peer that drips one byte at a time cannot stretch a scrape past
    it. http.client reads the reply through :meth:`makefile` and may close the connection
    before the body is read: the socket closes when both are done with it, as a plain
    socket's ``makefile`` does."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline
        self._users = 1  # this wrapper; each reader adds one

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
        self._users += 1
        return io.BufferedReader(_DeadlineReader(self))

    def recv_into(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the scrape's deadline passed")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def release(self) -> None:
        self._users -= 1
        if self._users == 0:
            self._sock.close()

    def close(self) -> None:
        self.release()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket) -> None:
        self._socket = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._socket.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._socket.release()
        super().close()


def _connection(url: str, deadline: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    left = max(deadline - time.monotonic(), 0.001)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    host = parts.hostname or ""
    connection = kind(host, parts.port, timeout=left)
    connection.connect()
    connection.sock = _DeadlineSocket(connection.sock, deadline)  # type: ignore[assignment]
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return connection, target


def scrape(url: str, deadline_s: float) -> str:
    """The endpoint's exposition text, within ``deadline_s`` seconds in all (connect, headers
    and body together); :class:`ScrapeError` with a reason on any failure."""
    deadline = time.monotonic() + deadline_s
    connection = None
    try:
        connection, target = _connection(url, deadline)
        headers = {"Accept": "text/plain", "User-Agent": "kvcast"}
        parts = urlsplit(url)
        if parts.username is not None:
            token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
        connection.request("GET", target, headers=headers)
        response = connection.getresponse()
        if response.status != 200:
            raise ScrapeError("status", f"HTTP {response.status} {response.reason}")
        body = response.read(MAX_BODY_BYTES + 1)
    except ScrapeError:
        raise
    except TimeoutError as exc:  # socket.timeout is TimeoutError since Python 3.10
        raise ScrapeError("timeout", f"no whole reply within {deadline_s:g} s ({exc})") from None
    except http.client.HTTPException as exc:  # not HTTP, > 100 headers, a bad chunk, cut short
        message = f"not a valid HTTP reply ({type(exc).__name__}: {exc})"
        raise ScrapeError("protocol", message) from None
    except ValueError as exc:  # a chunk size that is not hex; a bad port in the URL
        raise ScrapeError("protocol", f"not a valid HTTP reply (ValueError: {exc})") from None
    except OSError as exc:
        raise ScrapeError("connect", f"{type(exc).__name__}: {exc}") from None
    finally:
        if connection is not None:
            connection.close()
    if len(body) > MAX_BODY_BYTES:
        raise ScrapeError("too_large", f"more than {MAX_BODY_BYTES} bytes of metrics")
    return body.decode("utf-8", errors="replace")
