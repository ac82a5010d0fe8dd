"""The status page at ``/``: one self-contained HTML file (inline CSS and JavaScript).

The page fetches ``v1/forecast``, ``v1/table`` and ``v1/status`` (relative URLs, so it also
works behind a path-prefixing proxy) every 5 s and draws the forecast beside the observed hit
ratio, the capacity curve h(N) with the configured capacity marked (and, for a forecast of
more than one tier, each tier's band: the hit ratio it adds over the capacities it adds), the
priority table as a heatmap over (intent, turn), the last hour of forecast and observed hit
ratio, and the operator's figures: events/s, consumer lag, rejections by reason, each
component's state and the forecast's age. Nothing is fetched from elsewhere; the
Content-Security-Policy below forbids it, and the script writes data into the page only as
text, never as markup.
"""

from __future__ import annotations

import functools
from importlib import resources

__all__ = ["CONTENT_TYPE", "HEADERS", "html"]

CONTENT_TYPE = "text/html; charset=utf-8"
HEADERS: tuple[tuple[str, str], ...] = (
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Cache-Control", "no-cache"),
)


@functools.cache
def html() -> bytes:
    """The page (package data ``status_page.html``), read once."""
    return resources.files(__package__).joinpath("status_page.html").read_bytes()
