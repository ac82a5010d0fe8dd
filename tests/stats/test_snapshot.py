"""Reading the window: the delay samples become typed columns, whatever their number."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.snapshot import _delay_columns
from kvcast.stats.window import DelaySample

INTENTS = ("code_generation", "translation", "unknown")
POSITION = {intent: index for index, intent in enumerate(sorted(INTENTS))}

delay_samples = st.builds(
    DelaySample,
    delay_s=st.floats(min_value=0, max_value=1e12, allow_nan=False),
    prev_blocks=st.integers(min_value=0, max_value=2**62),
    intent=st.sampled_from(INTENTS),
    turn=st.integers(min_value=1, max_value=32),
    prev_shared=st.integers(min_value=0, max_value=2**62),
    state_intent=st.sampled_from(INTENTS),
)


@given(st.lists(delay_samples, max_size=60))
def test_columns_hold_each_sample_field_in_order(samples: list[DelaySample]) -> None:
    delay_s, prev_blocks, intent, turn, prev_shared, state_intents = _delay_columns(
        samples, POSITION
    )
    assert (delay_s.dtype, prev_blocks.dtype, intent.dtype, turn.dtype, prev_shared.dtype) == (
        np.float64,
        np.int64,
        np.int32,
        np.int32,
        np.int64,
    )
    assert delay_s.tolist() == [s.delay_s for s in samples]
    assert prev_blocks.tolist() == [s.prev_blocks for s in samples]
    assert intent.tolist() == [POSITION[s.intent] for s in samples]
    assert turn.tolist() == [s.turn for s in samples]
    assert prev_shared.tolist() == [s.prev_shared for s in samples]
    # The state intents only where some differ from their conversation's.
    if all(s.state_intent == s.intent for s in samples):
        assert state_intents is None
    else:
        assert state_intents == [s.state_intent for s in samples]


def test_an_empty_window_gives_no_states_and_empty_typed_samples() -> None:
    snapshot = StatsEngine(StatsConfig()).snapshot()
    assert snapshot.states == () and snapshot.window_conversations == 0
    sample = snapshot.sample
    for column, dtype in (
        (sample.delay_s, np.float64),
        (sample.prev_blocks, np.int64),
        (sample.intent, np.int32),
        (sample.turn, np.int32),
    ):
        assert column.shape == (0,) and column.dtype == dtype


# Run in a fresh process: a test worker may hold threads of its own (servers, consumers).
_SPIN_PROBE = """
import os
from pathlib import Path
import numpy as np
from kvcast.lab.bench.processes import wait_until
from kvcast.stats.snapshot import _shared_reuse

def other_threads():
    for task in Path("/proc/self/task").iterdir():
        if int(task.name) != os.getpid():
            yield (task / "stat").read_text().rsplit(")", 1)[1].split()

def others():
    # utime + stime of every other thread (clock ticks)
    return sum(int(fields[11]) + int(fields[12]) for fields in other_threads())

def all_asleep():
    return all(fields[0] != "R" for fields in other_threads())

rng = np.random.default_rng(0)
gaps_s = np.sort(rng.lognormal(3.0, 1.0, 20_000))
blocks = rng.integers(1, 40, 20_000)
before = others()
for _ in range(3):
    law = _shared_reuse(gaps_s, blocks, 100.0)
# A woken BLAS thread spins (runnable) for ~0.1 s, then sleeps: its ticks are counted once
# every other thread is asleep again.
wait_until(all_asleep, 10.0, "the other threads to sleep")
logs = np.repeat(np.log(gaps_s), blocks)
print(others() - before, law.mu / logs.mean() - 1, law.sigma / logs.std() - 1)
"""


def test_the_shared_reuse_law_leaves_no_thread_spinning() -> None:
    """The law of a large window's shared gaps (one per request: 20,000 here) is two weighted
    sums. A BLAS dot of that length wakes OpenBLAS's helper threads, which then spin about
    0.1 s of a core after each snapshot; the sums must leave every other thread idle."""
    out = subprocess.run(
        [sys.executable, "-c", _SPIN_PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    ticks, mu_error, sigma_error = int(out[0]), float(out[1]), float(out[2])
    assert ticks <= 2  # 20 ms of the other threads' CPU at 100 ticks a second
    assert abs(mu_error) < 1e-12 and abs(sigma_error) < 1e-9
