"""kvcast events from the vLLM production-stack router: its ``--callbacks`` hook.

    KVCAST_SOURCE=kafka://kafka:9092/kvcast-events KVCAST_HASH_KEY_FILE=/secrets/hash.key \\
        vllm-router ... --routing-logic session --session-key x-user-id \\
        --callbacks kvcast.producer.router_callbacks.callbacks

The router (``src/vllm_router``) imports the object its ``--callbacks`` names and calls, for
each request, ``pre_request(request, request_body, request_json)`` before proxying it and,
as a background task once the response is complete, ``post_request(request,
response_content)``. ``pre_request`` keeps the chat or completion request's JSON on
``request.state``; ``post_request`` turns it and the response (JSON, or the stream's events)
into an event. The router's session header (``KVCAST_SESSION_HEADER``, default
``x-user-id``) becomes the event's ``session_id`` (and its identity) when the request carries
it; otherwise the conversation is recovered from the history, as ``kvcast tap`` does, keyed
by the caller's identity (the body's ``user`` field, else a keyed hash of the
``Authorization: Bearer`` API key) so two callers with the same history never share a
session. Nothing here raises into the router: a request that cannot become an event is
counted dropped.

Configuration, from the environment of the router's process: ``KVCAST_SOURCE`` (required),
``KVCAST_HASH_KEY_FILE`` (required; the same file as every tap's), ``KVCAST_BLOCK_SIZE`` (16),
``KVCAST_INCLUDE_TEXT`` (``1`` sends the messages for kvcast's classifier), ``KVCAST_INSTANCE``,
``KVCAST_AGENT_INTENTS`` (``tools``: an agent's request without an intent is labelled by how its
response ended, ``agent_tool_call``, ``agent_stop``, ...; ``all``; ``off``; see
:mod:`kvcast.producer.endings`).
Streamed responses carry token counts only when the client asks for them
(``stream_options.include_usage``) or vLLM forces them (``--enable-force-include-usage``):
without, the event's ``input_tokens`` is 0.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvcast.producer.builder import EventBuilder
from kvcast.producer.endings import AGENT_INTENT_MODES
from kvcast.producer.kafka import KafkaEventProducer, kafka_topic_of
from kvcast.producer.responses import response_body

__all__ = ["TRACKED_PATHS", "KvcastRouterCallbacks", "callbacks"]

log = logging.getLogger(__name__)

TRACKED_PATHS = ("/v1/chat/completions", "/v1/completions")
_STATE_KEY = "kvcast_request"


class KvcastRouterCallbacks:
    """The production-stack router's ``CustomCallbackHandler`` interface (``pre_request``,
    ``post_request``), sending events through a :class:`KafkaEventProducer` made from the
    environment at the first request (or ``recorder``, anything with ``record``)."""

    def __init__(self, recorder: Any = None, environ: Mapping[str, str] | None = None) -> None:
        self._recorder = recorder
        self._environ = environ if environ is not None else os.environ
        self._lock = threading.Lock()
        self.session_header = self._environ.get("KVCAST_SESSION_HEADER", "x-user-id").lower()

    def pre_request(self, request: Any, request_body: bytes, request_json: Any) -> None:
        """Keep a tracked request's body for :meth:`post_request`; never ends the request."""
        try:
            if request.url.path in TRACKED_PATHS and isinstance(request_json, dict):
                setattr(request.state, _STATE_KEY, (request_json, time.time()))
        except Exception:  # the router must never see kvcast fail
            log.debug("kvcast: request not kept", exc_info=True)
        return None

    def post_request(self, request: Any, response_content: Any) -> None:
        """The event of a completed request (a background task of the router)."""
        try:
            kept = getattr(request.state, _STATE_KEY, None)
            if kept is None or response_content is None:
                return
            body, arrival_s = kept
            response = response_body(bytes(response_content), streamed=bool(body.get("stream")))
            session_id = request.headers.get(self.session_header) or None
            context: dict[str, Any] = {"arrival_s": arrival_s, "session_id": session_id}
            if session_id is not None:  # the router's session/user: part of the session key
                context["identity"] = session_id
            api_key = _bearer(request.headers.get("authorization"))
            if api_key is not None:  # only ever used through the builder's keyed hash
                context["api_key"] = api_key
            self.recorder().record(body, response, **context)
        except Exception:
            log.warning("kvcast: event not recorded", exc_info=True)

    def recorder(self) -> Any:
        with self._lock:
            if self._recorder is None:
                self._recorder = _producer_from(self._environ)
            return self._recorder


def _bearer(value: str | None) -> str | None:
    """The API key of an ``Authorization: Bearer KEY`` header, or None."""
    scheme, _, key = (value or "").partition(" ")
    return key.strip() or None if scheme.lower() == "bearer" else None


def _producer_from(environ: Mapping[str, str]) -> KafkaEventProducer:
    """A producer configured by ``KVCAST_*`` (ValueError naming the variable at fault)."""
    source = environ.get("KVCAST_SOURCE")
    key_file = environ.get("KVCAST_HASH_KEY_FILE")
    if not source or not key_file:
        raise ValueError("KVCAST_SOURCE and KVCAST_HASH_KEY_FILE must be set for the callbacks")
    bootstrap, topic = kafka_topic_of(source)
    block_size = environ.get("KVCAST_BLOCK_SIZE", "16")
    if not block_size.isdigit() or int(block_size) < 1:
        raise ValueError(f"KVCAST_BLOCK_SIZE={block_size!r}: expected a positive integer")
    agent_intents = environ.get("KVCAST_AGENT_INTENTS", "tools")
    if agent_intents not in AGENT_INTENT_MODES:
        raise ValueError(f"KVCAST_AGENT_INTENTS={agent_intents!r}: expected one of "
                         f"{', '.join(AGENT_INTENT_MODES)}")  # fmt: skip
    builder = EventBuilder(
        Path(key_file).read_bytes().strip(),
        block_size=int(block_size),
        include_text=environ.get("KVCAST_INCLUDE_TEXT") == "1",
        instance=environ.get("KVCAST_INSTANCE") or None,
        agent_intents=agent_intents,
    )
    return KafkaEventProducer(bootstrap, topic, builder)


callbacks = KvcastRouterCallbacks()  # --callbacks kvcast.producer.router_callbacks.callbacks
