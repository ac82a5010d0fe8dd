"""The replay engine in C (``_replay.c`` here): a finite log's statistics, no Python per event.

It applies the rules of :class:`~kvcast.stats.engine.StatsEngine` (tracker, window, arrival
counters) and of the daemon's default labeller to raw JSON lines, in one native loop per batch.
Every line is validated by the contract's own code: the loop decodes it as
:func:`~kvcast.stats.events.parse_event` does (msgspec, into :data:`EventFields`: the fields
and constraints of ``Event``), repeats ``parse_event``'s two checks on the result, and hands
anything else to ``parse_event`` itself. Its result is handed over as a finished
``StatsEngine`` and must equal, bit for bit, what the Python engine gives for the same lines
(``tests/stats/native/test_replay.py`` checks it on every generator preset and on hostile
streams). The Python engine stays the reference, and the daemon's engine, because the daemon
checkpoints its open conversations and this engine keeps them in C.

The extension is optional (a plain install without a C compiler skips it): callers ask
:func:`native_available` and use the Python engine otherwise.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from types import ModuleType

import msgspec

from kvcast.stats.arrivals import ArrivalStats, SecondCounters
from kvcast.stats.config import StatsConfig
from kvcast.stats.conversations import shared_index_for
from kvcast.stats.engine import EventCounters, Rejection, StatsEngine
from kvcast.stats.events import MAX_EVENT_BYTES, Event, EventRejected, parse_event
from kvcast.stats.taxonomy import UNKNOWN
from kvcast.stats.taxonomy import label_map as taxonomy_label_map
from kvcast.stats.window import Bucket, DelaySample, MomentSums, StateSums, own_intent_rule


def _load() -> ModuleType | None:
    try:
        from kvcast.stats.native import _replay
    except ImportError:
        return None
    return _replay


_NATIVE = _load()


def _fields_only(struct: type[msgspec.Struct]) -> type[msgspec.Struct]:
    """A struct type with ``struct``'s fields (types, constraints, defaults) and decoding
    options, but none of its methods: decoding into it validates exactly as decoding into
    ``struct`` does, without a call of ``struct.__post_init__`` per event."""
    config = struct.__struct_config__
    fields = msgspec.structs.fields(struct)
    return msgspec.defstruct(
        f"{struct.__name__}Fields",
        [(f.name, f.type) if f.required else (f.name, f.type, f.default) for f in fields],
        module=__name__,
        rename={f.name: f.encode_name for f in fields},
        tag_field=config.tag_field,
        tag=config.tag,
        forbid_unknown_fields=config.forbid_unknown_fields,
        array_like=config.array_like,
        gc=config.gc,
    )


# What the native loop decodes into: Event without __post_init__, which only fills the default
# request id (the loop builds that one itself, only for events that leave it out).
EventFields = _fields_only(Event)
_decode_fields = msgspec.json.Decoder(EventFields).decode


class ReplayUnsupported(Exception):
    """The input holds a value the native engine cannot represent exactly (a timestamp of
    2**52 s or more); replay it with the Python engine instead."""


def native_available() -> bool:
    """Whether the C extension was built and imports."""
    return _NATIVE is not None


class NativeReplay:
    """Raw event lines in, a finished :class:`StatsEngine` out (see the module docstring)."""

    def __init__(
        self,
        config: StatsConfig,
        *,
        label_map: Mapping[str, str] | None = None,
        clock_s: float | None = None,
    ) -> None:
        """``label_map``: producer label -> state label, the rest folded into unknown (default:
        the 30-category taxonomy's, :func:`~kvcast.stats.taxonomy.label_map`). ``clock_s``:
        wall-clock time (s) the ``future`` bound counts from (default: now)."""
        if _NATIVE is None:
            raise RuntimeError(
                "the native replay engine (kvcast.stats.native._replay) is not built"
            )
        self._config = config
        self._core = _NATIVE.ReplayCore(
            block_size=config.block_size,
            completion_timeout_s=config.completion_timeout_s,
            allowed_lateness_s=config.allowed_lateness_s,
            max_future_skew_s=config.max_future_skew_s,
            clock_s=time.time() if clock_s is None else clock_s,
            max_turn=config.max_turn,
            window_conversations=config.window_conversations,
            window_max_age_s=config.window_max_age_s,
            bucket_s=config.bucket_s,
            rate_window_s=config.rate_window_s,
            max_open_conversations=config.max_open_conversations,
            label_map=dict(label_map if label_map is not None else taxonomy_label_map()),
            unknown_label=UNKNOWN,
            parse=parse_event,
            decode=_decode_fields,
            decode_type=EventFields,
            max_event_bytes=MAX_EVENT_BYTES,
            rejected=EventRejected,
            event_type=Event,
            delay_type=DelaySample,
            own_intent=own_intent_rule(config.state_intent),
            shared_index=shared_index_for(config) if config.shared_index_blocks else None,
        )

    def offer_lines(self, lines: Iterable[bytes]) -> int:
        """Parse, label and apply each line in order; return how many were taken.

        Raises :class:`ReplayUnsupported` (with the lines before it applied) where the Python
        engine must take over from the start.
        """
        try:
            return self._core.offer_lines(lines)
        except _NATIVE.ReplayUnsupported as exc:  # type: ignore[union-attr]
            raise ReplayUnsupported(str(exc)) from None

    def finish(self) -> None:
        """End of the input: complete every open conversation."""
        self._core.finish()

    @property
    def processed(self) -> int:
        return self._core.processed

    @property
    def duplicates(self) -> int:
        return self._core.duplicates

    @property
    def rejected_total(self) -> int:
        return self._core.rejected_total

    @property
    def last_rejection(self) -> EventRejected | None:
        return self._core.last_rejection

    def labels(self) -> tuple[set[str], int]:
        """The producer labels kept, and how many events had theirs folded into unknown
        (reads the whole state, as :meth:`to_engine` does)."""
        state = self._core.export()
        return set(state["labels"]), state["folded"]

    def to_engine(self) -> StatsEngine:
        """The statistics so far as a :class:`StatsEngine` (after :meth:`finish`: all of them).

        Open conversations stay in C; the engine returned reads as if its input had ended.
        """
        state = self._core.export()
        buckets = {
            index: Bucket(
                conversations,
                {(intent, turn): StateSums(reached, continued)
                 for intent, turn, reached, continued in states},
                {intent: MomentSums(*sums) for intent, *sums in moments},
                delays,
                shared_gaps,
            )
            for index, conversations, states, moments, delays, shared_gaps in state["buckets"]
        }  # fmt: skip
        seconds, first_start, newest_start, start_count = state["arrivals"]
        arrivals = ArrivalStats(
            self._config.rate_window_s,
            {second: SecondCounters(*counts) for second, *counts in seconds},
            first_start,
            newest_start,
            start_count,
        )
        counters = EventCounters(
            processed=state["processed"],
            duplicates=state["duplicates"],
            rejected=Counter(state["rejected"]),
        )
        engine = StatsEngine.finished(
            self._config,
            buckets=buckets,
            arrivals=arrivals,
            counters=counters,
            newest_ts=state["newest_ts"],
        )
        engine.rejections = [Rejection(*kept) for kept in self._core.rejections]
        return engine
