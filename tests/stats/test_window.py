"""The statistics window's rows: which intent a turn's state is filed under, and the delays and
shared gaps as the stores keep them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.stats.taxonomy import AGENT_INTENTS
from kvcast.stats.window import DelaySample, delay_from_row, gaps_from_stored, own_intent_rule


@pytest.mark.parametrize(
    ("mode", "label", "own"),
    [
        ("auto", "agent_tool_call", True),
        ("auto", "agent_stop", True),
        ("auto", "code_generation", False),
        ("auto", "unknown", False),
        ("conversation", "agent_tool_call", False),
        ("turn", "code_generation", True),
        ("turn", "unknown", True),
    ],
)
def test_the_rule_says_which_labels_file_their_own_turn(mode: str, label: str, own: bool) -> None:
    assert own_intent_rule(mode)(label) is own


def test_auto_files_every_agent_ending_by_its_own_turn() -> None:
    assert all(own_intent_rule("auto")(label) for label in AGENT_INTENTS)


def test_an_unknown_mode_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="state_intent must be auto, conversation or turn"):
        own_intent_rule("last")


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        # Before shared prefixes: four fields, the state under the conversation's intent.
        ([12.5, 3, "chitchat", 2], (12.5, 3, "chitchat", 2, 0, "chitchat")),
        ([12.5, 3, "chitchat", 2, 1], (12.5, 3, "chitchat", 2, 1, "chitchat")),
        ([8.0, 40, "agent_stop", 7, 0, "agent_tool_call"],
         (8.0, 40, "agent_stop", 7, 0, "agent_tool_call")),
    ],
)  # fmt: skip
def test_a_stored_delay_row_reads_back_in_each_of_its_forms(row: list, expected: tuple) -> None:
    delay = delay_from_row(row)
    assert type(delay) is DelaySample and delay == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 1e9, allow_nan=False) | st.integers(0, 10**6),  # JSON may drop ".0"
            st.integers(1, 10**6),
        ),
        max_size=20,
    )
)
def test_stored_gaps_read_flat_from_either_form(pairs: list[tuple[float, int]]) -> None:
    """A store holds gaps flat (now) or as [gap_s, blocks] pairs (an earlier daemon's): both
    read as the same flat list, gaps as floats and block counts as ints."""
    flat = [value for gap_s, blocks in pairs for value in (float(gap_s), blocks)]
    nested = [[gap_s, blocks] for gap_s, blocks in pairs]
    raw_flat = [value for gap_s, blocks in pairs for value in (gap_s, blocks)]
    for stored in (nested, raw_flat):
        read = gaps_from_stored(stored)
        assert read == flat
        assert [type(v) for v in read] == [float, int] * len(pairs)


def test_stored_gaps_that_do_not_pair_up_are_refused() -> None:
    with pytest.raises(ValueError, match="shared gaps: 3 values, not"):
        gaps_from_stored([1.5, 2, 3.0])
