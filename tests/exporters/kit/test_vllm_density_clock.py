"""kvcast's vLLM free queue under ``density`` on any clock: ``time.monotonic()`` is the
host's uptime (1e6 s after twelve days), a test or an engine may run on epoch seconds
(1.7e9 s) or further. At every instant where a list's end crosses an age bucket whose value
falls, and one float before it, a pop takes the block the client ranks first and returns.

Before flip times came from ``kvcast.exporters.kit.ages.flip_time`` they were a fixed nudge of
1e-9 s past the bucket's start, below the clock's float spacing from 1.7e9 s on (2.4e-7 s):
a pop one float before the boundary found the flip due, revalued the end in the same bucket,
pushed the same flip and never returned (issue 33)."""

from __future__ import annotations

import math

import pytest

from kvcast.exporters.kit.adapters.request_state import FixedTable
from kvcast.exporters.kit.adapters.vllm_queue import IACFreeBlockQueue
from kvcast.exporters.kit.ages import AGE_BUCKETS, age_bucket
from kvcast.exporters.kit.index import PriorityIndex
from tests.deadline import deadline
from tests.exporters.kit.test_vllm_queue_density import Block, Clock

OFFSETS = (0.0, 1e6, 1.7e9, 1e12)  # s


INDEX = PriorityIndex(
    {"version": 1, "characteristic_time_s": 120.0, "states": [
        {"intent": "code", "turn": 1, "p_continue": 0.8, "median_reuse_s": 8.0,
         "mu": math.log(8.0), "sigma": 0.8, "conversations": 200, "delay_samples": 50},
        {"intent": "chat", "turn": 2, "p_continue": 0.5, "median_reuse_s": 90.0,
         "mu": math.log(90.0), "sigma": 1.2, "conversations": 200, "delay_samples": 50}]}
)  # fmt: skip
STATES = (("code", 1), ("chat", 2))


def falls(state: tuple[str, int]) -> list[int]:
    """The buckets where the state's density falls: where the queue must revalue on time."""
    values = INDEX.curve(*state).values
    return [k for k in range(1, AGE_BUCKETS) if values[k] < values[k - 1]]


def around(origin: float, k: int) -> tuple[float, float]:
    """The last clock float at which an item aged since ``origin`` is below bucket ``k``, and
    the next float, at which it is in it (a bisection on the clock's floats, not flip_time)."""
    lo, hi = origin, origin + 2.0 ** (k / 8)  # ages 0 and past the bucket's start
    while True:
        mid = lo + (hi - lo) / 2
        if mid in (lo, hi):
            return lo, hi
        if age_bucket(mid - origin) < k:
            lo = mid
        else:
            hi = mid


@pytest.mark.parametrize("offset", OFFSETS)
def test_pops_at_every_boundary_take_the_clients_first_block(offset: float) -> None:
    clock = Clock()
    clock.now = offset
    queue = IACFreeBlockQueue([], table=FixedTable(INDEX, "density"), clock=clock)
    boundaries = sorted(
        {t for s in STATES for k in falls(s) for t in around(offset, k) if t - offset < 2e4}
    )
    assert len(boundaries) > 40  # both curves fall at many buckets within the run
    blocks = [Block(i) for i in range(2 * len(boundaries) + 4)]
    queue.reserve(len(blocks))
    freed: dict[int, tuple[tuple[str, int], float]] = {}
    for n, block in enumerate(blocks):  # one-block requests, both states, freed at the origin
        state = STATES[n % 2]
        with queue.tagging(*state):
            queue.append_n([block])
        freed[block.block_id] = (state, clock.now)
    with deadline(10.0, "a flip loops: the pops are still running"):
        for when in boundaries:
            clock.now = when
            order = queue.get_all_free_blocks()
            (got,) = queue.popleft_n(1)
            keys = [
                INDEX.priority(*freed[b.block_id][0], when - freed[b.block_id][1], 1,
                               policy="density")
                for b in order
            ]  # fmt: skip
            assert got is order[0] and keys == sorted(keys)
            del freed[got.block_id]
    assert queue.num_free_blocks == len(freed) > 0
