"""``--callbacks kvcast.producer.router_callbacks.callbacks`` for the vLLM production-stack router.

The router itself cannot be installed here: it is not on PyPI (the package named
``vllm-router`` there is a different, Rust router without this hook). So the tests call the
callbacks the way the router's source does (``src/vllm_router/services/request_service/
request.py``: ``pre_request(request, request_body, request_json)`` before proxying, then
``post_request(request, full_response)`` as a background task), with Starlette's real
``Request`` (the FastAPI request the router passes), real response bytes from the
OpenAI-compatible stand-in (streamed and not), and real Kafka behind the producer.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web
from starlette.requests import Request

from kvcast.lab.bench.openai_standin import standin_app
from kvcast.lab.bench.processes import free_port
from kvcast.producer.router_callbacks import KvcastRouterCallbacks
from tests.producer.test_kafka_producer import read_back


@pytest.fixture(scope="module")
def engine() -> str:
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(standin_app())
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return f"http://127.0.0.1:{port}"


def starlette_request(path: str, headers: dict[str, str] | None = None) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "method": "POST", "path": path, "headers": raw,
                    "query_string": b"", "app": None})  # fmt: skip


def served(engine: str, callbacks: KvcastRouterCallbacks, body: dict, headers=None) -> bytes:
    """One request through the router's call sequence; returns what the client got."""
    request = starlette_request("/v1/chat/completions", headers)
    raw = json.dumps(body).encode()
    assert callbacks.pre_request(request, raw, body) is None  # never ends the request
    proxied = urllib.request.Request(engine + "/v1/chat/completions", data=raw,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(proxied, timeout=10) as response:
        content = response.read()
    callbacks.post_request(request, bytearray(content))  # the router passes a bytearray
    return content


def chat(engine: str, callbacks: KvcastRouterCallbacks, turns: int, stream: bool, headers=None):
    messages = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"secret question {turn}"})
        body = {"model": "m", "messages": messages, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        content = served(engine, callbacks, body, headers)
        if stream:
            reply = "".join(
                json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                for line in content.decode().splitlines()
                if line.startswith("data: {") and json.loads(line[6:])["choices"]
            )
        else:
            reply = json.loads(content)["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": reply})


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_router_traffic_becomes_events_with_turns_recovered_and_no_text(
    engine: str, kafka_bootstrap: str, kafka_topic: str, tmp_path: Path
) -> None:
    key = tmp_path / "hash.key"
    key.write_text("k" * 32)
    environ = {"KVCAST_SOURCE": f"kafka://{kafka_bootstrap}/{kafka_topic}",
               "KVCAST_HASH_KEY_FILE": str(key)}  # fmt: skip
    callbacks = KvcastRouterCallbacks(environ=environ)
    chat(engine, callbacks, 3, stream=False)
    chat(engine, callbacks, 2, stream=True)
    chat(engine, callbacks, 2, stream=False, headers={"X-User-Id": "alice"})
    # A path the router proxies but kvcast does not track, and a body that is not JSON.
    callbacks.pre_request(starlette_request("/v1/models"), b"", None)
    callbacks.post_request(starlette_request("/v1/chat/completions"), bytearray(b"not json"))
    producer = callbacks.recorder()
    producer.close()
    assert (producer.sent, producer.dropped) == (7, 0)
    events = [
        json.loads(payload) for _, _, payload in read_back(kafka_bootstrap, kafka_topic, 1, 7)
    ]
    sessions: dict[str, list[int]] = {}
    for event in events:
        sessions.setdefault(event["session_id"], []).append(event["turn"])
        assert event["input_tokens"] > 0  # streams included: usage asked for
        assert "secret" not in json.dumps(event)
    assert sorted(sessions.values()) == [[1, 2], [1, 2], [1, 2, 3]]
    assert sessions["alice"] == [1, 2]  # the router's session header


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_two_api_keys_with_the_same_history_never_share_a_session(
    engine: str, kafka_bootstrap: str, kafka_topic: str, tmp_path: Path
) -> None:
    """Before: the second caller's turn 2 landed on the first caller's (session, turn)."""
    key = tmp_path / "hash.key"
    key.write_text("k" * 32)
    environ = {"KVCAST_SOURCE": f"kafka://{kafka_bootstrap}/{kafka_topic}",
               "KVCAST_HASH_KEY_FILE": str(key)}  # fmt: skip
    callbacks = KvcastRouterCallbacks(environ=environ)
    histories = {k: [{"role": "user", "content": "hello"}] for k in ("sk-one", "sk-two")}
    for _turn in range(2):  # interleaved: both first turns, then both second turns
        for api_key, messages in histories.items():
            content = served(engine, callbacks, {"model": "m", "messages": messages},
                             {"Authorization": f"Bearer {api_key}"})  # fmt: skip
            reply = json.loads(content)["choices"][0]["message"]["content"]
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": f"{api_key}'s own question"}]  # fmt: skip
    assert callbacks.recorder().close()["sent"] == 4
    events = [json.loads(p) for _, _, p in read_back(kafka_bootstrap, kafka_topic, 1, 4)]
    sessions: dict[str, list[int]] = {}
    for event in events:
        sessions.setdefault(event["session_id"], []).append(event["turn"])
        assert "sk-" not in json.dumps(event)
    assert sorted(sessions.values()) == [[1, 2], [1, 2]]


