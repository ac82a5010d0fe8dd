"""The pages of the daemon's HTTP server, as pure functions of a request: no sockets here.

Every body is JSON except ``/metrics``, and no page echoes the request's path, body or headers.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from http import HTTPStatus
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from kvcast.exporters import status_page

JSON = "application/json"
_ORJSON_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
Headers = tuple[tuple[str, str], ...]


class PublishedState(Protocol):
    """What the daemon exposes over HTTP. Called from request threads: must be thread-safe."""

    def forecast_document(self) -> dict[str, Any] | None:
        """The latest forecast, with its capacity ``curve``; None before the first one."""

    def table_document(self) -> dict[str, Any] | None:
        """The latest priority table (SPEC section 5), an int ``version``; None before the first."""

    def readiness(self) -> tuple[bool, dict[str, str]]:
        """(ready, {component: "ok" or the reason it is not})."""

    def liveness(self) -> tuple[bool, str]:
        """(True, detail) while the main loop is alive, (False, reason) when it is stuck."""

    def operations_document(self) -> dict[str, Any]:
        """Throughput, lag, rejections by reason, components, forecast age and history."""

    def plan_capacity(self, target: float, tier: str) -> dict[str, Any] | None:
        """``required_capacity`` of ``tier`` for the total hit ratio ``target``; None before
        the first forecast; ValueError for a tier that is not configured."""


class Request(NamedTuple):
    state: PublishedState
    registry: CollectorRegistry
    headers: Any  # anything with .get(name) -> str | None (http.client.HTTPMessage)
    pretty: bool = False
    query: Mapping[str, list[str]] = MappingProxyType({})  # parse_qs of the query string


class Response(NamedTuple):
    status: int
    body: bytes = b""
    content_type: str = JSON
    headers: Headers = ()


def json_response(status: int, doc: Any, pretty: bool = False, headers: Headers = ()) -> Response:
    opts = _ORJSON_OPTS | (orjson.OPT_INDENT_2 if pretty else 0)
    return Response(status, orjson.dumps(doc, option=opts), JSON, headers)


def healthz(req: Request) -> Response:
    alive, reason = req.state.liveness()
    if alive:
        return json_response(HTTPStatus.OK, {"status": "ok"}, req.pretty)
    doc = {"status": "stuck", "reason": reason}
    return json_response(HTTPStatus.SERVICE_UNAVAILABLE, doc, req.pretty)


def readyz(req: Request) -> Response:
    ready, components = req.state.readiness()
    status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
    doc = {"status": "ready" if ready else "not_ready", "components": components}
    return json_response(status, doc, req.pretty)


def forecast(req: Request) -> Response:
    """The forecast; ``?target=X[&tier=T]``: with ``required_capacity`` planned for tier T
    (default gpu) to reach the total hit ratio X. A bad parameter: 400 naming it (the value
    is not echoed)."""
    plan_for = _plan_query(req.query)
    if isinstance(plan_for, Response):
        return plan_for
    doc = req.state.forecast_document()
    if doc is None:
        return json_response(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "warming_up"}, req.pretty)
    if plan_for is None:
        return json_response(HTTPStatus.OK, doc, req.pretty)
    target, tier = plan_for
    names = [t.get("name") for t in doc.get("tiers") or []] or ["gpu"]
    planner = getattr(req.state, "plan_capacity", None)
    if tier not in names:
        return _bad_parameter("tier", f"tier must be one of the stack's: {', '.join(names)}")
    plan = planner(target, tier) if planner is not None else None
    if plan is None:
        return json_response(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "warming_up"}, req.pretty)
    return json_response(HTTPStatus.OK, {**doc, "required_capacity": plan}, req.pretty)


def _bad_parameter(name: str, message: str) -> Response:
    return json_response(HTTPStatus.BAD_REQUEST, {"error": message, "parameter": name})


def _plan_query(query: Mapping[str, list[str]]) -> tuple[float, str] | Response | None:
    """``(target, tier)`` from ``?target=X&tier=T``, None without them, or the 400 reply."""
    if "target" not in query and "tier" not in query:
        return None
    for name in ("target", "tier"):
        if len(query.get(name, ())) > 1:
            return _bad_parameter(name, f"{name} must be given once")
    if "target" not in query:
        return _bad_parameter("target", "tier needs target, the total hit ratio to plan for")
    try:
        target = float(query["target"][0])
    except ValueError:
        target = math.nan
    if not 0 < target < 1:
        return _bad_parameter("target", "target must be a hit ratio strictly between 0 and 1")
    tier = query.get("tier", ["gpu"])[0]
    return target, tier


def table(req: Request) -> Response:
    """The table with ``ETag: "<version>"``; 304 (no body) when ``If-None-Match`` names it."""
    doc = req.state.table_document()
    if doc is None:
        return json_response(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "warming_up"}, req.pretty)
    headers: Headers = (("Cache-Control", "no-cache"),)
    version = doc.get("version")
    if isinstance(version, int) and not isinstance(version, bool):
        etag = f'"{version}"'
        headers += (("ETag", etag),)
        if etag_matches(req.headers.get("If-None-Match"), etag):
            return Response(HTTPStatus.NOT_MODIFIED, headers=headers)
    return json_response(HTTPStatus.OK, doc, req.pretty, headers)


def operations(req: Request) -> Response:
    return json_response(HTTPStatus.OK, req.state.operations_document(), req.pretty)


def metrics(req: Request) -> Response:
    """The given registry in the format the scraper accepts (prometheus_client's negotiation).

    A plain scrape gets ``generate_latest`` as ``text/plain; version=0.0.4``; an ``Accept`` of
    OpenMetrics or of text ``version=1.0.0`` gets that format.
    """
    encoder, content_type = choose_encoder(req.headers.get("Accept") or "")
    return Response(HTTPStatus.OK, encoder(req.registry), content_type)


def status(req: Request) -> Response:
    """The HTML status page; it fetches ``/v1/forecast`` and ``/v1/table`` itself."""
    page = status_page.html()
    return Response(HTTPStatus.OK, page, status_page.CONTENT_TYPE, status_page.HEADERS)


ROUTES: dict[str, Callable[[Request], Response]] = {
    "/": status,
    "/healthz": healthz,
    "/readyz": readyz,
    "/metrics": metrics,
    "/v1/forecast": forecast,
    "/v1/table": table,
    "/v1/status": operations,
}


def not_found(path: str) -> Response:
    """404 listing the known paths, the closest ones first (the request path is not echoed)."""
    api = sorted(p for p in ROUTES if p != "/")  # the page at / is for people, not clients
    close = difflib.get_close_matches(path, api, n=3, cutoff=0.5)
    doc = {"error": "not found", "did_you_mean": close, "paths": api}
    return json_response(HTTPStatus.NOT_FOUND, doc)


def etag_matches(header: str | None, etag: str) -> bool:
    """RFC 9110 weak comparison: ``*`` or any listed tag matches, a ``W/`` prefix is ignored."""
    if not header:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in header.split(",")]
    return "*" in tags or etag in tags
