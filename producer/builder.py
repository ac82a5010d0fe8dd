"""One served OpenAI-compatible request (and its response) -> one kvcast event (docs/events.md).

Standard library only: it runs inside the serving stack (a router callback, a proxy).

- **Session and turn** come from the caller when it knows them (a router's session key). Else
  they are recovered from the conversation itself: a chat request whose message history
  extends an earlier request's messages plus that request's reply continues the earlier
  conversation, one turn later. The builder keeps, for each answered request, a keyed hash of
  "its messages + its reply" -> (session, turn), in an LRU map of ``max_conversations`` entries
  (about 200 bytes each); a request is looked up by the keyed hashes of its message prefixes,
  longest first. A prompt request (completions API) has no history: it is turn 1 of a new
  session unless the caller says otherwise.
- **Identity** (the caller's ``identity``, else the body's OpenAI ``user`` field, else a keyed
  hash of ``api_key``) seeds every history key: two users with the same history never share a
  session. Without one, a request that continues a recovered session whose next turn another
  history already took starts a **branch**: a new session id, turn numbering continued, and
  ``branch_of`` naming the session it left. The same history asked again (by the same
  identity, or without one past turn 1) is a **retry**: same session and turn, ``retry`` = n,
  its own ``request_id``. Each answered conversation costs about 600 bytes (three LRU maps).
- **block_hashes**: a chain of keyed hashes (HMAC-SHA-256 with the deployment's secret), one
  per full block of ``block_size`` tokens when the caller has the token ids, else one per
  ``block_size * 4`` characters of the prompt text (about ``block_size`` tokens). Each block's
  hash covers everything before it, as an engine's prefix cache does, so two requests share
  leading hashes exactly where they share a prefix; without the secret nobody can tell which
  known prompt a hash stands for.
- **Intent**: the caller's (``intent``), else the one the request carries for the engine
  (``vllm_xargs.kvcast_intent`` or SGLang's ``custom_params.kvcast_intent``, the field kvcast's
  engine adapters read), else how an agent's response ended (:mod:`kvcast.producer.endings`:
  ``agent_tool_call``, ``agent_stop``, ...), else none (the daemon's classifier, or unknown).
- **User text** leaves only when ``include_text`` is on (for kvcast's intent classifier).
"""

from __future__ import annotations

import hmac
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from kvcast.producer.endings import AGENT_INTENT_MODES, agent_intent

__all__ = ["CHARS_PER_TOKEN", "EventBuilder"]

CHARS_PER_TOKEN = 4  # text blocks stand in for token blocks: about 4 characters a token
SCHEMA_VERSION = 1
MAX_SESSION_ID_CHARS = 256
MAX_INTENT_CHARS = 128  # the event contract's limit on a label


