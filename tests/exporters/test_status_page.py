"""The status page at ``/``: served self-contained, and drawn by a real headless Chromium."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kvcast.exporters.http_server import HttpServer
from tests import services

CAPACITY = 2275
# The page's colour scale at P(continue) = 0, 0.5 and 1 (its STOPS[0], STOPS[2], STOPS[4]).
COLORS = {0.0: (255, 247, 188), 0.5: (65, 182, 196), 1.0: (37, 52, 148)}
CURVE_BLUE, MARKER = (47, 111, 223), (176, 40, 154)


def forecast() -> dict[str, Any]:
    curve = []
    for i in range(17):
        n = CAPACITY * 2 ** ((i - 8) / 2)
        curve.append({"capacity_blocks": n, "hit_ratio": 0.55 * (1 - math.exp(-n / 3000)),
                      "characteristic_time_s": 10.0 * 2 ** (i / 2)})  # fmt: skip
    return {"status": "ok", "hit_ratio": 0.55 * (1 - math.exp(-CAPACITY / 3000)),
            "hit_ratio_single_class": 0.3, "upper_bound": 0.55, "observed_hit_ratio": 0.27,
            "capacity_blocks": CAPACITY, "block_size": 16, "instances": 1,
            "characteristic_time_s": 120.5, "lambda_per_s": 0.5, "A_R": 38.9, "A_H_hash": 22.5,
            "E_B": 12.9, "window_conversations": 10_000, "curve": curve,
            "required_capacity_by_target": [{"target": 0.4, "blocks": 5000, "status": "ok"}],
            }  # fmt: skip


def table() -> dict[str, Any]:
    ps = [0.0, 0.5, 1.0]
    states = [
        {"intent": f"intent-{i:02d}", "turn": t, "p_continue": ps[(i + t) % 3],
         "median_reuse_s": 30.0 * t, "mu": None, "sigma": None, "conversations": 50,
         "delay_samples": 20}
        for i in range(8) for t in range(1, 13)
    ]  # fmt: skip
    return {"version": 9, "generated_at": 0.0, "window_conversations": 10_000,
            "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0}, "states": states}  # fmt: skip


def operations() -> dict[str, Any]:
    history = [{"at": 1_700_000_000.0 + 30 * k, "forecast": 0.30 + 0.01 * k,
                "observed": None if k < 3 else 0.25} for k in range(10)]  # fmt: skip
    return {"ready": False, "events_per_s": 1234.5, "lag": 42, "processed": 10_000,
            "rejected": 9, "rejected_by_reason": {"missing_field": 7, "too_late": 2},
            "duplicates": 3, "forecast_age_s": 4.2, "table_version": 9, "history": history,
            "components": {"store": "ok", "source": "ok", "forecast": "ok",
                           "dead_letter": "unavailable: dead: no answer"}}  # fmt: skip


class State:
    def __init__(self, shadow: bool = False, tiers: list[dict[str, Any]] | None = None,
                 tier_mode: str = "exclusive") -> None:  # fmt: skip
        self.shadow = shadow
        self.tiers, self.tier_mode = tiers, tier_mode

    def operations_document(self) -> dict[str, Any]:
        return operations()

    def forecast_document(self) -> dict[str, Any]:
        doc = forecast()
        if self.tiers is not None:  # a tiered forecast (issue 34): tier_mode and tiers
            doc.update(tier_mode=self.tier_mode, tiers=self.tiers)
        if self.shadow:  # the sampled LRU simulation's curve, a little below the forecast
            curve = [{"capacity_blocks": p["capacity_blocks"], "hit_ratio": p["hit_ratio"] - 0.02}
                     for p in doc["curve"]]  # fmt: skip
            curve[0]["hit_ratio"] = None  # nothing measured there yet
            doc["shadow"] = {"hit_ratio": doc["hit_ratio"] - 0.02, "forecast_error": 0.02,
                             "curve": curve, "sampling_ratio": 0.05, "kept_accesses": 123_456,
                             "capacity_blocks": CAPACITY}  # fmt: skip
        return doc

    def table_document(self) -> dict[str, Any]:
        return table()

    def readiness(self) -> tuple[bool, dict[str, str]]:
        return True, {}

    def liveness(self) -> tuple[bool, str]:
        return True, "ok"


@pytest.fixture
def server() -> Iterator[HttpServer]:
    server = HttpServer("127.0.0.1", 0, State(), CollectorRegistry())
    server.start()
    yield server
    server.close()


def test_page_is_self_contained_html(server: HttpServer) -> None:
    with urllib.request.urlopen(server.url + "/", timeout=5) as reply:
        body, headers = reply.read().decode(), reply.headers
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "connect-src 'self'" in headers["Content-Security-Policy"]
    # No asset from anywhere: the only absolute URL is the SVG namespace, never fetched.
    assert set(re.findall(r"https?://[^\s\"'`]+", body)) == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"<(?:script|link|img)[^>]+(?:src|href)=\"(?!data:)", body)
    assert "innerHTML" not in body  # data goes in as text only
    assert "fetch(url" in body and '"v1/forecast"' in body and '"v1/table"' in body


class Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))

    def by_id(self, name: str) -> dict[str, str | None]:
        return next(attrs for _tag, attrs in self.found if attrs.get("id") == name)


def chromium(url: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        services.missing("chromium (Debian package)", "PATH", "not installed")
    command = [
        binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        f"--user-data-dir={tmp / 'profile'}", "--window-size=1280,900",
        "--virtual-time-budget=5000", *args, url,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=90, check=True)


def near(pixel: tuple[int, ...], color: tuple[int, int, int], tolerance: int = 3) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel[:3], color, strict=True))


@pytest.mark.integration
def test_chromium_draws_the_shadow_curve_and_its_figures(tmp_path: Path) -> None:
    server = HttpServer("127.0.0.1", 0, State(shadow=True), CollectorRegistry())
    server.start()
    try:
        texts = chromium(server.url + "/", tmp_path, "--dump-dom").stdout
    finally:
        server.close()
    dom = Elements()
    dom.feed(texts)
    assert dom.by_id("shadow-line")["d"].count("L") == 15  # 16 measured points
    assert dom.by_id("shadow-line")["stroke"] == "#2e7d32"
    assert ">27.2% (forecast − shadow +2.0%)<" in texts
    assert ">5.0% of blocks, 123,456 accesses<" in texts


@pytest.mark.integration
def test_chromium_draws_no_shadow_without_one(server: HttpServer, tmp_path: Path) -> None:
    dom = Elements()
    dom.feed(chromium(server.url + "/", tmp_path, "--dump-dom").stdout)
    assert dom.by_id("curve-line")  # the page drew the curve ...
    assert not any(attrs.get("id") == "shadow-line" for _tag, attrs in dom.found)  # ... alone


@pytest.mark.integration
def test_chromium_draws_numbers_curve_and_heatmap(server: HttpServer, tmp_path: Path) -> None:
    texts = chromium(server.url + "/", tmp_path, "--dump-dom").stdout
    dom = Elements()
    dom.feed(texts)
    assert ">29.2%<" in texts and ">27.0%<" in texts  # forecast beside observed
    assert dom.by_id("curve-line")["d"].count("L") == 16  # 17 curve points
    assert dom.by_id("capacity-marker")["stroke"] == "#b0289a"
    assert dom.by_id("observed-line") and dom.by_id("bound-line")
    cells = [attrs for tag, attrs in dom.found if tag == "rect" and attrs.get("class") == "cell"]
    assert len(cells) == len(table()["states"])
    for cell in cells:
        expected = COLORS[float(cell["data-p"])]
        assert cell["fill"] == "rgb({},{},{})".format(*expected)
    # The operator's figures, and the last hour of forecast and observed.
    for shown in (">1,234.5<", ">42 events<", ">9 (missing_field 7, too_late 2)<", ">4.2 s<",
                  ">unavailable: dead: no answer<"):  # fmt: skip
        assert shown in texts, shown
    states = {attrs.get("class") for tag, attrs in dom.found if tag == "dd"}
    assert {"state ok", "state bad"} <= states
    assert dom.by_id("history-forecast")["d"].count("L") == 9  # 10 points
    assert dom.by_id("history-observed")["d"].count("L") == 6  # observed from the 4th

    image_path = tmp_path / "page.png"
    chromium(server.url + "/", tmp_path, f"--screenshot={image_path}")
    image = pytest.importorskip("PIL.Image").open(image_path).convert("RGB")
    width, height = image.size
    assert (width, height) == (1280, 900)
    # (pixel count, colour) over the page below the big numbers: the curve and the heatmap.
    histogram = image.crop((0, 200, width, height)).getcolors(maxcolors=width * height)

    def count(color: tuple[int, int, int]) -> int:
        return sum(n for n, pixel in histogram if near(pixel, color))

    assert count(CURVE_BLUE) > 500  # the curve, 3 px wide, with its dots
    assert count(MARKER) > 150  # the dashed capacity marker and its label
    for p, color in COLORS.items():
        assert count(color) > 1000, p  # 32 heatmap cells of each colour


GPU_RATIO = forecast()["hit_ratio"]


def tiered_page(
    tmp_path: Path, tiers: list[dict[str, Any]], mode: str = "exclusive"
) -> tuple[str, Elements]:
    server = HttpServer("127.0.0.1", 0, State(tiers=tiers, tier_mode=mode), CollectorRegistry())
    server.start()
    try:
        texts = chromium(server.url + "/", tmp_path, "--dump-dom").stdout
    finally:
        server.close()
    dom = Elements()
    dom.feed(texts)
    return texts, dom


def bands(dom: Elements) -> list[dict[str, str | None]]:
    return [
        attrs for tag, attrs in dom.found if tag == "rect" and attrs.get("class") == "tier-band"
    ]


def curve_x(dom: Elements, capacity: float) -> float:
    """Where the page puts ``capacity`` on its axis: the curve point drawn there."""
    points = [attrs for tag, attrs in dom.found if tag == "circle"
              and attrs.get("class") == "curve-point"]  # fmt: skip
    capacities = [p["capacity_blocks"] for p in forecast()["curve"]]
    return float(points[capacities.index(capacity)]["cx"])


@pytest.mark.integration
@pytest.mark.parametrize(("mode", "host_blocks"), [("exclusive", 3 * CAPACITY),
                                                    ("inclusive", 4 * CAPACITY)])  # fmt: skip
def test_chromium_draws_a_band_for_each_of_two_tiers(
    tmp_path: Path, mode: str, host_blocks: int
) -> None:
    """GPU and host: two bands stacked, the host's over the capacities it adds (exclusive: its
    blocks after the GPU's; inclusive: up to its own, which hold the GPU's too)."""
    tiers = [{"name": "gpu", "capacity_blocks": CAPACITY, "hit_ratio": GPU_RATIO},
             {"name": "host", "capacity_blocks": host_blocks, "hit_ratio": 0.12}]  # fmt: skip
    texts, dom = tiered_page(tmp_path, tiers, mode)
    gpu, host = bands(dom)
    assert (gpu["data-tier"], host["data-tier"]) == ("gpu", "host")
    # Stacked: the host band starts at the hit ratio where the GPU band ends.
    assert float(host["y"]) + float(host["height"]) == pytest.approx(float(gpu["y"]), abs=0.15)
    # The GPU band from the axis to its capacity; the host's from there to 4 N in both modes.
    marker = float(dom.by_id("capacity-marker")["x1"])
    assert float(gpu["x"]) + float(gpu["width"]) == pytest.approx(marker, abs=0.15)
    assert float(host["x"]) == pytest.approx(marker, abs=0.15)
    end = curve_x(dom, 4 * CAPACITY)
    assert float(host["x"]) + float(host["width"]) == pytest.approx(end, abs=0.15)
    assert float(host["height"]) == pytest.approx(float(gpu["height"]) * 0.12 / GPU_RATIO, 0.02)
    assert ">tier host 12.0%<" in texts and f"({mode} tiers, 41.2% together)" in texts
    assert f">12.0% of the input, {host_blocks:,} blocks<" in texts


@pytest.mark.integration
def test_chromium_draws_no_band_for_a_forecast_of_one_tier(tmp_path: Path) -> None:
    tiers = [{"name": "gpu", "capacity_blocks": CAPACITY, "hit_ratio": GPU_RATIO}]
    texts, dom = tiered_page(tmp_path, tiers)
    assert dom.by_id("curve-line")  # the page drew the curve ...
    assert bands(dom) == []  # ... and no band
    assert '<div class="legend" id="tier-legend"></div>' in texts  # no tier in the legend
    assert ">tier gpu" not in texts  # nor in the workload figures
