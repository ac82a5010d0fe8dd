"""Settings of the statistics engine (SPEC section 3), validated once, frozen."""

from __future__ import annotations

from dataclasses import dataclass


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
    """

    block_size: int = 16
    completion_timeout_s: float = 1800.0
    allowed_lateness_s: float = 60.0
    max_future_skew_s: float = 3600.0
    max_turn: int = 32
    window_conversations: int = 10_000
    window_max_age_s: float = 86_400.0
    bucket_s: float = 60.0
    rate_window_s: int = 600
    min_delay_samples: int = 2
    default_p_continue: float = 0.5
    default_median_reuse_s: float = 150.0
    max_open_conversations: int = 1_000_000
    shared_index_blocks: int = 1_000_000
    shared_index_dense_tokens: int = 256

    def __post_init__(self) -> None:
        problems = []
        if self.block_size < 1:
            problems.append(f"block_size must be >= 1 token, got {self.block_size}")
        if not self.completion_timeout_s > 0:
            problems.append(f"completion_timeout_s must be > 0, got {self.completion_timeout_s}")
        if not self.allowed_lateness_s >= 0:
            problems.append(f"allowed_lateness_s must be >= 0, got {self.allowed_lateness_s}")
        if not self.max_future_skew_s > 0:
            problems.append(f"max_future_skew_s must be > 0, got {self.max_future_skew_s}")
        if self.max_turn < 1:
            problems.append(f"max_turn must be >= 1, got {self.max_turn}")
        if self.window_conversations < 1:
            problems.append(f"window_conversations must be >= 1, got {self.window_conversations}")
        if not self.window_max_age_s > 0:
            problems.append(f"window_max_age_s must be > 0, got {self.window_max_age_s}")
        if not self.bucket_s > 0:
            problems.append(f"bucket_s must be > 0, got {self.bucket_s}")
        if self.rate_window_s < 1:
            problems.append(f"rate_window_s must be >= 1 s, got {self.rate_window_s}")
        if self.min_delay_samples < 1:
            problems.append(f"min_delay_samples must be >= 1, got {self.min_delay_samples}")
        if not 0 <= self.default_p_continue <= 1:
            problems.append(f"default_p_continue must be in [0, 1], got {self.default_p_continue}")
        if self.max_open_conversations < 1:
            problems.append(
                f"max_open_conversations must be >= 1, got {self.max_open_conversations}"
            )
        if self.shared_index_dense_tokens < 1:
            problems.append(
                f"shared_index_dense_tokens must be >= 1, got {self.shared_index_dense_tokens}"
            )
        if self.shared_index_blocks < 0:
            problems.append(f"shared_index_blocks must be >= 0, got {self.shared_index_blocks}")
        if not self.default_median_reuse_s > 0:
            problems.append(
                f"default_median_reuse_s must be > 0, got {self.default_median_reuse_s}"
            )
        if problems:
            raise ValueError("; ".join(problems))
