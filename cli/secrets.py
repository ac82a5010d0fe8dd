"""Secrets kept off the command line: password files, and a process title without them.

A password given in a flag (``--store redis://:PASSWORD@...``, ``--kafka-sasl-password X``)
is readable by every local user in ``/proc/PID/cmdline``; the README recommends a file
(``--store-password-file``, ``--kafka-sasl-password-file``) or the environment. When one is
given as a flag anyway, the process title is rewritten without it as soon as the flags are
parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from kvcast.stats.store_url import StoreURLError, parse, redact

SECRET_FLAGS = ("--kafka-sasl-password",)


def read_secret(path: Path, what: str) -> str:
    """The first line of ``path``, stripped; ValueError naming the file when it has none."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {path}: cannot read it ({exc.__class__.__name__})") from None
    secret = lines[0].strip() if lines else ""
    if not secret:
        raise ValueError(f"{what} {path}: the file holds no password on its first line")
    return secret


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` as its user-info password; ValueError if it has one already."""
    try:
        parsed = parse(url)
    except StoreURLError as exc:
        raise ValueError(str(exc)) from None
    if parsed.kind == "memory":
        raise ValueError(f"store {redact(url)!r}: a password file needs a redis:// store")
    if parsed.password is not None:
        raise ValueError(f"store {redact(url)!r}: holds a password already; give it in one place")
    # Formatted by the grammar: the password percent-encoded whatever its characters.
    return replace(parsed, password=password).format()


def scrub_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with every password replaced by ``***`` (URLs and the secret flags)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}=***")
            else:
                out.append(arg)
                hide_next = True
            continue
        if "://" in arg:
            # --flag=URL: the flag ends at the first '=' (a URL's query holds more of them).
            head, eq, url = arg.partition("=") if arg.startswith("--") else ("", "", arg)
            out.append(f"{head}{eq}{redact(url)}")
            continue
        out.append(arg)
    return out


def hide_secrets_from_process_title(argv: Sequence[str]) -> bool:
    """Rewrite the process title (``/proc/PID/cmdline``) when ``argv`` holds a password."""
    scrubbed = scrub_argv(argv)
    if scrubbed == list(argv):
        return False
    import setproctitle  # only a process that was given a secret needs it

    setproctitle.setproctitle(" ".join(scrubbed))
    return True
