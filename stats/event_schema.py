"""The event contract as a JSON Schema (draft 2020-12), generated from the decoder's own types.

:class:`~kvcast.stats.events.Event`'s msgspec field types carry the contract's types and limits;
msgspec writes them out as a schema. The decoder differs from the contract in four ways (it
hands those events to the reference validator, which decides), and the schema states the
contract instead, so each difference is rewritten below, by name:

- unknown fields: the decoder refuses them, the contract ignores them;
- ``messages``: the decoder wants every value a string, the contract only ``role`` and
  ``content`` (other keys are ignored);
- ``block_hashes``: the decoder stops integers at int64, the contract takes up to 2**64 - 1;
- ``request_id``: the decoder's default is "" (then the contract's), the contract takes null.

Three rules are stated in ``x-kvcast-rules`` (JSON Schema cannot say them):
``cached_tokens <= input_tokens``, a finite ``timestamp``, and integers written as integers.
``tests/stats/test_event_schema.py`` holds the schema to ``parse_event`` on generated events,
and ``docs/event.schema.json`` to this function.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from kvcast.stats.events import MAX_BLOCK_HASHES, SCHEMA_VERSION, Event


def event_json_schema() -> dict[str, Any]:
    """The JSON Schema of one event (schema version :data:`SCHEMA_VERSION`)."""
    generated = msgspec.json.schema(Event)
    event = generated["$defs"]["Event"]
    properties = event["properties"]
    properties["schema"] = {
        "const": SCHEMA_VERSION,
        "description": "The event schema's version; optional, and if present exactly 1.",
    }
    request_id = properties["request_id"]
    request_id.pop("default")  # left out (or null): session_id + U+001F + turn
    properties["request_id"] = {"anyOf": [request_id, {"type": "null"}]}
    properties["messages"]["anyOf"][0]["items"] = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
    }
    properties["block_hashes"]["anyOf"][0] = {
        "type": "array",
        "maxItems": MAX_BLOCK_HASHES,
        "items": {
            "anyOf": [
                {"type": "integer", "minimum": -(1 << 63), "maximum": (1 << 64) - 1},
                {"type": "string"},
            ]
        },
    }
    for name, text in _DESCRIPTIONS.items():
        target = properties[name]
        target["description"] = text
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"kvcast event, schema version {SCHEMA_VERSION}",
        "description": (
            "One served request of a multi-turn conversation, as a kvcast producer sends it "
            "(one JSON object per Kafka record or file line, at most 1 MiB). Unknown fields "
            "are ignored. See docs/events.md."
        ),
        "type": "object",
        "required": [name for name in event["required"] if name != "schema"],
        "properties": properties,
        "additionalProperties": True,
        "x-kvcast-schema-version": SCHEMA_VERSION,
        "x-kvcast-rules": [
            "cached_tokens <= input_tokens (else rejected: cached_exceeds_input)",
            "timestamp is finite (else rejected: non_finite)",
            "integers are written as integers: 300, not 300.0 or 3e2 (else rejected: "
            "wrong_type), although JSON Schema counts 300.0 as an integer",
        ],
    }


_DESCRIPTIONS = {
    "session_id": "The conversation (opaque; 1-256 characters). Events of one session "
    "should share a Kafka key.",
    "turn": "1-based turn of the conversation this request serves.",
    "timestamp": "Arrival of the request, seconds (Unix epoch on a live topic).",
    "input_tokens": "Prompt tokens of the request, the conversation's history included.",
    "output_tokens": "Tokens generated for the request.",
    "request_id": "Identifies a request across retries (duplicates count once); default "
    "session_id + U+001F + turn.",
    "intent": "The producer's intent label (an event with one skips the classifier); outside "
    "the configured taxonomy it counts as unknown. kvcast's producers label an agent's request "
    "by how its response ended: agent_tool_call, agent_stop, agent_length, "
    "agent_content_filter, agent_cut (docs/events.md).",
    "cached_tokens": "Prompt tokens the engine served from its prefix cache "
    "(usage.prompt_tokens_details.cached_tokens).",
    "prompt": "User text, for the classifier only; never stored, logged or exported.",
    "messages": "Chat messages, for the classifier only; never stored, logged or exported.",
    "type": "Request type label (free-form).",
    "instance": "The serving instance that handled the request.",
    "block_hashes": "Ids of the request's KV blocks in order (keyed hashes).",
}


def render_event_schema() -> str:
    """The schema as the shipped file holds it (``docs/event.schema.json``)."""
    return json.dumps(event_json_schema(), indent=2) + "\n"
