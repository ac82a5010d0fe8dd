"""Settings of the statistics engine (SPEC section 3), validated once, frozen."""

from __future__ import annotations

from dataclasses import dataclass

from kvcast.stats.declarations import Choice, Number, declared_settings, setting

# How a turn's (intent, turn) state takes its intent (``state_intent``; docs/spec.md section 3).
STATE_INTENT_MODES = ("auto", "conversation", "turn")


@dataclass(frozen=True)
class StatsConfig:
    """How events become statistics. Times are seconds of event time; sizes are tokens/blocks.

    - ``block_size``: tokens per KV block (R = ceil(input_tokens / block_size)).
    - ``completion_timeout_s``: a conversation completes when the watermark passes its last
      turn's timestamp plus this.
    - ``allowed_lateness_s``: watermark = newest event time minus this; older events are late.
    - ``max_future_skew_s``: an event more than this ahead of the later of its partition's
      newest event time and the wall clock is ``future`` (rejected).
    - ``max_turn``: turns above it share the state ``max_turn``.
    - ``window_conversations`` / ``window_max_age_s``: the window holds the newest completed
      conversations, at least this many, but none older than ``window_max_age_s``.
    - ``bucket_s``: width of the event-time buckets the window is kept in (its expiry grain).
    - ``rate_window_s``: span of event time for lambda0 and the observed hit ratio (whole s).
    - ``min_delay_samples``: below this many delays a state's median reuse delay is the default.
    - ``max_open_conversations``: per tracker (per partition); events that would open more are
      shed with the reason ``open_limit`` (memory: about 0.69 GiB per million, 3 turns each).
    - ``shared_index_blocks``: block ids the shared-prefix index remembers per tracker (about
      100 bytes each); 0 turns the shared-prefix statistics off.
    - ``shared_index_dense_tokens``: the shared-prefix index takes every block id of the first
      2 x this many tokens of a request (at least 32 blocks), then fewer and fewer (see
      ``kvcast.stats.shared_prefix``): shared prefixes are exact there, within 1/(4 x the
      dense blocks) beyond.
    - ``state_intent``: which intent a turn's state (table row, delay fit, continuation) is
      filed under: ``conversation``, the conversation's last intent (IAC's rule, SPEC section
      3); ``turn``, the turn's own; ``auto``, the turn's own for the labels that describe one
      response (the agent endings, ``agent_tool_call`` ...), the conversation's for the rest.
      The forecast's classes keep the conversation's intent in every mode.
    """

    block_size: int = setting(16, "--block-size", Number(int, min=1), "Tokens per KV block.")
    completion_timeout_s: float = setting(
        1800.0, "--completion-timeout", Number(float, min=0, min_open=True),
        "Seconds of event time after a conversation's last turn before it counts as completed.",
    )  # fmt: skip
    allowed_lateness_s: float = setting(
        60.0, "--allowed-lateness", Number(float, min=0),
        "Seconds an event may arrive behind the newest event time and still count.",
    )  # fmt: skip
    max_future_skew_s: float = setting(
        3600.0, "--max-future-skew", Number(float, min=0, min_open=True),
        "Seconds an event's time may be ahead of the later of its partition's newest event time"
        " and the clock; further ahead it is rejected as future.",
    )  # fmt: skip
    max_turn: int = setting(
        32, "--max-turn", Number(int, min=1), "Turns above this share its state."
    )
    window_conversations: int = setting(
        10_000, "--window-conversations", Number(int, min=1),
        "Completed conversations the statistics window holds at least.",
    )  # fmt: skip
    window_max_age_s: float = setting(
        86_400.0, "--window-max-age", Number(float, min=0, min_open=True),
        "Oldest completed conversation (seconds of event time) the window may hold.",
    )  # fmt: skip
    bucket_s: float = 60.0
    rate_window_s: int = setting(
        600, "--rate-window", Number(int, min=1),
        "Seconds of event time over which the conversation arrival rate is measured.",
    )  # fmt: skip
    min_delay_samples: int = setting(
        2, "--min-delay-samples", Number(int, min=1),
        "Delays a state needs before its own median reuse delay replaces the default.",
    )  # fmt: skip
    default_p_continue: float = 0.5
    default_median_reuse_s: float = 150.0
    max_open_conversations: int = setting(
        1_000_000, "--max-open-conversations", Number(int, min=1),
        "Open conversations kept per partition; events that would open more are shed (counted).",
    )  # fmt: skip
    shared_index_blocks: int = setting(
        1_000_000, "--shared-index-blocks", Number(int, min=0),
        "Block ids (of events with block_hashes) the shared-prefix index keeps per partition,"
        " about 100 bytes each; 0 turns the shared-prefix statistics off.",
    )  # fmt: skip
    shared_index_dense_tokens: int = setting(
        256, "--shared-index-dense-tokens", Number(int, min=1),
        "The shared-prefix index takes every block of a request's first 2 x this many tokens,"
        " then fewer: shared prefixes are exact there, within 1/(4 x as many blocks) beyond.",
    )  # fmt: skip
    state_intent: str = setting(
        "auto", "--state-intent", Choice(STATE_INTENT_MODES),
        "Which intent a turn's state is filed under: conversation (its last turn's, IAC's"
        " rule), turn (the turn's own), auto (the turn's own for the agent endings such as"
        " agent_tool_call, the conversation's for the rest).",
    )  # fmt: skip

    def __post_init__(self) -> None:
        # A declared field is checked by its declaration (the flag's own bounds); the three
        # without a flag by hand.
        problems = [
            problem
            for found, declared in declared_settings(StatsConfig)
            for problem in declared.problems(found.name, getattr(self, found.name), False)
        ]
        if not self.bucket_s > 0:
            problems.append(f"bucket_s must be > 0, got {self.bucket_s}")
        if not 0 <= self.default_p_continue <= 1:
            problems.append(f"default_p_continue must be in [0, 1], got {self.default_p_continue}")
        if not self.default_median_reuse_s > 0:
            problems.append(
                f"default_median_reuse_s must be > 0, got {self.default_median_reuse_s}"
            )
        if problems:
            raise ValueError("; ".join(problems))
