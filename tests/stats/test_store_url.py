"""The store URL grammar (kvcast.stats.store_url): parse, format, redaction, clear errors."""

from __future__ import annotations

import subprocess
import sys
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcast.cli.secrets import scrub_argv
from kvcast.stats.store_url import (
    StoreURL,
    StoreURLError,
    is_secret_name,
    parse,
    redact,
    table_key,
)

SECRET = "S3cr-7q"
KVCAST = [sys.executable, "-c", "from kvcast.cli.main import main; main()"]


@pytest.mark.parametrize(
    "url",
    [
        f"redis://h:1/0?passw%6Frd={SECRET}",  # issue 32: slipped past the old redaction
        f"redis://h:1/0?PASSWORD={SECRET}",
        f"redis://h:1/0?Pass%57ord={SECRET}",
        f"redis://h:1/0?%70%61%73%73%77%6f%72%64={SECRET}",
        f"redis://h:1/0?pass%2577ord={SECRET}",  # encoded twice
        f"redis+sentinel://a:1/m/2?sentinel_password={SECRET}",
        f"redis+sentinel://a:1/m/2?sentinel_passw%6Frd={SECRET}",
        f"rediss://h:1/0?ssl_password={SECRET}",
        f"rediss://h:1/0?ssl_cert_reqs=none;ssl_password={SECRET}",
        f"redis://user:{SECRET}@h:1/0",
        f"redis://:{quote(SECRET)}@h:1/0",
        f"redis://u:pw/{SECRET}@h:1/0",  # a raw '/' in the password
        f"redis://u:pw?{SECRET}@h:1/0",  # a raw '?' in the password
        f"redis://u:pw@{SECRET}@h:1/0",  # a raw '@' in the password
        f"redis://u:{SECRET}@[::1/0",  # issue 32: malformed IPv6 host
        f"redis+cluster://u:{SECRET}@a:1,b:2?ssl_password={SECRET}",
        f"kafka://b:9092/t?token={SECRET}",
    ],
)
def test_redaction_hides_every_spelling(url: str) -> None:
    shown = redact(url)
    assert SECRET not in shown and quote(SECRET) not in shown, shown
    assert SECRET not in " ".join(scrub_argv(["--store", url, f"--store={url}"]))


def test_redaction_keeps_what_is_not_secret() -> None:
    assert redact("redis://h:1/0?db=1") == "redis://h:1/0?db=1"
    assert redact("rediss://h:1/0?ssl_ca_certs=/ca.pem") == "rediss://h:1/0?ssl_ca_certs=/ca.pem"
    assert redact("not a url") == "not a url"
    assert not is_secret_name("ssl_ca_certs") and is_secret_name("passw%6Frd")


def test_a_percent_encoded_password_option_is_the_password() -> None:
    """The grammar reads the decoded name, as redis-py would: ``?passw%6Frd=`` is a password."""
    parsed = parse(f"redis://h:1/0?passw%6Frd={SECRET}")
    assert parsed.password == SECRET and parsed.options == {}
    assert SECRET not in parsed.redacted()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (f"redis://u:{SECRET}@[::1/0", "IPv6 address without its closing ']'"),
        ("redis://[zz]:1/0", "is not an IPv6 address"),
        ("redis://::1:6379/0", "IPv6 address in brackets"),
        ("redis://h:70000/0", "port '70000' is not 1-65535"),
        ("redis://h:x/0", "port 'x' is not 1-65535"),
        ("postgres://h/0", "unknown scheme 'postgres'"),
        (f"redis://:{SECRET}@h:1/0?bogus=1", "unknown option 'bogus'"),
        ("redis://h:1/0?ssl_ca_certs=/x", "needs TLS"),
        ("redis://h:1/x", "database 'x' is not a number"),
        ("redis://a:1,b:2/0", "one host only"),
        ("redis+cluster://h:1/2", "database 0 only"),
        ("redis+sentinel://h:1", "/SERVICE_NAME"),
        (f"redis://:{SECRET}@h:1/0?password=x", "give one"),
        ("redis://h:1/0?db=1&db=2", "given twice"),
        (f"redis://u:pw/{SECRET}@h:1/0", "an '@' after the host"),
    ],
)
def test_a_malformed_url_is_one_clear_line_without_its_secret(url: str, message: str) -> None:
    with pytest.raises(StoreURLError, match=message) as caught:
        parse(url)
    text = str(caught.value)
    assert SECRET not in text and "\n" not in text


