"""The store URL grammar and the Redis key layout, defined once (standard library only).

The daemon (``--store``), the CLI (``--print-config``, ``kvcast table --redis``) and the
engine-side reader (``kvcast.exporters.kit.client``) all parse a store URL here, so that one URL
means the same server, database and keys everywhere::

    memory://
    redis[s]://[[USER]:PASSWORD@]HOST[:PORT][/DB][?OPTIONS]          one server (port 6379)
    redis[s]+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]     a cluster (db 0 only)
    redis[s]+sentinel://[[USER]:PASSWORD@]HOST:PORT[,...]/SERVICE[/DB] the master of SERVICE

HOST is a name, an IPv4 address or an IPv6 address in brackets (``[::1]:6379``). USER,
PASSWORD, SERVICE and option values are percent-decoded. OPTIONS (``name=value&...``): the TLS
settings (``ssl_*``, with ``rediss``), ``password``/``username``/``db`` on one server,
``sentinel_username``/``sentinel_password`` with Sentinel; anything else is refused.
Credentials are the data nodes'; the sentinels get ``sentinel_*``.

:func:`redact` hides every secret of any URL-like text (a password in the user info, any query
option whose percent-decoded name names a secret) and never raises, so a malformed URL can be
named in an error message without its password.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

MEMORY = "memory"
SINGLE = ("redis", "rediss")
CLUSTER = ("redis+cluster", "rediss+cluster")
SENTINEL = ("redis+sentinel", "rediss+sentinel")
SCHEMES = (MEMORY, *SINGLE, *CLUSTER, *SENTINEL)
DEFAULT_PORT = 6379

TLS_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile",
               "ssl_check_hostname", "ssl_password")  # fmt: skip
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
SINGLE_OPTIONS = ("username", "password", "db")
# Option names (percent-decoded, lower case) that hold a secret contain one of these.
_SECRET_WORDS = ("pass", "secret", "token", "auth")
_HOST = re.compile(r"^[A-Za-z0-9_.\-]+$")


class StoreURLError(ValueError):
    """A store URL that does not follow the grammar; the message never holds its secrets."""


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL. ``hosts``: (host, port) pairs, an IPv6 host without brackets;
    ``options``: the query options, names and values decoded."""

    scheme: str
    hosts: tuple[tuple[str, int], ...] = ()
    username: str | None = None
    password: str | None = None
    db: int = 0
    service: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """``memory``, ``redis``, ``cluster`` or ``sentinel``."""
        if self.scheme in CLUSTER:
            return "cluster"
        if self.scheme in SENTINEL:
            return "sentinel"
        return "redis" if self.scheme in SINGLE else MEMORY

    @property
    def tls(self) -> bool:
        return self.scheme.startswith("rediss")

    def format(self, password: str | None = None) -> str:
        """The URL back as text (``password``: shown instead of the real one, e.g. ``***``)."""
        if self.kind == MEMORY:
            return "memory://"
        shown = self.password if password is None or self.password is None else password
        userinfo = ""
        if self.username is not None or shown is not None:
            userinfo = quote(self.username or "", safe="")
            if shown is not None:
                userinfo += ":" + (shown if password is not None else quote(shown, safe=""))
            userinfo += "@"
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        path = ""
        if self.kind == "sentinel":
            path = f"/{quote(self.service or '', safe='')}/{self.db}"
        elif self.kind == "redis":
            path = f"/{self.db}"
        query = "&".join(
            f"{quote(k, safe='')}="
            + ("***" if password is not None and is_secret_name(k) else quote(v, safe=""))
            for k, v in self.options.items()
        )
        return f"{self.scheme}://{userinfo}{hosts}{path}" + (f"?{query}" if query else "")

    def redacted(self) -> str:
        return self.format(password="***")

    def tls_kwargs(self) -> dict[str, object]:
        """The TLS options as redis-py's keyword arguments (``ssl`` included)."""
        out: dict[str, object] = {"ssl": True} if self.tls else {}
        for name in TLS_OPTIONS:
            if name in self.options:
                value = self.options[name]
                out[name] = value.lower() in ("1", "true", "yes") if name.endswith(
                    "hostname"
                ) else value  # fmt: skip
        return out

    def credentials(self) -> dict[str, str]:
        """The data nodes' ``username``/``password`` as redis-py's keyword arguments."""
        out = {}
        if self.username:
            out["username"] = self.username
        if self.password is not None:
            out["password"] = self.password
        return out

    def sentinel_kwargs(self) -> dict[str, str]:
        """The sentinels' own credentials (``sentinel_username`` -> ``username``, ...)."""
        return {n.removeprefix("sentinel_"): self.options[n] for n in SENTINEL_OPTIONS
                if n in self.options}  # fmt: skip


