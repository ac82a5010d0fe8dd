"""Agent intents from how a response ended (``kvcast.producer.endings``, docs/events.md).

The responses are the OpenAI-compatible stand-in's real bytes (``lab/bench/openai_standin``),
JSON and server-sent events, assembled the way the router callbacks do
(``kvcast.producer.responses``) and the way the tap does (``kvcast.daemon.tap_copy``); the
events go through :class:`~kvcast.producer.EventBuilder` and kvcast's own decoder.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.daemon.tap_copy import copy_for
from kvcast.lab.bench.openai_standin import STANDIN_FINISH, standin_app
from kvcast.lab.bench.processes import free_port
from kvcast.producer import EventBuilder
from kvcast.producer.endings import AGENT_LABELS, agent_intent, is_agent_request
from kvcast.producer.responses import response_body
from kvcast.stats.events import parse_event
from kvcast.stats.taxonomy import AGENT_INTENTS, label_map

SECRET = b"endings-test-secret-of-32-bytes!"
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
EXPECTED = {
    "tool_calls": "agent_tool_call",
    "function_call": "agent_tool_call",
    "stop": "agent_stop",
    "length": "agent_length",
    "content_filter": "agent_content_filter",
    "abort": "agent_cut",
    "error": "agent_cut",
    "none": None,  # no finish_reason, not cut: no label
    "eos": None,  # a reason kvcast does not know: no label
}


@pytest.fixture(scope="module")
def engine() -> str:
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(standin_app(word_interval_s=0.0))
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return f"http://127.0.0.1:{port}"


def fetch(engine: str, body: dict, path: str = "/v1/chat/completions") -> bytes:
    request = urllib.request.Request(engine + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


def agent_body(finish: object, stream: bool, **extra: object) -> dict:
    body = {"model": "m", "tools": TOOLS, STANDIN_FINISH: finish, "stream": stream,
            "messages": [{"role": "user", "content": "fix the failing test"}], **extra}  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def tap_body(content: bytes, stream: bool, chunk: int = 7) -> dict | None:
    """The response as the tap's copy assembles it, fed ``chunk`` bytes at a time."""
    media = "text/event-stream" if stream else "application/json"
    copy = copy_for(media, None, 1 << 20)
    for start in range(0, len(content), chunk):
        copy.feed(content[start : start + chunk])
    return copy.body()


def event_of(builder: EventBuilder, request: dict, response: dict | None, **context) -> dict:
    event = builder.build(request, response, arrival_s=100.0, **context)
    parse_event(json.dumps(event).encode())  # kvcast's decoder takes it
    return event


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("finish", list(EXPECTED))
def test_each_finish_reason_labels_the_event_streamed_or_not(
    engine: str, finish: str, stream: bool
) -> None:
    request = agent_body(finish, stream)
    content = fetch(engine, request)
    for response in (response_body(content, streamed=stream), tap_body(content, stream)):
        event = event_of(EventBuilder(SECRET), request, response)
        assert event.get("intent") == EXPECTED[finish], (finish, stream, response)
        assert event["input_tokens"] == 10  # the usage is still read


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_under_a_named_tool_choice_is_a_tool_call_although_it_says_stop(
    engine: str, stream: bool
) -> None:
    """OpenAI (and vLLM) answer finish_reason "stop" when tool_choice names the function."""
    choice = {"type": "function", "function": {"name": "read_file"}}
    request = agent_body("tool_calls", stream, tool_choice=choice)
    content = fetch(engine, request)
    assert b'"finish_reason": "stop"' in content and b"read_file" in content
    for response in (response_body(content, streamed=stream), tap_body(content, stream)):
        assert event_of(EventBuilder(SECRET), request, response)["intent"] == "agent_tool_call"