def test_missing_configuration_is_named_and_never_raises_into_the_router(caplog) -> None:
    callbacks = KvcastRouterCallbacks(environ={})
    request = starlette_request("/v1/chat/completions")
    callbacks.pre_request(request, b"{}", {"model": "m", "messages": []})
    callbacks.post_request(request, bytearray(b"{}"))  # no exception
    assert "KVCAST_SOURCE and KVCAST_HASH_KEY_FILE must be set" in caplog.text


TOOLS = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_router_traffic_of_agents_is_labelled_by_how_each_response_ended(
    engine: str, kafka_bootstrap: str, kafka_topic: str, tmp_path: Path
) -> None:
    key = tmp_path / "hash.key"
    key.write_text("k" * 32)
    environ = {"KVCAST_SOURCE": f"kafka://{kafka_bootstrap}/{kafka_topic}",
               "KVCAST_HASH_KEY_FILE": str(key)}  # fmt: skip
    callbacks = KvcastRouterCallbacks(environ=environ)
    asked = [("tool_calls", "agent_tool_call"), ("stop", "agent_stop"),
             ("length", "agent_length"), ("content_filter", "agent_content_filter"),
             ("abort", "agent_cut"), ("none", None)]  # fmt: skip
    for stream in (False, True):
        for finish, _ in asked:
            body = {"model": "m", "tools": TOOLS, "standin_finish": finish, "stream": stream,
                    "messages": [{"role": "user", "content": f"find {finish}"}]}  # fmt: skip
            served(engine, callbacks, body, {"X-User-Id": "agent-7"})
    tagged = {"model": "m", "tools": TOOLS, "standin_finish": "tool_calls",
              "messages": [{"role": "user", "content": "tagged"}],
              "vllm_xargs": {"kvcast_intent": "code_debugging"}}  # fmt: skip
    served(engine, callbacks, tagged)
    assert callbacks.recorder().close()["sent"] == 2 * len(asked) + 1
    events = [
        json.loads(p) for _, _, p in read_back(kafka_bootstrap, kafka_topic, 1, 2 * len(asked) + 1)
    ]
    assert [e.get("intent") for e in events] == [
        *([label for _, label in asked] * 2),
        "code_debugging",  # the request's own intent wins over the ending
    ]


def test_the_agent_intents_setting_is_read_and_a_bad_one_is_named(tmp_path: Path, caplog) -> None:
    key = tmp_path / "hash.key"
    key.write_text("k" * 32)
    base = {"KVCAST_SOURCE": "kafka://127.0.0.1:1/t", "KVCAST_HASH_KEY_FILE": str(key)}
    for mode in ("tools", "all", "off"):
        producer = KvcastRouterCallbacks(environ={**base, "KVCAST_AGENT_INTENTS": mode}).recorder()
        assert producer.builder.agent_intents == mode
        producer.close(timeout_s=0.1)
    callbacks = KvcastRouterCallbacks(environ={**base, "KVCAST_AGENT_INTENTS": "yes"})
    request = starlette_request("/v1/chat/completions")
    callbacks.pre_request(request, b"{}", {"model": "m", "messages": []})
    callbacks.post_request(request, bytearray(b"{}"))  # no exception into the router
    assert "KVCAST_AGENT_INTENTS='yes': expected one of tools, all, off" in caplog.text
