"""Agent traffic through ``kvcast tap``: the real ``openai`` client asks with tools, the
OpenAI-compatible stand-in answers with a chosen ``finish_reason`` (streamed and not), and the
events on a real broker carry how each response ended as their intent. Those events, run
through a real ``kvcast run`` (file source, classifier off), give per-label statistics; with a
classifier in the daemon, the labels stay.
"""

from __future__ import annotations

import json
import signal
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from click.testing import CliRunner

from kvcast.cli.main import cli
from kvcast.lab.bench.openai_standin import STANDIN_FINISH
from kvcast.lab.bench.processes import DaemonProcess, wait_until
from kvcast.producer import EventBuilder, KafkaEventProducer
from tests.daemon.test_classification import KeywordClassifier, run_daemon
from tests.daemon.test_tap import SECRET, Servers
from tests.producer.test_kafka_producer import read_back

pytestmark = pytest.mark.integration

TOOLS = [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}]


@pytest.fixture
def tapped(kafka_bootstrap: str, kafka_topic: str) -> Iterator[tuple[Servers, openai.OpenAI]]:
    # include_text: the events carry the messages, so a classifier would have text to label
    builder = EventBuilder(SECRET, include_text=True)
    producer = KafkaEventProducer(kafka_bootstrap, kafka_topic, builder)
    with Servers(producer) as servers:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{servers.tap_port}/v1", api_key="k")
        yield servers, client
    producer.close()


def ask(client: openai.OpenAI, messages: list, finish: str, stream: bool, **extra) -> dict:
    """One agent request through the tap; the reply message as the client assembled it."""
    body = {STANDIN_FINISH: finish, **extra.pop("extra_body", {})}
    kwargs = {"model": "m", "messages": messages, "tools": TOOLS, "extra_body": body, **extra}
    if not stream:
        message = client.chat.completions.create(**kwargs).choices[0].message
        return message.model_dump(exclude_none=True)
    content, calls = "", {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                empty = {"name": "", "arguments": ""}
                whole = calls.setdefault(call.index, {"id": call.id, "function": empty})
                whole["function"]["name"] += call.function.name or ""
                whole["function"]["arguments"] += call.function.arguments or ""
    if calls:
        whole = [{**calls[i], "type": "function"} for i in sorted(calls)]
        return {"role": "assistant", "tool_calls": whole}
    return {"role": "assistant", "content": content}


def agent_run(client: openai.OpenAI, n: int, finishes: list[str], stream: bool) -> None:
    """One agent conversation: each response ends as ``finishes`` says; tool results follow
    tool calls, as an agent's loop sends them."""
    messages: list = [{"role": "system", "content": "You are a coding agent."},
                      {"role": "user", "content": f"please fix bug {n} in my code"}]  # fmt: skip
    for finish in finishes:
        reply = ask(client, messages, finish, stream)
        messages.append(reply)
        for call in reply.get("tool_calls", []):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "1 failed"})
        if "tool_calls" not in reply:
            messages.append({"role": "user", "content": "thanks, now the other bug"})


def recorded(servers: Servers, count: int) -> None:
    """Wait until the tap has handed ``count`` events to the producer (it records a response
    once relayed, so the client may be done first), then close the producer."""
    wait_until(lambda: servers.tap.counts["events_recorded"] >= count, 30, f"{count} events")
    assert servers.tap.counts["events_recorded"] == count, servers.tap.counts
    assert servers.producer.close()["sent"] == count


def events_of(kafka_bootstrap: str, kafka_topic: str, count: int) -> list[dict]:
    return [json.loads(p) for _, _, p in read_back(kafka_bootstrap, kafka_topic, 1, count)]


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_each_ending_through_the_tap_becomes_the_event_s_intent(
    tapped, kafka_bootstrap: str, kafka_topic: str
) -> None:
    servers, client = tapped
    servers.release()  # no stream is held here
    user = [{"role": "user", "content": "list the files"}]
    finishes = ("tool_calls", "function_call", "stop", "length", "content_filter")
    asked = [(finish, stream) for stream in (False, True) for finish in finishes]
    for finish, stream in asked:
        ask(client, user, finish, stream)
    named = {"type": "function", "function": {"name": "run_tests"}}
    ask(client, user, "tool_calls", True, tool_choice=named)  # finish_reason "stop", a call
    tagged = {"vllm_xargs": {"kvcast_intent": "code_debugging"}}  # the engine's own field
    ask(client, user, "tool_calls", False, extra_body=tagged)
    plain = client.chat.completions.create(model="m", messages=user)  # no tools: a chat
    assert plain.choices[0].finish_reason == "stop"
    recorded(servers, len(asked) + 3)
    events = events_of(kafka_bootstrap, kafka_topic, len(asked) + 3)
    assert [e.get("intent") for e in events] == [
        *(["agent_tool_call", "agent_tool_call", "agent_stop", "agent_length",
           "agent_content_filter"] * 2),
        "agent_tool_call",  # the reply carries the call although it says stop
        "code_debugging",  # the caller's intent wins
        None,  # a chat without tools is left to the classifier
    ]  # fmt: skip
    assert all(e["input_tokens"] == 10 for e in events)


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_an_agent_stream_the_client_hangs_up_on_is_agent_cut(
    tapped, kafka_bootstrap: str, kafka_topic: str
) -> None:
    """The stand-in holds the stream after the tool call's first piece; the client closes it:
    no finish_reason ever came, so the event says agent_cut (and its cut reason)."""
    servers, client = tapped
    kwargs = {"model": "m", "tools": TOOLS, "extra_body": {STANDIN_FINISH: "tool_calls"},
              "messages": [{"role": "user", "content": "refactor everything"}]}  # fmt: skip
    stream = client.chat.completions.create(stream=True, **kwargs)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.tool_calls:
            break  # the call has started
    stream.close()
    event = events_of(kafka_bootstrap, kafka_topic, 1)[0]
    servers.release()
    assert (event["intent"], event["cut"]) == ("agent_cut", "client_disconnect")


