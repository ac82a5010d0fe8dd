"""``kvcast tap`` between the real OpenAI client and an OpenAI-compatible server.

The upstream is ``kvcast.lab.bench.openai_standin``, which stands in for vLLM's
OpenAI-compatible server (``vllm serve``): the same paths and bodies, ``usage`` with
``prompt_tokens_details.cached_tokens``, server-sent events ending in ``data: [DONE]``, and the
usage chunk when ``stream_options.include_usage`` asks for it. The events go to a real broker.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import openai
import pytest
from aiohttp import web

from kvcast.daemon.tap import Tap
from kvcast.lab.bench.openai_standin import GAUGE, standin_app
from kvcast.lab.bench.processes import free_port
from kvcast.producer import EventBuilder, KafkaEventProducer
from tests.producer.test_kafka_producer import read_back

pytestmark = pytest.mark.integration

SECRET = b"tap-test-secret-of-32-bytes-long"


class Servers:
    """The upstream stand-in and the tap, each on its own port, on one event loop thread."""

    def __init__(self, producer: KafkaEventProducer) -> None:
        self.loop = asyncio.new_event_loop()
        self.upstream_port, self.tap_port = free_port(), free_port()
        self.producer = producer
        self.runners: list[web.AppRunner] = []
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> Servers:
        self.thread.start()
        self.hold = asyncio.run_coroutine_threadsafe(self._event(), self.loop).result(10)
        upstream = self.upstream_app = standin_app(hold_after_first_word=self.hold)
        asyncio.run_coroutine_threadsafe(self._serve(upstream, self.upstream_port),
                                         self.loop).result(10)  # fmt: skip
        tap = self.tap = Tap(f"http://127.0.0.1:{self.upstream_port}", self.producer)
        runner = asyncio.run_coroutine_threadsafe(tap.start("127.0.0.1", self.tap_port),
                                                  self.loop).result(10)  # fmt: skip
        self.runners.append(runner)
        return self

    async def _event(self) -> asyncio.Event:
        return asyncio.Event()

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self.hold.set)

    async def _serve(self, app: web.Application, port: int) -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self.runners.append(runner)

    def __exit__(self, *exc: object) -> None:
        for runner in self.runners:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture
def tapped(kafka_bootstrap: str, kafka_topic: str) -> Iterator[tuple[Servers, openai.OpenAI]]:
    producer = KafkaEventProducer(kafka_bootstrap, kafka_topic, EventBuilder(SECRET))
    with Servers(producer) as servers:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{servers.tap_port}/v1", api_key="k")
        yield servers, client
    producer.close()


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_a_conversation_through_the_tap_reaches_kafka_with_its_turns(
    tapped, kafka_bootstrap: str, kafka_topic: str
) -> None:
    servers, client = tapped
    servers.release()  # this test does not hold the stream (the next one does)
    direct = openai.OpenAI(base_url=f"http://127.0.0.1:{servers.upstream_port}/v1", api_key="k")
    messages = [{"role": "user", "content": "private question about my order"}]
    first = client.chat.completions.create(model="m", messages=messages)
    assert first.choices[0].message.content == "answer 1"
    straight = direct.chat.completions.create(model="m", messages=messages)
    assert first.model_copy(update={"id": straight.id}) == straight  # ids: one per response
    messages += [{"role": "assistant", "content": "answer 1"},
                 {"role": "user", "content": "private follow-up"}]  # fmt: skip
    stream = client.chat.completions.create(model="m", messages=messages, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "answer 3 "  # relayed chunk by chunk
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 30
    assert client.models.list().data[0].id == "m"  # other paths pass through
    servers.producer.close()
    records = read_back(kafka_bootstrap, kafka_topic, 1, 2)
    events = [json.loads(payload) for _, _, payload in records]
    assert [(e["turn"], e["input_tokens"], e.get("cached_tokens")) for e in events] == [
        (1, 10, 5),
        (2, 30, 15),
    ]
    assert events[0]["session_id"] == events[1]["session_id"]
    assert all(b"private" not in payload for _, _, payload in records)


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_the_tap_relays_a_stream_as_it_arrives(tapped) -> None:
    """The stand-in holds its stream after the first word until this client has read that
    word through the tap: a tap that buffered would leave the stand-in waiting in vain."""
    servers, client = tapped
    messages = [{"role": "user", "content": "a b c d e f"} for _ in range(40)]
    words = []
    for chunk in client.chat.completions.create(model="m", messages=messages, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            words.append(chunk.choices[0].delta.content)
            servers.release()  # the first word came through while the stream was held
    assert words == ["answer ", "40 "]
    assert servers.upstream_app[GAUGE].held_too_long is False


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_a_stream_the_client_stops_still_reaches_kafka(
    tapped, kafka_bootstrap: str, kafka_topic: str
) -> None:
    """The real ``openai`` client reads the first word and closes the stream (the stand-in is
    holding it): the event of what was served still reaches the broker (before: none)."""
    servers, client = tapped
    messages = [{"role": "user", "content": "tell me everything"}]
    stream = client.chat.completions.create(model="m", messages=messages, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break  # the first word
    stream.close()
    records = read_back(kafka_bootstrap, kafka_topic, 1, 1)
    servers.release()
    event = json.loads(records[0][2])
    assert event["turn"] == 1 and event["input_tokens"] == 0  # no usage chunk was served
    assert servers.tap.counts["cut_client_disconnect"] == 1
