"""Passwords kept off the command line: scrubbed titles, password files, one place for each."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcast.cli.secrets import read_secret, scrub_argv, with_password


def test_scrub_argv_hides_every_password_and_nothing_else() -> None:
    argv = ["kvcast", "run", "--store", "redis://:s3cret@h:6379/0", "--kafka-sasl-password",
            "k4fka", "--source=kafka://b:9092/t", "--store=rediss://u:p4ss@h:1/0",
            "--kafka-sasl-password=x9", "--namespace", "prod"]  # fmt: skip
    assert scrub_argv(argv) == [
        "kvcast", "run", "--store", "redis://:***@h:6379/0", "--kafka-sasl-password", "***",
        "--source=kafka://b:9092/t", "--store=rediss://u:***@h:1/0",
        "--kafka-sasl-password=***", "--namespace", "prod",
    ]  # fmt: skip
    assert scrub_argv(["kvcast", "run", "--store", "redis://h:1/0?password=q"]) == [
        "kvcast", "run", "--store", "redis://h:1/0?password=***",
    ]  # fmt: skip
    plain = ["kvcast", "run", "--store", "redis://h:1/0"]
    assert scrub_argv(plain) == plain


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1))
def test_a_password_file_round_trips_any_password_into_the_store_url(password: str) -> None:
    """Whatever the password's characters, the URL redis-py parses gives it back exactly."""
    from redis.connection import parse_url

    url = with_password("redis://127.0.0.1:6379/0", password)
    assert parse_url(url)["password"] == password
    assert scrub_argv(["--store", url]) == ["--store", "redis://:***@127.0.0.1:6379/0"]


def test_a_password_in_two_places_or_an_empty_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="give it in one place"):
        with_password("redis://:a@h:1/0", "b")
    with pytest.raises(ValueError, match="needs a redis:// store"):
        with_password("memory://", "b")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no password on its first line"):
        read_secret(empty, "--store-password-file")
    with pytest.raises(ValueError, match="cannot read it"):
        read_secret(tmp_path / "missing", "--store-password-file")
    good = tmp_path / "pw"
    good.write_text("  s3cret \nignored\n")
    assert read_secret(good, "--store-password-file") == "s3cret"


def test_scrub_argv_survives_a_malformed_url_and_a_query_after_the_flag() -> None:
    """issue 32: ``redis://u:pw@[::1/0`` raised in the scrubbing (urlsplit's ValueError), so the
    title kept the password; ``--store=URL?password=`` was split at the query's '='."""
    assert scrub_argv(["kvcast", "run", "--store", "redis://u:pw@[::1/0"]) == [
        "kvcast", "run", "--store", "redis://u:***@[::1/0",
    ]  # fmt: skip
    assert scrub_argv(["--store=redis://h:1/0?db=1&passw%6Frd=pw"]) == [
        "--store=redis://h:1/0?db=1&passw%6Frd=***"
    ]


def test_a_password_file_keeps_the_urls_db_and_options() -> None:
    from kvcast.stats.store_url import parse

    url = with_password("redis+sentinel://a:1,[::1]:2/mymaster/3?sentinel_password=z", "p w")
    parsed = parse(url)
    assert parsed.password == "p w" and parsed.db == 3 and parsed.hosts[1] == ("::1", 2)
    with pytest.raises(ValueError, match="give it in one place"):
        with_password("redis://h:1/0?passw%6Frd=a", "b")


def test_kvcast_table_names_a_malformed_url_in_one_line() -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", "from kvcast.cli.main import main; main()", "table", "--redis",
         "redis://u:S3cr3t@[::1/0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "S3cr3t" not in result.stderr and "closing ']'" in result.stderr
