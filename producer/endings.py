"""How an agent's response ended -> the event's intent (docs/events.md, "Agent intents").

An agent's next turn depends on how its response ended: after a tool call the caller's machine
runs the tool and comes back in seconds; after a turn that ends, a person answers, in minutes.
The OpenAI ``finish_reason`` says which, so kvcast's producers put it on the event as an
intent when the caller gives none, and the per-(intent, turn) statistics need no classifier.
Standard library only (it runs inside the serving stack); the labels are also states of
``kvcast.stats.taxonomy`` (``AGENT_INTENTS``; a test holds the two lists equal).

The rules, in order, on the response's first choice (``index`` 0: the reply whose history the
next turn continues, as turn recovery assumes):

1. no ``finish_reason`` and the response was cut (client hang-up, upstream failure, timeout,
   shutdown) -> ``agent_cut``: it never finished, so how it would have ended is unknown;
2. ``length`` -> ``agent_length``, ``content_filter`` -> ``agent_content_filter``, even with a
   partial tool call in the reply (the engine cut it; the caller will not run it as sent);
3. tool calls in the reply (``tool_calls``, or the legacy ``function_call``), or a
   ``finish_reason`` of ``tool_calls`` / ``function_call`` -> ``agent_tool_call``. A reply that
   carries tool calls is a tool call whatever ``finish_reason`` says: OpenAI and vLLM answer
   ``stop`` when ``tool_choice`` names the function;
4. ``stop`` -> ``agent_stop``;
5. ``abort`` (vLLM's and SGLang's reason for a request the engine aborted) or ``error``
   (vLLM's for one that failed in the engine) -> ``agent_cut``;
6. anything else, or none on a response that was not cut -> no label: the event goes on as
   before (the classifier, else ``unknown``). A reason kvcast does not know says nothing about
   who speaks next, and passing it through would make the intent a free-form, unbounded label.

Which requests get a label (``mode``): ``tools`` (the default) labels the requests of agents,
those that offer tools (``tools`` or the legacy ``functions``) or whose history holds tool
calls or tool results; a plain chat keeps its text for the classifier. ``all`` labels every
chat and completions response (a deployment that serves agents only, completions API
included). ``off`` labels none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "AGENT_INTENT_MODES",
    "AGENT_LABELS",
    "CONTENT_FILTER",
    "CUT",
    "LENGTH",
    "STOP",
    "TOOL_CALL",
    "agent_intent",
    "is_agent_request",
]

TOOL_CALL = "agent_tool_call"
STOP = "agent_stop"
LENGTH = "agent_length"
CONTENT_FILTER = "agent_content_filter"
CUT = "agent_cut"
AGENT_LABELS = (TOOL_CALL, STOP, LENGTH, CONTENT_FILTER, CUT)
AGENT_INTENT_MODES = ("tools", "all", "off")

_TRUNCATED = {"length": LENGTH, "content_filter": CONTENT_FILTER}
_CALLED = frozenset(("tool_calls", "function_call"))
_ENGINE_CUT = frozenset(("abort", "error"))
_TOOL_ROLES = frozenset(("tool", "function"))


def agent_intent(
    request: Mapping[str, Any], response: Mapping[str, Any], cut: str | None, mode: str = "tools"
) -> str | None:
    """The agent intent of one served request (see the module's rules), or None.

    ``response``: the body as :meth:`kvcast.producer.EventBuilder.build` takes it (a stream
    assembled: its first choice's ``finish_reason`` and the reply's ``tool_calls``).
    """
    if mode == "off" or (mode == "tools" and not is_agent_request(request)):
        return None
    choice = _first_choice(response)
    reason = choice.get("finish_reason")
    reason = reason if isinstance(reason, str) and reason else None
    if reason is None and cut:
        return CUT
    if reason in _TRUNCATED:
        return _TRUNCATED[reason]
    if reason in _CALLED or _calls_tools(choice.get("message")):
        return TOOL_CALL
    if reason == "stop":
        return STOP
    if reason in _ENGINE_CUT:
        return CUT
    return None


def is_agent_request(request: Mapping[str, Any]) -> bool:
    """Whether the request is an agent's: it offers tools, or its history has tool calls or
    tool results."""
    for name in ("tools", "functions"):
        offered = request.get(name)
        if isinstance(offered, list) and offered:
            return True
    messages = request.get("messages")
    if not isinstance(messages, list):
        return False
    for message in messages:
        if isinstance(message, Mapping) and (
            message.get("role") in _TOOL_ROLES or _calls_tools(message)
        ):
            return True
    return False


def _first_choice(response: Mapping[str, Any]) -> Mapping[str, Any]:
    """The choice with ``index`` 0 (else the first listed), or an empty mapping."""
    choices = response.get("choices")
    if not isinstance(choices, list):
        return {}
    listed = [c for c in choices if isinstance(c, Mapping)]
    for choice in listed:
        if choice.get("index", 0) == 0:
            return choice
    return listed[0] if listed else {}


def _calls_tools(message: Any) -> bool:
    """Whether a message carries tool calls (or the legacy function call)."""
    if not isinstance(message, Mapping):
        return False
    calls = message.get("tool_calls")
    return (isinstance(calls, list) and bool(calls)) or isinstance(
        message.get("function_call"), Mapping
    )