class EventBuilder:
    """Builds kvcast events; recovers sessions and turns from chat histories.

    ``secret``: the deployment's key for every hash (bytes, at least 16; keep it out of the
    code, e.g. a mounted file). ``block_size``: the engine's KV block size in tokens.
    ``max_conversations``: conversations remembered for turn recovery (least recent dropped).
    ``include_text``: put ``messages``/``prompt`` in the event (for the classifier); off by
    default. ``instance``: the serving instance's name for every event, if any.
    ``agent_intents``: which responses are labelled by how they ended when no intent is given
    (``tools``: agents' requests, the default; ``all``; ``off``; :mod:`kvcast.producer.endings`).
    """

    def __init__(
        self,
        secret: bytes,
        *,
        block_size: int = 16,
        max_conversations: int = 100_000,
        include_text: bool = False,
        instance: str | None = None,
        agent_intents: str = "tools",
    ) -> None:
        if agent_intents not in AGENT_INTENT_MODES:
            raise ValueError(f"agent_intents must be one of {', '.join(AGENT_INTENT_MODES)}, "
                             f"got {agent_intents!r}")  # fmt: skip
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise ValueError("secret must be at least 16 bytes (a per-deployment random key)")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1 token, got {block_size}")
        if max_conversations < 1:
            raise ValueError(f"max_conversations must be >= 1, got {max_conversations}")
        self._secret = secret
        self.block_size = block_size
        self.include_text = include_text
        self.instance = instance
        self.agent_intents = agent_intents
        self._max = max_conversations
        # history + its reply -> (session, turn): what the next turn's history extends
        self._answered: OrderedDict[bytes, tuple[str, int]] = OrderedDict()
        # a request's own history -> [session, turn, retries]: the same history asked again
        self._asked: OrderedDict[bytes, list[Any]] = OrderedDict()
        # (session, turn) -> the history that took it: another history there is a branch
        self._taken: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self.retries = 0  # requests recognised as retries (a regenerated answer)
        self.branches = 0  # requests that started a branch of a recovered session

    def build(
        self,
        request: Mapping[str, Any],
        response: Mapping[str, Any] | None = None,
        *,
        arrival_s: float | None = None,
        session_id: str | None = None,
        turn: int | None = None,
        intent: str | None = None,
        token_ids: Sequence[int] | None = None,
        identity: str | None = None,
        api_key: str | None = None,
        cut: str | None = None,
    ) -> dict[str, Any]:
        """The event of one request. ``request``: the OpenAI-compatible body (``messages`` or
        ``prompt``); ``response``: the response body (its ``usage``, ``id`` and reply), or for
        a stream the final chunk with ``usage`` plus the reply as ``choices[0].message`` (its
        ``tool_calls``, if any) and the stream's ``choices[0].finish_reason``
        (:mod:`kvcast.producer.responses` assembles one).
        ``arrival_s``: when the request arrived (Unix seconds; default now). ``token_ids``:
        the prompt's token ids, when the caller has them (exact block hashes).
        ``identity``: an opaque caller identity (a configured header's value); ``api_key``:
        the raw API key, only ever used through a keyed hash, never stored or emitted;
        ``cut``: why the response was cut short (``client_disconnect``, ``upstream_error``,
        ``timeout``, ...), put in the event as ``cut``. ``intent``: the caller's label; it
        wins over the request's ``kvcast_intent`` and over how the response ended."""
        response = response or {}
        messages = _messages(request.get("messages"))
        root = self._identity_key(identity, request.get("user"), api_key)
        keys = self._prefix_keys(messages, root) if messages is not None else []
        retry = 0
        branch_of: str | None = None
        if keys and (session_id is None or turn is None):
            found = self._recover(keys)
            asked = self._asked.get(keys[-1])
            if (
                asked is not None
                and (root or found is not None)
                and (session_id is None or session_id == asked[0])
            ):  # the same history asked again: a retry of that request
                self._asked.move_to_end(keys[-1])
                asked[2] += 1
                retry = asked[2]
                session_id, turn = asked[0], turn or asked[1]
                self.retries += 1
            elif found is not None:
                next_turn = turn or found[1] + 1
                taken = self._taken.get((session_id or found[0], next_turn))
                if session_id is None and taken is not None and taken != keys[-1]:
                    branch_of = found[0]  # another history took that turn: branch off
                    self.branches += 1
                else:
                    session_id = session_id or found[0]
                turn = next_turn
        session_id = (session_id or uuid.uuid4().hex)[:MAX_SESSION_ID_CHARS]
        turn = turn or 1
        usage = response.get("usage") or {}
        input_tokens = _count(usage.get("prompt_tokens"))
        event: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "session_id": session_id,
            "turn": turn,
            "timestamp": time.time() if arrival_s is None else arrival_s,
            "input_tokens": input_tokens,
            "output_tokens": _count(usage.get("completion_tokens")),
        }
        cached = _count((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
        if usage.get("prompt_tokens_details") is not None and cached <= input_tokens:
            event["cached_tokens"] = cached
        request_id = response.get("id")
        if isinstance(request_id, str) and 0 < len(request_id) <= 512:
            event["request_id"] = request_id
        elif retry:  # the default (session, turn) id would make the daemon drop it as a duplicate
            event["request_id"] = f"{session_id}\x1f{turn}\x1fretry {retry}"
        if retry:
            event["retry"] = retry
        if branch_of is not None:
            event["branch_of"] = branch_of
        if isinstance(cut, str) and cut:
            event["cut"] = cut[:64]
        if intent is None:
            intent = _requested_intent(request)
        if intent is None:
            intent = agent_intent(request, response, cut, self.agent_intents)
        if intent is not None:
            event["intent"] = intent
        if self.instance is not None:
            event["instance"] = self.instance
        hashes = self._block_hashes(token_ids, messages, request.get("prompt"))
        if hashes:
            event["block_hashes"] = hashes
        if self.include_text:
            if messages is not None:
                event["messages"] = messages
            elif isinstance(request.get("prompt"), str):
                event["prompt"] = request["prompt"]
        if keys:
            if not retry:
                self._put(self._asked, keys[-1], [session_id, turn, 0])
                self._put(self._taken, (session_id, turn), keys[-1])
            reply = _reply(response)
            if reply is not None:  # the key the next turn's history will start with
                self._put(self._answered, self._chain(keys[-1], reply), (session_id, turn))
        return event

    # -- turn recovery -------------------------------------------------------------------------

    def _chain(self, parent: bytes, message: dict[str, str]) -> bytes:
        """The keyed hash of a history: its last message chained on the key of the rest."""
        canonical = json.dumps([message["role"], message["content"]], ensure_ascii=False)
        return hmac.digest(self._secret, parent + canonical.encode("utf-8", "surrogatepass"),
                           "sha256")  # fmt: skip

    def _identity_key(self, identity: Any, user: Any, api_key: Any) -> bytes:
        """The keyed hash every history key of this caller chains on (b"": no identity).
        The kind is part of it, so a header and a ``user`` field with one value stay apart."""
        for kind, value in ((b"identity", identity), (b"user", user), (b"api_key", api_key)):
            if isinstance(value, str) and value:
                data = kind + b"\x1f" + value.encode("utf-8", "surrogatepass")
                return hmac.digest(self._secret, data, "sha256")
        return b""

    def _prefix_keys(self, messages: list[dict[str, str]], root: bytes = b"") -> list[bytes]:
        """Keyed hashes of messages[:1], messages[:2], ..., each chained on the one before
        (the first on ``root``, the caller's identity)."""
        keys, key = [], root
        for message in messages:
            key = self._chain(key, message)
            keys.append(key)
        return keys

    def _recover(self, keys: list[bytes]) -> tuple[str, int] | None:
        """The (session, turn) of the longest answered history the request's extends."""
        for key in reversed(keys[:-1]):  # the last message is the new one: never answered yet
            found = self._answered.get(key)
            if found is not None:
                self._answered.move_to_end(key)
                return found
        return None

    def _put(self, table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        """Set ``key`` as the most recent entry of ``table``; drop the least recent beyond
        ``max_conversations``."""
        table[key] = value
        table.move_to_end(key)
        while len(table) > self._max:
            table.popitem(last=False)

    # -- block hashes ---------------------------------------------------------------------------

    def _block_hashes(
        self,
        token_ids: Sequence[int] | None,
        messages: list[dict[str, str]] | None,
        prompt: Any,
    ) -> list[int]:
        if token_ids is not None:
            size = self.block_size
            chunks = [
                b",".join(str(int(t)).encode() for t in token_ids[start : start + size])
                for start in range(0, len(token_ids) - size + 1, size)
            ]
        else:
            if messages is not None:
                text = "".join(f"{m['role']}\x1e{m['content']}\x1f" for m in messages)
            elif isinstance(prompt, str):
                text = prompt
            else:
                return []
            data = text.encode("utf-8", "surrogatepass")
            size = self.block_size * CHARS_PER_TOKEN
            chunks = [data[start : start + size] for start in range(0, len(data) - size + 1, size)]
        hashes, parent = [], b""
        for chunk in chunks:
            parent = hmac.digest(self._secret, parent + chunk, "sha256")
            hashes.append(int.from_bytes(parent[:8], "big") >> 1)  # 63 bits: a JSON-safe int
        return hashes


def _messages(value: Any) -> list[dict[str, str]] | None:
    """The chat messages as role/content strings (content parts joined), or None."""
    if not isinstance(value, list):
        return None
    out = []
    for message in value:
        if not isinstance(message, Mapping):
            return None
        content = message.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
        out.append({"role": str(message.get("role", "")), "content": content or ""})
    return out


def _reply(response: Mapping[str, Any]) -> dict[str, str] | None:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    message = choices[0].get("message")
    if not isinstance(message, Mapping):
        return None
    return _messages([message])[0]  # type: ignore[index]


def _requested_intent(request: Mapping[str, Any]) -> str | None:
    """The ``kvcast_intent`` a request carries for the engine (vLLM's ``vllm_xargs``, SGLang's
    ``custom_params``), when it is a label the event contract takes (1-128 characters)."""
    for name in ("vllm_xargs", "custom_params"):
        extra = request.get(name)
        label = extra.get("kvcast_intent") if isinstance(extra, Mapping) else None
        if isinstance(label, str) and 0 < len(label) <= MAX_INTENT_CHARS:
            return label
    return None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