def test_a_cut_response_without_a_finish_reason_is_agent_cut_and_one_that_finished_keeps_it(
    engine: str,
) -> None:
    request = agent_body("tool_calls", True)
    content = fetch(engine, request)
    cut_before_finish = content[: content.index(b'"finish_reason"')]  # the call half streamed
    cut_after_finish = content[: content.index(b"[DONE]")]
    builder = EventBuilder(SECRET)
    cut = event_of(builder, request, tap_body(cut_before_finish, True), cut="client_disconnect")
    assert (cut["intent"], cut["cut"]) == ("agent_cut", "client_disconnect")
    late = event_of(builder, request, tap_body(cut_after_finish, True), cut="client_disconnect")
    assert late["intent"] == "agent_tool_call"  # it had ended before the client hung up
    nothing = event_of(builder, request, {}, cut="upstream_error")  # not one byte of body
    assert nothing["intent"] == "agent_cut"


@pytest.mark.parametrize("stream", [False, True])
def test_several_choices_take_the_first_choice_s_ending(engine: str, stream: bool) -> None:
    """The next turn continues choice 0's reply (turn recovery keys it), so it decides."""
    for finishes, expected in ((["stop", "tool_calls"], "agent_stop"),
                               (["tool_calls", "stop"], "agent_tool_call"),
                               (["length", "stop", "stop"], "agent_length")):  # fmt: skip
        request = agent_body(finishes, stream, n=len(finishes))
        content = fetch(engine, request)
        assert content.count(b'"finish_reason": "') >= len(finishes)  # every choice ended
        for response in (response_body(content, streamed=stream), tap_body(content, stream)):
            assert event_of(EventBuilder(SECRET), request, response)["intent"] == expected


def test_an_intent_the_caller_gives_wins_over_the_request_s_and_the_ending(engine: str) -> None:
    request = agent_body("tool_calls", False)
    response = response_body(fetch(engine, request), streamed=False)
    builder = EventBuilder(SECRET)
    assert event_of(builder, request, response, intent="code_debugging")["intent"] == (
        "code_debugging"
    )
    tagged = {**request, "vllm_xargs": {"kvcast_intent": "system_admin_devops"}}
    assert event_of(builder, tagged, response)["intent"] == "system_admin_devops"
    sglang = {**request, "custom_params": {"kvcast_intent": "code_generation", "kvcast_turn": 2}}
    assert event_of(builder, sglang, response)["intent"] == "code_generation"
    assert event_of(builder, tagged, response, intent="chitchat")["intent"] == "chitchat"
    for bad in ("", 7, "x" * 129, None):  # not a label the contract takes: the ending decides
        odd = {**request, "vllm_xargs": {"kvcast_intent": bad}}
        assert event_of(builder, odd, response)["intent"] == "agent_tool_call"


def test_a_plain_chat_keeps_no_label_unless_every_response_is_labelled(engine: str) -> None:
    """A chat without tools is left to the classifier (mode tools); ``all`` labels it."""
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    response = response_body(fetch(engine, request), streamed=False)
    assert "intent" not in event_of(EventBuilder(SECRET), request, response)
    every = EventBuilder(SECRET, agent_intents="all")
    assert event_of(every, request, response)["intent"] == "agent_stop"
    off = EventBuilder(SECRET, agent_intents="off")
    assert "intent" not in event_of(off, agent_body("tool_calls", False), response)


@pytest.mark.parametrize("stream", [False, True])
def test_the_legacy_completions_api_is_labelled_when_every_response_is(
    engine: str, stream: bool
) -> None:
    for finish in ("stop", "length", "content_filter"):
        request = {"model": "m", "prompt": "def add(a, b):", STANDIN_FINISH: finish,
                   "stream": stream}  # fmt: skip
        content = fetch(engine, request, "/v1/completions")
        for response in (response_body(content, streamed=stream), tap_body(content, stream)):
            assert "intent" not in event_of(EventBuilder(SECRET), request, response)  # no tools
            labelled = event_of(EventBuilder(SECRET, agent_intents="all"), request, response)
            assert labelled["intent"] == EXPECTED[finish]


