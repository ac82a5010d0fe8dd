"""The embedded default's event source: a generated workload, replayed in accelerated time."""

from __future__ import annotations

from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.sources import ReplaySource
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset


def embedded_source(
    conversations: int, speedup: float, capacity_blocks: int, block_size: int, seed: int = 7
) -> ReplaySource:
    """The embedded default: a generated intent-mixed workload, replayed in accelerated time.

    ``cached_tokens`` come from a whole-content LRU of ``capacity_blocks`` blocks, so the
    observed hit ratio has something honest to be compared with.
    """
    trace = generate(
        preset("mixed"),
        lambda0=2.0,
        conversations=conversations,
        seed=seed,
        block_size=block_size,
        prompts=True,
        cached_capacity_blocks=capacity_blocks,
    )
    lines = [line.rstrip(b"\n") for line in trace.jsonl_lines()]
    return ReplaySource(lines, partition="embedded:0", speedup=speedup)


def demo_source(settings: DaemonSettings) -> ReplaySource:
    """The embedded default's source for ``settings`` (sample size, speed-up, capacity)."""
    return embedded_source(
        settings.sample_conversations,
        settings.speedup,
        settings.capacity_blocks,
        settings.stats.block_size,
    )
