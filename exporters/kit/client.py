"""The engine-side client: the priority table from Redis or HTTP, refreshed in the background.

Imports only the standard library (redis-py lazily, for ``redis://`` sources), so inference
engines can use it without torch, Kafka, numpy or the daemon.

>>> client = TableClient("http://127.0.0.1:9400/v1/table", refresh_s=10)  # doctest: +SKIP
>>> client.start()  # one load now (bounded by timeout_s), then every refresh_s  # doctest: +SKIP
>>> client.priority("coding", 2, age_s=30.0, size_tokens=1024)  # doctest: +SKIP
(1, 0.71, 1024)
>>> client.priority("coding", 2, 30.0, 1024, policy="density")  # doctest: +SKIP
(1.9e-06, -30.0)

Policies (SPEC section 12): ``iac``, the tuple of SPEC Eq. 1, and ``density``, the hit density
of the state at the node's age over the table's horizon (``kvcast.exporters.kit.index``). The
client's ``policy`` (constructor; ``iac`` by default) is the one :meth:`TableClient.priority`
and :meth:`TableClient.rank` use and the one the engine adapters rank by; a call may name
another. A block that two or more conversations share (a system prompt, a tool set) is ranked
under ``density`` as the intent ``SHARED_INTENT`` (any turn): the table's ``shared`` law, the
reuse of shared blocks the daemon measured, where the table has one, else the defaults
(``client.priority(SHARED_INTENT, 1, age_s, size_tokens, policy="density")``).

Failure rule: a source that is down, slow or answers a malformed table never breaks the
caller; the client keeps the last good table, or the defaults if it never loaded one, and
tries again every ``refresh_s``. Each refresh builds a new :class:`PriorityIndex` and then
swaps one reference, so a reader sees either the old or the new table, never a mix.
Threads do not survive ``fork``: create (or ``start``) the client in the process that evicts.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from kvcast.exporters.kit.checks import TableError
from kvcast.exporters.kit.index import POLICIES, SHARED_INTENT, DensityKey, Priority, PriorityIndex
from kvcast.stats.store_url import CLUSTER, SENTINEL, StoreURLError, table_key
from kvcast.stats.store_url import parse as parse_store_url

__all__ = [
    "SHARED_INTENT",
    "FileTableSource",
    "HttpTableSource",
    "RedisTableSource",
    "TableClient",
    "TableSource",
    "TableSourceError",
    "open_source",
]

log = logging.getLogger(__name__)

_JITTER = 0.1  # refresh intervals vary by +-10% so that many engines do not poll in step


class TableSourceError(RuntimeError):
    """The source could not be read (down, timed out, refused, malformed answer)."""


class TableSource(Protocol):
    """Where a table comes from. ``fetch`` is called from one thread at a time."""

    def fetch(self) -> Mapping[str, Any] | None:
        """The current document; None when it is unchanged since the last fetch or when
        nothing has been published yet. Raises :class:`TableSourceError` when unreachable."""

    def close(self) -> None: ...


def _decode(raw: bytes, where: str) -> Mapping[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TableSourceError(f"{where}: not JSON ({exc})") from None
    except RecursionError:  # nested deeper than the parser's stack allows
        raise TableSourceError(f"{where}: not JSON (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise TableSourceError(f"{where}: not a JSON object")
    return doc


CLUSTER_SCHEMES = CLUSTER
SENTINEL_SCHEMES = SENTINEL


def _scheme(url: str) -> str:
    """The scheme of ``url`` without parsing the rest (urlsplit raises on a bad IPv6 host)."""
    scheme, sep, _ = url.partition("://")
    return scheme.lower() if sep else ""


def _redis_client(url: str, timeout_s: float) -> Any:
    """A redis-py client for a store URL of ``kvcast run`` (``redis[s]://``,
    ``redis[s]+cluster://``, ``redis[s]+sentinel://``), read by the daemon's own grammar
    (:mod:`kvcast.stats.store_url`): the same server, DB, credentials and TLS options, so an
    engine given the daemon's URL reads the key the daemon writes. ``unix://`` goes to
    redis-py as it is. ValueError saying what is wrong with any other."""
    import redis  # lazily: HTTP-only engines need not install redis-py

    timeouts = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if _scheme(url) == "unix":
        return redis.Redis.from_url(url, **timeouts)
    try:
        parsed = parse_store_url(url)
    except StoreURLError as exc:
        raise ValueError(f"table source: {exc}") from None
    connection: dict[str, Any] = {**timeouts, **parsed.credentials(), **parsed.tls_kwargs()}
    if parsed.kind == "redis":
        ((host, port),) = parsed.hosts
        # A pool made as redis-py's from_url makes it (no retry of its own: a failed fetch
        # is reported at once and retried every refresh_s).
        if connection.pop("ssl", False):
            connection["connection_class"] = redis.SSLConnection
        pool = redis.ConnectionPool(host=host, port=port, db=parsed.db, **connection)
        return redis.Redis(connection_pool=pool)
    if parsed.kind == "cluster":
        startup = [redis.cluster.ClusterNode(host, port) for host, port in parsed.hosts]
        return redis.RedisCluster(startup_nodes=startup, **connection)
    if parsed.kind == "sentinel":
        sentinel_kwargs = {**timeouts, **parsed.tls_kwargs(), **parsed.sentinel_kwargs()}
        sentinel = redis.Sentinel(list(parsed.hosts), sentinel_kwargs=sentinel_kwargs)
        return sentinel.master_for(parsed.service or "", db=parsed.db, **connection)
    raise ValueError(f"table source {parsed.redacted()!r}: not a Redis URL")


class RedisTableSource:
    """Reads the one-key table (a single GET, so never half a table) from ``redis[s]://``, a
    Redis Cluster (``redis+cluster://``) or the master behind Sentinel (``redis+sentinel://``):
    the key is the namespace's own in every layout."""

    def __init__(self, url: str, namespace: str = "kvcast", timeout_s: float = 2.0) -> None:
        import redis  # lazily: HTTP-only engines need not install redis-py

        # A cluster client asks for the slot map when made: made at the first fetch, so that
        # a cluster that does not answer yet is a fetch's TableSourceError, like a server's.
        self._errors = (redis.RedisError, redis.exceptions.RedisClusterException, OSError)
        self._url, self._timeout_s = url, timeout_s
        self._client: Any = None
        scheme = _scheme(url)
        if scheme != "unix":  # a malformed URL is a ValueError now, not at the first fetch
            try:
                parse_store_url(url)
            except StoreURLError as exc:
                raise ValueError(f"table source: {exc}") from None
        if scheme not in CLUSTER_SCHEMES:
            self._client = _redis_client(url, timeout_s)
        self.key = table_key(namespace)
        self._last: bytes | None = None

    def fetch(self) -> Mapping[str, Any] | None:
        try:
            if self._client is None:
                self._client = _redis_client(self._url, self._timeout_s)
            raw = self._client.get(self.key)
        except self._errors as exc:
            raise TableSourceError(f"redis: {type(exc).__name__}: {exc}") from None
        if raw is None or raw == self._last:
            return None
        doc = _decode(raw, f"redis key {self.key}")
        self._last = raw
        return doc

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


class HttpTableSource:
    """``GET /v1/table`` with ``If-None-Match``: a 304 costs no parsing. Stdlib urllib."""

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        parts = urlsplit(url)
        if parts.path in ("", "/"):
            parts = parts._replace(path="/v1/table")
        self.url = urlunsplit(parts)
        self._timeout_s = timeout_s
        self._etag: str | None = None

    def fetch(self) -> Mapping[str, Any] | None:
        headers = {"Accept": "application/json"}
        if self._etag is not None:
            headers["If-None-Match"] = self._etag
        request = urllib.request.Request(self.url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                body, etag = response.read(), response.headers.get("ETag")
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 304:
                return None
            if exc.code == 503:  # the daemon is warming up: nothing published yet
                return None
            raise TableSourceError(f"{self.url}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise TableSourceError(f"{self.url}: {exc}") from None
        except http.client.HTTPException as exc:  # a peer not speaking HTTP, a reply cut off
            raise TableSourceError(f"{self.url}: {type(exc).__name__}: {exc}") from None
        doc = _decode(body, self.url)
        self._etag = etag
        return doc

    def close(self) -> None:
        pass


class FileTableSource:
    """A JSON file: a table document, or a ``kvcast replay --json`` result (its ``table``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._mtime: int | None = None

    def fetch(self) -> Mapping[str, Any] | None:
        try:
            mtime = self.path.stat().st_mtime_ns
            if mtime == self._mtime:
                return None
            raw = self.path.read_bytes()
        except OSError as exc:
            raise TableSourceError(f"{self.path}: {exc}") from None
        doc = _decode(raw, str(self.path))
        self._mtime = mtime
        table = doc.get("table")
        return table if isinstance(table, dict) and "states" not in doc else doc

    def close(self) -> None:
        pass


def open_source(url: str, namespace: str = "kvcast", timeout_s: float = 2.0) -> TableSource:
    """A source from a URL: ``redis://``/``rediss://`` (+ namespace), ``http(s)://``, or a
    ``file://`` URL / plain path."""
    scheme = _scheme(url)
    if scheme in ("redis", "rediss", "unix", *CLUSTER_SCHEMES, *SENTINEL_SCHEMES):
        return RedisTableSource(url, namespace, timeout_s)
    if scheme in ("http", "https"):
        return HttpTableSource(url, timeout_s)
    if scheme == "file":
        return FileTableSource(urlsplit(url).path)
    if scheme == "":
        return FileTableSource(url)
    raise ValueError(
        f"unsupported table source {url!r} (redis://, redis+cluster://, redis+sentinel://,"
        " http://, file://)"
    )


class TableClient:
    """Holds the current :class:`PriorityIndex` and refreshes it every ``refresh_s`` seconds.

    ``source``: a URL for :func:`open_source` or a :class:`TableSource`. ``max_turn``: the
    daemon's ``--max-turn`` when the table does not carry it (see :mod:`.priority`).
    ``policy``: ``iac`` or ``density``, what :meth:`priority`, :meth:`rank` and the adapters
    built on this client rank by.
    """

    def __init__(
        self,
        source: str | TableSource,
        *,
        namespace: str = "kvcast",
        refresh_s: float = 10.0,
        timeout_s: float = 2.0,
        max_turn: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        policy: str = "iac",
    ) -> None:
        if not refresh_s > 0:
            raise ValueError(f"refresh_s must be > 0, got {refresh_s}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        self.source = (
            open_source(source, namespace, timeout_s) if isinstance(source, str) else source
        )
        self.refresh_s = refresh_s
        self._max_turn = max_turn
        self._clock = clock
        self.index = PriorityIndex(None, max_turn)  # the defaults until a table loads
        self.last_error: str | None = None
        self.last_success: float | None = None  # clock() of the last answered fetch
        self.loads = 0  # tables swapped in
        self._rejected = False  # the source's current table failed validation
        self._fetch_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading (any thread) ----------------------------------------------------------------

    def priority(
        self,
        intent: str,
        turn: int,
        age_s: float,
        size_tokens: float,
        policy: str | None = None,
    ) -> Priority | DensityKey:
        """Priority on the current table under ``policy`` (default: the client's); lowest
        evicted first (:meth:`PriorityIndex.priority`).

        In a hot loop, read ``client.index`` once and call its ``priority`` directly.
        """
        return self.index.priority(intent, turn, age_s, size_tokens, policy or self.policy)

    def rank(
        self, candidates: Iterable[tuple[str, int, float, float]], policy: str | None = None
    ) -> list[int]:
        """Positions of ``(intent, turn, age_s, size_tokens)`` candidates, eviction order
        first, under ``policy`` (default: the client's; :meth:`PriorityIndex.rank`)."""
        return self.index.rank(candidates, policy or self.policy)

    @property
    def version(self) -> int | None:
        """Version of the table in use; None while on the defaults."""
        return self.index.version

    @property
    def loaded(self) -> bool:
        return self.index.version is not None

    def status(self) -> dict[str, Any]:
        """For health pages and logs: version, states, age of the last good fetch, last error."""
        since = None if self.last_success is None else self._clock() - self.last_success
        return {
            "version": self.version,
            "states": len(self.index),
            "seconds_since_success": since,
            "last_error": self.last_error,
            "loads": self.loads,
        }

    # -- refreshing --------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Fetch once now; True when a new table was swapped in. Never raises for a source
        that is down or a malformed table (see ``last_error``)."""
        with self._fetch_lock:
            try:
                doc = self.source.fetch()
                index = None if doc is None else PriorityIndex(doc, self._max_turn)
            except (TableSourceError, TableError) as exc:
                if self.last_error is None:
                    log.warning("priority table: %s (keeping version %s)", exc, self.version)
                self.last_error = str(exc)
                self._rejected = isinstance(exc, TableError)
                return False
            self.last_success = self._clock()
            if index is None:  # unchanged: a rejected table stays reported until replaced
                if not self._rejected:
                    self.last_error = None
                return False
            if self.last_error is not None:
                log.info("priority table: a good table again")
            self.last_error, self._rejected = None, False
            if index.document == self.index.document:
                return False
            self.index = index  # one reference swap: readers see the old or the new table
            self.loads += 1
            return True

    def start(self, initial_load: bool = True) -> TableClient:
        """Start the daemon refresher thread (once); ``initial_load``: fetch before returning."""
        if self._thread is not None:
            return self
        if initial_load:
            self.refresh()
        self._thread = threading.Thread(target=self._loop, name="kvcast-table", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_s * random.uniform(1 - _JITTER, 1 + _JITTER)):
            try:
                self.refresh()
            except Exception:  # a bug must not kill the refresher: keep the last table
                log.exception("priority table refresh failed")

    def close(self) -> None:
        """Stop the refresher (within one fetch timeout) and close the source; idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.source.close()

    def __enter__(self) -> TableClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
