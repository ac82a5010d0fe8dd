"""ShareGPT dumps: ``[{"id", "conversations": [{"from", "value"}, ...]}, ...]`` (no times).

Timing follows the IAC paper's synthetic workloads: conversations arrive as a Poisson process of
``rate`` per second (in file order); the delay between a turn and the next is log-normal with
``mu``/``sigma`` of log seconds (default 4.6 and 1). Tokens are ``ceil(chars / 4)`` per message.

A turn starts at each human (``human``/``user``) message: its ``input_tokens`` is the whole
chat so far (earlier messages of every role, the system prompt included) plus this message;
``output_tokens`` is the reply that follows it (assistant roles ``gpt``, ``chatgpt``,
``assistant``, ``bard``, ``bing``; 0 when none follows). ``prompt`` is the human message's text.
Conversations without a human message are skipped (counted in the summary).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from kvcast.lab.traces.common import ConversionSummary, TraceError

HUMAN = frozenset(("human", "user"))
ASSISTANT = frozenset(("gpt", "chatgpt", "assistant", "bard", "bing", "model"))
OTHER = frozenset(("system", "tool", "function", "observation"))


def tokens(text: str) -> int:
    """The chars/4 token estimate, rounded up."""
    return -(-len(text) // 4)


def _messages(obj: Any, item: int) -> tuple[str, list[tuple[str, str]]]:
    if not isinstance(obj, dict):
        raise TraceError(item, f"expected a JSON object, got {type(obj).__name__}")
    conv = obj.get("conversations")
    if not isinstance(conv, list):
        raise TraceError(item, "missing field 'conversations' (a list of {from, value})")
    out: list[tuple[str, str]] = []
    for pos, msg in enumerate(conv):
        if not isinstance(msg, dict):
            raise TraceError(item, f"conversations[{pos}] must be an object")
        role, text = msg.get("from"), msg.get("value")
        if not isinstance(role, str) or role.lower() not in HUMAN | ASSISTANT | OTHER:
            raise TraceError(item, f"conversations[{pos}].from is not a known role: {role!r:.30}")
        if not isinstance(text, str):
            raise TraceError(item, f"conversations[{pos}].value must be a string")
        out.append((role.lower(), text))
    cid = obj.get("id", item)
    return str(cid), out


def convert_sharegpt(
    records: Iterable[tuple[int, Any]],
    *,
    rate: float = 1.0,
    mu: float = 4.6,
    sigma: float = 1.0,
    seed: int = 0,
    session_prefix: str = "sg",
) -> tuple[list[dict[str, Any]], ConversionSummary]:
    """Events sorted by timestamp (s from 0); ``records`` are ``(item or line, object)`` pairs.

    The same records, rate, delay law and seed give the same events.
    """
    if not rate > 0 or not sigma > 0:
        raise ValueError("rate and sigma must be > 0")
    rng = np.random.default_rng(seed)
    events: list[dict[str, Any]] = []
    summary = ConversionSummary("sharegpt")
    arrival = 0.0
    seen: set[str] = set()
    for item, obj in records:
        summary.records += 1
        cid, msgs = _messages(obj, item)
        if cid in seen:
            cid = f"{cid}#{item}"
        seen.add(cid)
        starts = [k for k, (role, _) in enumerate(msgs) if role in HUMAN]
        if not starts:
            summary.skipped += 1
            continue
        if summary.conversations:
            arrival += float(rng.exponential(1.0 / rate))
        summary.conversations += 1
        ts = arrival
        context = sum(tokens(text) for _, text in msgs[: starts[0]])
        for turn, k in enumerate(starts, 1):
            if turn > 1:
                ts += float(np.exp(mu + sigma * rng.standard_normal()))
            text = msgs[k][1]
            reply = msgs[k + 1][1] if k + 1 < len(msgs) and msgs[k + 1][0] in ASSISTANT else None
            context += tokens(text)
            events.append(
                {
                    "session_id": f"{session_prefix}-{cid}",
                    "turn": turn,
                    "timestamp": ts,
                    "input_tokens": context,
                    "output_tokens": tokens(reply) if reply is not None else 0,
                    "request_id": f"{session_prefix}-{cid}:{turn}",
                    "prompt": text,
                }
            )
            end = starts[turn] if turn < len(starts) else len(msgs)
            context += sum(tokens(t) for _, t in msgs[k + 1 : end])
            summary.turns[turn] += 1
    events.sort(key=lambda e: e["timestamp"])
    summary.events = len(events)
    return events, summary
