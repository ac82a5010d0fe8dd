"""The ``--delay`` option's value: a delay law, or the path of a file of delays in seconds."""

from __future__ import annotations

from pathlib import Path

from kvcast.stats.delays import DelayDistribution, parse_delay_law, parse_delays_text

_SPEC_HELP = (
    "expected exp:MEAN_S, lognormal:MU,SIGMA (of log seconds) or a file of delays in seconds"
)


def parse_delay_spec(spec: str) -> DelayDistribution:
    """``exp:MEAN_S`` | ``lognormal:MU,SIGMA`` | path of a file of delays -> a distribution.

    Raises ValueError naming what was wrong.
    """
    law = parse_delay_law(spec)
    if law is not None:
        return law
    text = spec.strip()
    path = Path(text)
    if not text or not path.is_file():
        raise ValueError(f"delay spec {spec!r}: {_SPEC_HELP} (no such file)")
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"delay spec {spec!r}: cannot read file: {exc}") from None
    return parse_delays_text(content, source=str(path))