def test_db_sentinel_and_ipv6_are_read_everywhere_alike() -> None:
    parsed = parse("rediss+sentinel://u:p%40ss@[::1]:26379,b:2/my%20master/3?sentinel_password=z")
    assert parsed.hosts == (("::1", 26379), ("b", 2)) and parsed.service == "my master"
    assert parsed.db == 3 and parsed.credentials() == {"username": "u", "password": "p@ss"}
    assert parsed.sentinel_kwargs() == {"password": "z"} and parsed.tls_kwargs() == {"ssl": True}
    assert parse("redis://h/5").hosts == (("h", 6379),) and parse("redis://h/5").db == 5
    assert parse("redis://h:1?db=4").db == 4
    assert table_key("ns") == "ns:{ns}:table"


def test_a_malformed_store_url_is_a_usage_error_not_a_traceback() -> None:
    """Through the command: issue 32's URL crashed with a traceback before the title was
    scrubbed; now one line naming the problem, exit 2, the password nowhere."""
    result = subprocess.run(
        [*KVCAST, "run", "--print-config", "--store",
         f"redis://u:{SECRET}@[::1/0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and SECRET not in result.stderr + result.stdout
    assert "closing ']'" in result.stderr


def test_print_config_hides_an_encoded_password_option() -> None:
    result = subprocess.run(
        [*KVCAST, "run", "--print-config", "--store",
         f"redis://h:1/0?passw%6Frd={SECRET}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout and "passw%6Frd=***" in result.stdout


_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_hosts = st.one_of(
    st.builds(lambda n: f"h{n}", _names).filter(lambda h: not h.endswith("-")),
    st.sampled_from(["::1", "fe80::1", "127.0.0.1", "2001:db8::7"]),
)
_ports = st.integers(1, 65535)


@st.composite
def store_urls(draw: st.DrawFn) -> StoreURL:
    scheme = draw(st.sampled_from(["redis", "rediss", "redis+cluster", "rediss+cluster",
                                   "redis+sentinel", "rediss+sentinel"]))  # fmt: skip
    count = 1 if scheme in ("redis", "rediss") else draw(st.integers(1, 3))
    hosts = tuple((draw(_hosts), draw(_ports)) for _ in range(count))
    options: dict[str, str] = {}
    if scheme.startswith("rediss") and draw(st.booleans()):
        options["ssl_password"] = SECRET + draw(_text)
        options["ssl_ca_certs"] = draw(_text)
    if "sentinel" in scheme and draw(st.booleans()):
        options["sentinel_password"] = SECRET + draw(_text)
    return StoreURL(
        scheme=scheme,
        hosts=hosts,
        username=draw(st.one_of(st.none(), _names)),
        password=draw(st.one_of(st.none(), st.builds(lambda t: SECRET + t, _text))),
        db=0 if "cluster" in scheme else draw(st.integers(0, 15)),
        service=draw(_names) if "sentinel" in scheme else None,
        options=options,
    )


@given(store_urls())
def test_parse_format_round_trips_and_redaction_never_leaks(url: StoreURL) -> None:
    text = url.format()
    assert parse(text) == url
    for shown in (redact(text), url.redacted()):
        assert SECRET not in shown and quote(SECRET, safe="") not in shown, shown


_spellings = st.sampled_from(["password", "sentinel_password", "ssl_password", "passwd"])


@given(_spellings, st.lists(st.booleans(), min_size=20, max_size=20), _text)
def test_any_spelling_of_a_secret_option_is_redacted(
    name: str, flips: list[bool], tail: str
) -> None:
    """Random case and random percent-encoding of each letter of the option's name."""
    spelled = "".join(
        (f"%{ord(c):02X}" if flips[i % 20] else (c.upper() if flips[(i + 7) % 20] else c))
        for i, c in enumerate(name)
    )
    value = quote(SECRET + tail, safe="")
    shown = redact(f"rediss://h:1/0?db=1&{spelled}={value}")
    assert SECRET not in shown and value not in shown, shown