RUNS = {  # the conversation's (last turn's) label -> how each of its responses ends
    "agent_stop": ["tool_calls", "tool_calls", "stop"],
    "agent_length": ["tool_calls", "length"],
    "agent_tool_call": ["tool_calls"],  # the agent stopped after a tool call (its last turn)
}


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_the_daemon_counts_agent_conversations_per_label_with_the_classifier_off(
    tapped, kafka_bootstrap: str, kafka_topic: str, tmp_path: Path
) -> None:
    servers, client = tapped
    servers.release()
    n = 0
    for finishes in RUNS.values():
        for stream in (False, True, False):
            agent_run(client, n, finishes, stream)
            n += 1
    total = sum(3 * len(f) for f in RUNS.values())
    recorded(servers, total)
    events = events_of(kafka_bootstrap, kafka_topic, total)
    assert len({e["session_id"] for e in events}) == 9  # every turn recovered
    log_file = tmp_path / "events.jsonl"
    log_file.write_text("".join(json.dumps(e) + "\n" for e in events))

    daemon = DaemonProcess(
        ["--source", f"file://{log_file}", "--classifier", "off",
         "--metrics-addr", "127.0.0.1:0", "--refresh-interval", "0.2"],
        tmp_path / "daemon.log",
    )  # fmt: skip
    try:
        table = wait_for_table(daemon, conversations=9)
    finally:
        assert daemon.stop(signal.SIGTERM) == 0
    states = {(s["intent"], s["turn"]): (s["conversations"], s["p_continue"])
              for s in table["states"]}  # fmt: skip
    # Each turn's state is its own response's ending (--state-intent auto): the tool calls'
    # turns of all three kinds of run share (agent_tool_call, t), nothing is unknown.
    label_of = {"tool_calls": "agent_tool_call", "stop": "agent_stop", "length": "agent_length"}
    reached: dict[tuple[str, int], int] = {}
    continued: dict[tuple[str, int], int] = {}
    for finishes in RUNS.values():
        for turn, finish in enumerate(finishes, 1):
            state = (label_of[finish], turn)
            reached[state] = reached.get(state, 0) + 3
            continued[state] = continued.get(state, 0) + (3 if turn < len(finishes) else 0)
    expected = {state: (n, continued[state] / n) for state, n in reached.items()}
    assert expected[("agent_tool_call", 1)] == (9, 6 / 9)  # 3 of the 9 runs end there
    assert states == expected

    # A classifier in the daemon labels what has no intent: these keep theirs.
    classifier = KeywordClassifier()
    store, _, _ = run_daemon(classifier, 5.0, [json.dumps(e).encode() for e in events])
    assert "messages" in events[0]  # the classifier had text to go on
    assert classifier.batches == [1]  # the worker's warm-up batch, and no event
    assert {(s["intent"], s["turn"]) for s in store.read_table()["states"]} == set(expected)


def wait_for_table(daemon: DaemonProcess, conversations: int) -> dict:
    table: dict = {}

    def complete() -> bool:
        nonlocal table
        try:
            table = daemon.get("/v1/table")
        except urllib.error.HTTPError:  # 503 until the first table
            return False
        return table.get("window_conversations") == conversations

    try:
        wait_until(complete, 60, f"a table of {conversations} conversations")
    except TimeoutError as exc:
        raise AssertionError(f"table {table}\n{daemon.text()}") from exc
    return table


def test_a_bad_agent_intents_flag_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    key = tmp_path / "hash.key"
    key.write_text("k" * 32)
    result = CliRunner().invoke(cli, ["tap", "--upstream", "http://127.0.0.1:1", "--source",
                                      "kafka://127.0.0.1:1/t", "--hash-key-file", str(key),
                                      "--agent-intents", "yes"])  # fmt: skip
    assert result.exit_code == 2
    assert "'--agent-intents'" in result.output and "'yes' is not one of" in result.output
    assert "Traceback" not in result.output
