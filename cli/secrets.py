"""Secrets kept off the command line: password files, and a process title without them.

A password given in a flag (``--store redis://:PASSWORD@...``, ``--kafka-sasl-password X``)
is readable by every local user in ``/proc/PID/cmdline``; the README recommends a file
(``--store-password-file``, ``--kafka-sasl-password-file``) or the environment. When one is
given as a flag anyway, the process title is rewritten without it as soon as the flags are
parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from kvcast.daemon.settings import redact_url

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
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "redis+cluster", "rediss+cluster",
                            "redis+sentinel", "rediss+sentinel"):  # fmt: skip
        raise ValueError(f"store {redact_url(url)!r}: a password file needs a redis:// store")
    if parts.password is not None or "password=" in parts.query.lower():
        raise ValueError(
            f"store {redact_url(url)!r}: holds a password already; give it in one place"
        )
    user = quote(parts.username or "", safe="")
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{host}"))


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
            head, eq, url = arg.rpartition("=") if arg.startswith("--") else ("", "", arg)
            out.append(f"{head}{eq}{redact_url(url)}")
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
