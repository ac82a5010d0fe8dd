"""Session identity through ``kvcast tap`` with the real ``openai`` client (issue 32 item 2).

The upstream is ``kvcast.lab.bench.openai_standin`` (it stands in for ``vllm serve``: its reply
is ``answer N`` for N messages, so every user's first reply is the same, as in the issue). The
events are read back from the real broker and replayed through the daemon's statistics.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

import openai
import pytest
from aiohttp import web

from kvcast.daemon.tap import Tap, TapLimits
from kvcast.lab.bench.openai_standin import standin_app
from kvcast.lab.bench.processes import free_port
from kvcast.producer import EventBuilder, KafkaEventProducer
from tests.producer.test_kafka_producer import read_back
from tests.producer.test_sessions import through_statistics

pytestmark = pytest.mark.integration

SECRET = b"tap-session-secret-of-32-bytes!!"
SYSTEM = {"role": "system", "content": "You are the help desk of a shop. " * 4}
GREETING = {"role": "user", "content": "hello"}


@pytest.fixture
def tap_url(kafka_bootstrap: str, kafka_topic: str) -> Iterator[tuple[str, KafkaEventProducer]]:
    """The stand-in engine and a tap (identity header ``X-User-Id``) on one loop thread."""
    producer = KafkaEventProducer(kafka_bootstrap, kafka_topic, EventBuilder(SECRET))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    engine_port, tap_port = free_port(), free_port()
    runners: list[web.AppRunner] = []

    async def start() -> None:
        runner = web.AppRunner(standin_app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", engine_port).start()
        runners.append(runner)
        tap = Tap(f"http://127.0.0.1:{engine_port}", producer,
                  limits=TapLimits(identity_headers=("X-User-Id",)))  # fmt: skip
        runners.append(await tap.start("127.0.0.1", tap_port))

    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"http://127.0.0.1:{tap_port}/v1", producer
    finally:
        for runner in reversed(runners):
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        producer.close(timeout_s=5)


def wait_recorded(producer: KafkaEventProducer, count: int) -> None:
    """Bounded wait until the tap has handed ``count`` events to the producer: the next turn's
    history is looked up only once its previous turn's event is built."""
    end = time.monotonic() + 10
    while producer.stats()["recorded"] < count:
        assert time.monotonic() < end, "the tap did not record the event"
        time.sleep(0.005)


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_100_users_with_the_same_opening_through_the_tap_keep_their_sessions(
    tap_url, kafka_bootstrap: str, kafka_topic: str
) -> None:
    """A third of the users send the OpenAI ``user`` field, a third the identity header, a third
    their own API key. Before: 103 processed, 297 duplicates, mean turns 1.07."""
    url, producer = tap_url
    shared = openai.OpenAI(base_url=url, api_key="shared-key", max_retries=0)
    users = []
    for n in range(100):
        if n % 3 == 0:
            users.append((shared, {"user": f"user-{n}"}))
        elif n % 3 == 1:
            users.append((shared, {"extra_headers": {"X-User-Id": f"user-{n}"}}))
        else:
            users.append((openai.OpenAI(base_url=url, api_key=f"sk-{n}", max_retries=0), {}))
    histories = {n: [SYSTEM, GREETING] for n in range(100)}
    for turn in range(4):
        for n, (client, options) in enumerate(users):
            answer = client.chat.completions.create(model="m", messages=histories[n], **options)
            wait_recorded(producer, turn * 100 + n + 1)
            histories[n] += [{"role": "assistant", "content": answer.choices[0].message.content},
                             {"role": "user", "content": f"user {n}: question {turn}"}]  # fmt: skip
    assert producer.close(timeout_s=10)["sent"] == 400
    events = [json.loads(p) for _, _, p in read_back(kafka_bootstrap, kafka_topic, 1, 400)]
    assert through_statistics(events) == (400, 0, 4.0)
    assert len({e["session_id"] for e in events}) == 100
    assert not any("user-" in json.dumps(e) or "sk-" in json.dumps(e) for e in events)


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_a_regenerated_answer_through_the_tap_is_a_retry_with_its_tokens(
    tap_url, kafka_bootstrap: str, kafka_topic: str
) -> None:
    url, producer = tap_url
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    messages = [SYSTEM, GREETING]
    for count in (1, 2):  # asked, then regenerated
        client.chat.completions.create(model="m", messages=messages, user="alice")
        wait_recorded(producer, count)
    producer.close(timeout_s=10)
    events = [json.loads(p) for _, _, p in read_back(kafka_bootstrap, kafka_topic, 1, 2)]
    assert [(e["turn"], e.get("retry"), e["input_tokens"]) for e in events] == [
        (1, None, 20),
        (1, 1, 20),
    ]
    assert events[0]["session_id"] == events[1]["session_id"]
    assert events[0]["request_id"] != events[1]["request_id"]
    assert through_statistics(events)[:2] == (2, 0)  # processed, not a duplicate
