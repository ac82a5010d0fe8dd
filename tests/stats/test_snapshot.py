"""Reading the window: the delay samples become typed columns, whatever their number."""

from __future__ import annotations

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