def is_secret_name(name: str) -> bool:
    """Whether a query option called ``name`` (any case, percent-encoded or not) is a secret."""
    decoded = name
    for _ in range(4):  # %2570 -> %70 -> p: decode until it stops changing
        step = unquote(decoded.replace("+", " "))
        if step == decoded:
            break
        decoded = step
    folded = decoded.strip().casefold()
    return any(word in folded for word in _SECRET_WORDS)


def redact(text: str) -> str:
    """``text`` (a URL, well formed or not) with every secret replaced by ``***``: the user
    info's password (up to the last ``@``, whatever characters it holds) and the value of any
    query option whose decoded name names a secret. Never raises."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    at = rest.rfind("@")
    if at >= 0 and ":" in rest[:at]:
        user = rest[: rest.index(":")]
        rest = f"{user}:***@{rest[at + 1 :]}"
    head, qmark, query = rest.partition("?")
    if not qmark:
        return f"{scheme}://{rest}"
    fragment = ""
    query, hash_, frag = query.partition("#")
    if hash_:
        fragment = "#" + frag
    items = []
    for item in re.split(r"([&;])", query):
        name, eq, _value = item.partition("=")
        items.append(f"{name}=***" if eq and is_secret_name(name) else item)
    return f"{scheme}://{head}?{''.join(items)}{fragment}"


def _fail(url: str, what: str) -> StoreURLError:
    return StoreURLError(f"store URL {redact(url)!r}: {what}")


def _host_port(url: str, item: str, default_port: int | None) -> tuple[str, int]:
    if item.startswith("["):
        close = item.find("]")
        if close < 0:
            raise _fail(url, f"{item!r}: an IPv6 address without its closing ']'")
        host, rest = item[1:close], item[close + 1 :]
        if not host or not re.fullmatch(r"[0-9A-Fa-f:.]+", host) or ":" not in host:
            raise _fail(url, f"{item!r}: [{host}] is not an IPv6 address")
        if rest and not rest.startswith(":"):
            raise _fail(url, f"{item!r}: expected :PORT after ']'")
        port = rest[1:] if rest else None
    else:
        host, colon, port_text = item.rpartition(":")
        host, port = (host, port_text) if colon else (item, None)
        if ":" in host:
            raise _fail(url, f"{item!r}: write an IPv6 address in brackets, [ADDR]:PORT")
        if not host or not _HOST.match(host):
            raise _fail(url, f"{item!r} is not HOST:PORT")
    if port is None:
        if default_port is None:
            raise _fail(url, f"{item!r} is not HOST:PORT (the port is required here)")
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _fail(url, f"{item!r} is not HOST:PORT (port {port!r} is not 1-65535)")
    return host, int(port)


def _db(url: str, text: str) -> int:
    if not text.isdigit() or int(text) > 1_000_000:
        raise _fail(url, f"database {text!r} is not a number")
    return int(text)


def parse(url: str) -> StoreURL:
    """The :class:`StoreURL` of ``url``; :class:`StoreURLError` (a ValueError) saying what is
    wrong, the password never quoted."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES:
        raise _fail(url, f"unknown scheme {scheme!r}: expected memory://, redis:// or rediss://"
                    " (or redis+cluster://, redis+sentinel://; rediss+... for TLS)")  # fmt: skip
    if scheme == MEMORY:
        if rest:
            raise _fail(url, "memory:// takes nothing after it")
        return StoreURL(MEMORY)
    if "#" in rest:
        raise _fail(url, "a '#' (percent-encode it as %23 in a password)")
    netloc_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:netloc_end], rest[netloc_end:]
    if "@" in tail:
        raise _fail(url, "an '@' after the host (percent-encode '/', '?' and '@' as %2F %3F %40)")
    path, _, query = tail.partition("?")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    kind = "cluster" if scheme in CLUSTER else "sentinel" if scheme in SENTINEL else "redis"
    items = hostlist.split(",")
    if kind == "redis" and len(items) > 1:
        raise _fail(url, "one host only (redis+cluster:// or redis+sentinel:// for several)")
    hosts = tuple(_host_port(url, item.strip(), DEFAULT_PORT if kind == "redis" else None)
                  for item in items)  # fmt: skip
    segments = [unquote(s) for s in path.split("/") if s]
    db, service = 0, None
    if kind == "redis":
        if len(segments) > 1:
            raise _fail(url, "expected /DB after the host")
        db = _db(url, segments[0]) if segments else 0
    elif kind == "cluster":
        if segments not in ([], ["0"]):
            raise _fail(url, "a cluster has database 0 only, no path")
    else:
        if not segments or len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
            raise _fail(url, "expected /SERVICE_NAME or /SERVICE_NAME/DB after the sentinels")
        service = segments[0]
        db = _db(url, segments[1]) if len(segments) == 2 else 0
    allowed = TLS_OPTIONS + (SINGLE_OPTIONS if kind == "redis" else ()) + (
        SENTINEL_OPTIONS if kind == "sentinel" else ())  # fmt: skip
    options: dict[str, str] = {}
    for item in query.split("&") if query else ():
        raw_name, eq, raw_value = item.partition("=")
        name, value = unquote(raw_name.replace("+", " ")), unquote(raw_value.replace("+", " "))
        if name not in allowed:
            raise _fail(url, f"unknown option {name!r} (known: {', '.join(allowed)})")
        if not eq:
            raise _fail(url, f"option {name!r} has no value (name=value)")
        if name in options:
            raise _fail(url, f"option {name!r} given twice")
        if name.startswith("ssl_") and not scheme.startswith("rediss"):
            raise _fail(url, f"{name} needs TLS (rediss://, rediss+...://)")
        options[name] = value
    if "password" in options:
        if password is not None:
            raise _fail(url, "a password in the user info and in ?password=; give one")
        password = options.pop("password")
    if "username" in options:
        if username is not None:
            raise _fail(url, "a user in the user info and in ?username=; give one")
        username = options.pop("username") or None
    if "db" in options:
        if segments:
            raise _fail(url, "a database in the path and in ?db=; give one")
        db = _db(url, options.pop("db"))
    return StoreURL(scheme, hosts, username, password, db, service, options)


# --- the Redis key layout -------------------------------------------------------------------


def key_prefix(namespace: str) -> str:
    """``NAMESPACE:{NAMESPACE}:``: the start of every key of a namespace (one server, the
    master behind Sentinel, and the cluster layout's namespace-level keys)."""
    return f"{namespace}:{{{namespace}}}:"


def namespace_key(namespace: str, *parts: object) -> str:
    """A namespace-level key: ``parts`` joined by ``:`` after :func:`key_prefix`."""
    return key_prefix(namespace) + ":".join(str(p) for p in parts)


def cluster_partition_key(namespace: str, partition: str, name: str, *rest: object) -> str:
    """``NAMESPACE:{NAMESPACE:P}:name:rest``: a partition's key in its own cluster slot."""
    tail = ":".join(str(p) for p in (name, *rest))
    return f"{namespace}:{{{namespace}:{partition}}}:{tail}"


def table_key(namespace: str) -> str:
    """The one key the priority table is published under, in every layout."""
    return namespace_key(namespace, "table")