def test_tool_results_in_the_history_make_an_agent_request_without_tools() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [{"role": "user", "content": "go"},
               {"role": "assistant", "content": None, "tool_calls": [call]}]  # fmt: skip
    assert is_agent_request({"messages": history})
    assert is_agent_request({"messages": [{"role": "tool", "content": "42"}]})
    assert is_agent_request({"functions": [{"name": "f"}]})
    assert not is_agent_request({"messages": [{"role": "user", "content": "hi"}], "tools": []})
    assert not is_agent_request({"prompt": "hi"})


def test_an_agent_conversation_keeps_its_session_across_tool_calls(engine: str) -> None:
    """The tool-call reply (content null) is the history the next turn extends."""
    builder = EventBuilder(SECRET)
    messages: list[dict] = [{"role": "user", "content": "run the tests"}]
    events = []
    for finish in ("tool_calls", "tool_calls", "stop"):
        request = {"model": "m", "tools": TOOLS, "messages": messages, STANDIN_FINISH: finish}
        body = json.loads(fetch(engine, request))
        events.append(event_of(builder, request, body))
        reply = body["choices"][0]["message"]
        messages = [*messages, reply]
        if reply.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                             "content": "3 passed"})  # fmt: skip
    assert [(e["turn"], e["intent"]) for e in events] == [
        (1, "agent_tool_call"), (2, "agent_tool_call"), (3, "agent_stop")
    ]  # fmt: skip
    assert len({e["session_id"] for e in events}) == 1


def test_the_labels_are_the_taxonomy_s_agent_intents_in_every_size() -> None:
    assert set(AGENT_LABELS) == set(AGENT_INTENTS)
    for size in (30, 20, 10):
        assert all(label_map(size)[label] == label for label in AGENT_LABELS)


def test_a_bad_mode_is_named() -> None:
    with pytest.raises(ValueError, match="agent_intents must be one of tools, all, off, got 'on'"):
        EventBuilder(SECRET, agent_intents="on")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
choices = st.fixed_dictionaries(
    {},
    optional={
        "index": st.integers(0, 2) | json_values,
        "finish_reason": st.sampled_from([*EXPECTED, None, ""]) | json_values,
        "message": st.fixed_dictionaries(
            {},
            optional={
                "tool_calls": json_values,
                "function_call": json_values,
                "content": json_values,
            },
        )
        | json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(
    request=st.fixed_dictionaries({}, optional={"tools": json_values, "messages": json_values}),
    response=st.fixed_dictionaries({}, optional={"choices": st.lists(choices, max_size=3)})
    | st.dictionaries(st.text(max_size=4), json_values, max_size=3),
    cut=st.sampled_from([None, "client_disconnect", ""]),
    mode=st.sampled_from(["tools", "all", "off"]),
)
def test_any_response_shape_gives_a_known_label_or_none_and_never_raises(
    request: dict, response: dict, cut: str | None, mode: str
) -> None:
    label = agent_intent(request, response, cut, mode)
    assert label is None or label in AGENT_LABELS
    if mode == "off" or (mode == "tools" and not is_agent_request(request)):
        assert label is None


@settings(max_examples=60, deadline=None)
@given(
    finishes=st.lists(st.sampled_from(list(EXPECTED)), min_size=1, max_size=3),
    cuts=st.lists(st.integers(1, 400), max_size=6),
)
def test_the_tap_s_copy_and_the_router_s_assembly_agree_however_the_stream_is_split(
    engine: str, finishes: list[str], cuts: list[int]
) -> None:
    """The same server-sent events, split anywhere: the same finish_reason and tool calls."""
    key = tuple(finishes)
    if key not in _STREAMS:
        _STREAMS[key] = fetch(engine, agent_body(finishes, True, n=len(finishes)))
    content = _STREAMS[key]
    copy = copy_for("text/event-stream", None, 1 << 20)
    start = 0
    for cut in sorted(cuts):
        copy.feed(content[start:cut])
        start = max(start, cut)
    copy.feed(content[start:])
    assert copy.body() == response_body(content, streamed=True)


_STREAMS: dict[tuple[str, ...], bytes] = {}  # the stand-in's stream per finishes, fetched once
