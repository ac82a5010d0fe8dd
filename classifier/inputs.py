"""The classifier's input text: the last four user messages, turn markers, query prefix, truncation.

Pure text work (no torch). A *window* is the list of ``(turn, text)`` pairs of up to the last
:data:`WINDOW_TURNS` user messages of a conversation, oldest first. :func:`render` turns it into
one string for the embedder::

    >>> render([(2, "hi"), (3, "fix my code")], prefix="Query: ")
    'Query: [Turn 2] hi\\n[Turn 3] fix my code'

Truncation is head-tail *within each turn*: when the window exceeds the token budget, every turn
gets a share of it (short turns keep all their tokens and the rest is shared among the long
ones) and a long turn keeps its first and last tokens, joined by :data:`ELLIPSIS`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

WINDOW_TURNS = 4
MAX_INPUT_TOKENS = 1024
ELLIPSIS = " … "
HEAD_FRACTION = 0.5

Window = list[tuple[int, str]]
TokenSpans = Callable[[str], list[tuple[int, int]]]
"""Text -> character spans ``(start, end)`` of its tokens, in order (no special tokens)."""

_WORD = re.compile(r"\S+")


def whitespace_spans(text: str) -> list[tuple[int, int]]:
    """Token spans of whitespace-separated words (the fallback when no tokenizer is at hand)."""
    return [match.span() for match in _WORD.finditer(text)]


def marker(turn: int) -> str:
    """The turn marker put before each message."""
    return f"[Turn {turn}] "


def window_from_messages(
    messages: Sequence[dict[str, Any]], turn: int | None = None, size: int = WINDOW_TURNS
) -> Window:
    """The last ``size`` user messages of a chat as a window.

    The last user message is numbered ``turn`` (the event's turn) when given, else by its
    position among the user messages; earlier ones count down from it.
    """
    users = [
        str(message.get("content") or "")
        for message in messages
        if isinstance(message, dict) and message.get("role") == "user"
    ]
    users = [text for text in users if text.strip()]
    if not users:
        return []
    last = turn if turn is not None and turn >= 1 else len(users)
    tail = users[-size:]
    first = last - len(tail) + 1
    return [(max(1, first + k), text) for k, text in enumerate(tail)]


def share_budget(lengths: Sequence[int], budget: int) -> list[int]:
    """Tokens each turn may keep: water-filling of ``budget`` over turns of these lengths.

    Turns no longer than their fair share keep everything; what they leave is shared among the
    longer turns, so the total is ``min(sum(lengths), budget)``.
    """
    budget = max(0, budget)
    keep = [0] * len(lengths)
    pending = sorted(range(len(lengths)), key=lambda k: lengths[k])
    left = budget
    while pending:
        fair = left // len(pending)
        k = pending[0]
        if lengths[k] <= fair:
            keep[k] = lengths[k]
            left -= lengths[k]
            pending.pop(0)
            continue
        # Every remaining turn is longer than its fair share: split what is left evenly, the
        # remainder going to the newest turns (the last user message matters most).
        extra = left - fair * len(pending)
        for rank, j in enumerate(sorted(pending)):
            keep[j] = fair + (1 if rank >= len(pending) - extra else 0)
        break
    return keep


def head_tail(text: str, spans: Sequence[tuple[int, int]], keep: int) -> str:
    """``text`` cut to its first and last tokens, ``keep`` in all (head gets the larger half)."""
    if keep >= len(spans):
        return text
    if keep <= 0:
        return ""
    head = max(1, round(keep * HEAD_FRACTION)) if keep > 1 else 1
    tail = keep - head
    start = text[: spans[head - 1][1]]
    if tail == 0:
        return start
    return start + ELLIPSIS + text[spans[-tail][0] :]


def render(
    window: Window,
    prefix: str = "",
    max_tokens: int = MAX_INPUT_TOKENS,
    spans: TokenSpans = whitespace_spans,
    reserved: int = 0,
) -> str:
    """One input string: ``prefix`` then each turn's marker and (truncated) text, one per line.

    ``max_tokens`` bounds the whole input; ``reserved`` tokens of it are kept free (the
    tokenizer's special tokens). The prefix and markers are counted and never truncated.
    """
    window = window[-WINDOW_TURNS:]
    if not window:
        return prefix
    markers = [marker(turn) for turn, _ in window]
    overhead = len(spans(prefix)) + sum(len(spans(m)) for m in markers) + reserved
    budget = max_tokens - overhead
    texts = [text.strip() for _, text in window]
    # Fast path: a token covers at least one UTF-8 byte, so short inputs need no tokenizing.
    if sum(len(text.encode("utf-8")) for text in texts) > budget:
        token_spans = [spans(text) for text in texts]
        lengths = [len(s) for s in token_spans]
        if sum(lengths) > budget:
            # Each cut turn gains an ellipsis: keep room for one per turn.
            room = budget - len(spans(ELLIPSIS)) * len(texts)
            keep = share_budget(lengths, room)
            texts = [head_tail(t, s, k) for t, s, k in zip(texts, token_spans, keep, strict=True)]
    return prefix + "\n".join(m + t for m, t in zip(markers, texts, strict=True))


def single(text: str, turn: int = 1) -> Window:
    """A one-message window (a lone request, as in ``kvcast classify TEXT``)."""
    return [(turn, text)]
