"""The ``--delay`` value: a law (exp, lognormal) or a file of delays, with clear errors."""

from __future__ import annotations

import pytest

from kvcast.cli.delays import parse_delay_spec
from kvcast.stats.delays import Empirical, Exponential, LogNormal, parse_delays_text


def test_parse_delay_spec(tmp_path) -> None:
    assert parse_delay_spec("exp:135") == Exponential(135.0)
    assert parse_delay_spec(" lognormal:4.6, 1.0") == LogNormal(4.6, 1.0)
    f = tmp_path / "delays.txt"
    f.write_text("# seconds\n1.5\n2.5, 3\n\n4 # last\n")
    e = parse_delay_spec(str(f))
    assert isinstance(e, Empirical) and e.samples.tolist() == [1.5, 2.5, 3.0, 4.0]
    bad = {
        "exp:-1": "mean must be > 0",
        "exp:abc": "not a number",
        "exp:inf": "finite",
        "lognormal:4.6": "MU,SIGMA",
        "lognormal:4.6,0": "sigma must be > 0",
        "gamma:2,3": "no such file",
        str(tmp_path / "missing.txt"): "no such file",
    }
    for spec, msg in bad.items():
        with pytest.raises(ValueError, match=msg):
            parse_delay_spec(spec)
    with pytest.raises(ValueError, match="no delays"):
        parse_delays_text("# nothing\n")
    with pytest.raises(ValueError, match=r":2: 'x'"):
        parse_delays_text("1\nx\n", source="f")
    with pytest.raises(ValueError, match=">= 0"):
        parse_delays_text("-3")
