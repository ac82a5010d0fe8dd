"""Input building: the four-message window, turn markers, prefix, head-tail truncation."""

from __future__ import annotations

from kvcast.classifier.inputs import (
    ELLIPSIS,
    head_tail,
    render,
    share_budget,
    whitespace_spans,
    window_from_messages,
)


def chat(*users: str) -> list[dict[str, str]]:
    out = []
    for text in users:
        out += [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
    return out


def test_window_takes_last_four_user_messages_numbered_back_from_the_turn() -> None:
    messages = [{"role": "system", "content": "be nice"}, *chat("u1", "u2", "u3", "u4", "u5")]
    assert window_from_messages(messages, turn=5) == [(2, "u2"), (3, "u3"), (4, "u4"), (5, "u5")]
    # Without a turn, positions among the user messages number them.
    assert window_from_messages(chat("a", "b"))[-1] == (2, "b")
    # A history cut short by the producer keeps the event's turn for the last message.
    assert window_from_messages(chat("x", "y"), turn=9) == [(8, "x"), (9, "y")]
    assert window_from_messages([{"role": "assistant", "content": "hi"}], turn=1) == []


def test_render_puts_prefix_and_one_marker_per_turn() -> None:
    text = render([(3, "hello"), (4, "fix my code")], prefix="Query: ")
    assert text == "Query: [Turn 3] hello\n[Turn 4] fix my code"
    assert render([], prefix="P: ") == "P: "
    # More than four turns: only the last four count.
    five = [(k, f"m{k}") for k in range(1, 6)]
    assert "[Turn 1]" not in render(five) and "[Turn 5] m5" in render(five)


def test_share_budget_water_fills() -> None:
    assert share_budget([3, 100, 5], 40) == [3, 32, 5]
    assert share_budget([50, 50], 41) == [20, 21]  # the newer turn gets the odd token
    assert share_budget([1, 2], 100) == [1, 2]
    assert sum(share_budget([7, 90, 33, 400], 128)) == 128


def test_head_tail_keeps_both_ends() -> None:
    text = " ".join(f"w{k}" for k in range(100))
    cut = head_tail(text, whitespace_spans(text), 10)
    assert cut.startswith("w0 w1 w2 w3 w4") and cut.endswith("w95 w96 w97 w98 w99")
    assert ELLIPSIS in cut and "w50" not in cut
    assert head_tail(text, whitespace_spans(text), 1000) == text


def test_truncation_is_within_each_turn_and_respects_the_budget() -> None:
    long_a = " ".join(f"a{k}" for k in range(3000))
    long_b = " ".join(f"b{k}" for k in range(3000))
    window = [(1, long_a), (2, "short question"), (3, long_b)]
    text = render(window, prefix="Query: ", max_tokens=1024, reserved=2)
    assert len(whitespace_spans(text)) + 2 <= 1024
    lines = text.split("\n")
    assert len(lines) == 3
    # Each long turn keeps its beginning and its end; the short one is untouched.
    assert lines[0].startswith("Query: [Turn 1] a0 a1") and lines[0].endswith("a2999")
    assert lines[1] == "[Turn 2] short question"
    assert lines[2].startswith("[Turn 3] b0 b1") and lines[2].endswith("b2999")
    # The two long turns share the room equally (within one token).
    kept_a = len(whitespace_spans(lines[0]))
    kept_b = len(whitespace_spans(lines[2]))
    assert abs(kept_a - kept_b) <= 2 and kept_a > 400


def test_short_inputs_skip_tokenizing() -> None:
    calls: list[str] = []

    def spans(text: str) -> list[tuple[int, int]]:
        calls.append(text)
        return whitespace_spans(text)

    render([(1, "tiny request")], prefix="", max_tokens=1024, spans=spans)
    assert "tiny request" not in calls
