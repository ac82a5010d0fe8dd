"""Benchmark of the engine-side client: each figure against a baseline timed in the same run.

- IAC priority computations per second (``PriorityIndex.priority``) against a bare
  ``dict.get((intent, turn))`` over the same keys: the ratio says how close to pure
  dictionary work the priority is;
- time to rank 1,000 eviction candidates by IAC priority against ranking them by LRU time
  (a sort on one float, what an LRU engine does);
- the same under ``density``: from ``(intent, turn, age, size)`` tuples
  (``PriorityIndex.rank(..., policy="density")``), and from columns, each candidate's state
  curve resolved once per request as the adapters do
  (``PriorityIndex.rank_by_density``);
- kvcast's vLLM free queue: freeing 64-block requests tagged with their state, then taking
  them back, against the same queue untagged (which moves blocks step for step as vLLM's
  stock ``FreeKVCacheBlockQueue``). Against vLLM's own classes: ``engine_bench``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kvcast.exporters.kit.adapters.vllm import IACFreeBlockQueue
from kvcast.exporters.kit.index import PriorityIndex
from kvcast.lab.bench.timing import best_in_turn

INTENTS = 31  # the taxonomy's 30 plus unknown
TURNS = 32


def synthetic_table(intents: int = INTENTS, turns: int = TURNS, seed: int = 7) -> dict[str, Any]:
    """A full table (every state listed) with random statistics, SPEC section 5 shape."""
    rng = random.Random(seed)
    states = [
        {
            "intent": f"intent-{i:02d}",
            "turn": t,
            "p_continue": rng.random(),
            "median_reuse_s": rng.lognormvariate(4.6, 1.0),
            "mu": None,
            "sigma": None,
            "conversations": 100,
            "delay_samples": 50,
        }
        for i in range(intents)
        for t in range(1, turns + 1)
    ]
    defaults = {"p_continue": 0.5, "median_reuse_s": 150.0}
    return {"version": 1, "generated_at": 0.0, "window_conversations": 10_000,
            "defaults": defaults, "states": states}  # fmt: skip


def _best_of(repeats: int, run: Callable[[], None]) -> float:
    """Fastest of ``repeats`` timings of ``run``, seconds."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


@dataclass(frozen=True)
class ClientBenchResult:
    priorities_per_s: float
    dict_lookups_per_s: float
    rank_1000_s: float
    lru_rank_1000_s: float
    density_priorities_per_s: float
    density_rank_1000_s: float
    density_columns_rank_1000_s: float
    queue_ops_per_s: float
    lru_queue_ops_per_s: float

    @property
    def priority_ns(self) -> float:
        return 1e9 / self.priorities_per_s

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "priority_ns": self.priority_ns}

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(benchmark, figure, baseline, ratio) rows for the benchmark table."""
        return [
            (
                "IAC priority (engine client, 992 states)",
                f"{self.priorities_per_s / 1e6:.2f} M/s ({self.priority_ns:.0f} ns each)",
                f"{self.dict_lookups_per_s / 1e6:.2f} M/s (bare dict.get((intent, turn)))",
                f"{self.priorities_per_s / self.dict_lookups_per_s:.2f}",
            ),
            (
                "rank 1,000 eviction candidates (IAC)",
                f"{self.rank_1000_s * 1e6:.0f} µs",
                f"{self.lru_rank_1000_s * 1e6:.0f} µs (LRU: sort by access time)",
                f"{self.rank_1000_s / self.lru_rank_1000_s:.1f}x the LRU time",
            ),
            (
                "density priority (engine client, 992 states)",
                f"{self.density_priorities_per_s / 1e6:.2f} M/s",
                f"{self.dict_lookups_per_s / 1e6:.2f} M/s (bare dict.get((intent, turn)))",
                f"{self.density_priorities_per_s / self.dict_lookups_per_s:.2f}",
            ),
            (
                "rank 1,000 eviction candidates (density, from tuples)",
                f"{self.density_rank_1000_s * 1e6:.0f} µs",
                f"{self.lru_rank_1000_s * 1e6:.0f} µs (LRU: sort by access time)",
                f"{self.density_rank_1000_s / self.lru_rank_1000_s:.1f}x the LRU time",
            ),
            (
                "rank 1,000 eviction candidates (density, from columns)",
                f"{self.density_columns_rank_1000_s * 1e6:.0f} µs",
                f"{self.lru_rank_1000_s * 1e6:.0f} µs (LRU: sort by access time)",
                f"{self.density_columns_rank_1000_s / self.lru_rank_1000_s:.1f}x the LRU time",
            ),
            (
                "vLLM free queue, free (tagged) + take, 64-block requests",
                f"{self.queue_ops_per_s / 1e6:.2f} M blocks/s (IAC, one list a state)",
                f"{self.lru_queue_ops_per_s / 1e6:.2f} M blocks/s (untagged: vLLM's order)",
                f"{self.queue_ops_per_s / self.lru_queue_ops_per_s:.2f}",
            ),
        ]


class _Block:
    """The fields of vLLM's ``KVCacheBlock`` that the free queue uses."""

    __slots__ = ("block_id", "next_free_block", "prev_free_block")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.prev_free_block: _Block | None = None
        self.next_free_block: _Block | None = None


REQUEST_BLOCKS = 64


def run_client_bench(calls: int = 200_000, repeats: int = 5, seed: int = 11) -> ClientBenchResult:
    """Time the client's hot paths (a few seconds with the defaults)."""
    rng = random.Random(seed)
    index = PriorityIndex(synthetic_table())
    nodes = [
        (f"intent-{rng.randrange(INTENTS):02d}", rng.randint(1, TURNS),
         rng.expovariate(1 / 120), rng.randint(16, 8192))
        for _ in range(1024)
    ]  # fmt: skip
    work = (nodes * (calls // len(nodes) + 1))[:calls]
    lookup = index.states()

    def priorities() -> None:
        priority = index.priority
        for intent, turn, age, size in work:
            priority(intent, turn, age, size)

    def lookups() -> None:
        get = lookup.get
        for intent, turn, _age, _size in work:
            get((intent, turn))

    candidates = nodes[:1000]
    access_times = [-age for _i, _t, age, _s in candidates]

    def rank() -> None:
        index.rank(candidates)

    def density_priorities() -> None:
        priority = index.priority
        for intent, turn, age, size in work:
            priority(intent, turn, age, size, "density")

    def density_rank() -> None:
        index.rank(candidates, "density")

    density_rank()  # the states' curves are built on first use, once per table
    curves = [index.curve(intent, turn).values for intent, turn, _a, _s in candidates]
    ages = [age for _i, _t, age, _s in candidates]

    def density_columns_rank() -> None:
        index.rank_by_density(curves, ages)

    def lru_rank() -> None:
        sorted(range(len(access_times)), key=access_times.__getitem__)

    blocks = [_Block(i) for i in range(4096)]
    requests = [blocks[k : k + REQUEST_BLOCKS] for k in range(0, len(blocks), REQUEST_BLOCKS)]
    states = [(intent, turn) for intent, turn, _a, _s in nodes[: len(requests)]]

    tagged_queue = IACFreeBlockQueue([], table=index)  # its state lists outlive a run, as in
    plain_queue = IACFreeBlockQueue([], table=index)  # an engine (made once per state)

    def queue_ops() -> None:
        queue = tagged_queue
        for request, (intent, turn) in zip(requests, states, strict=True):
            queue.begin_tagging(intent, turn)
            queue.append_n(request)
            queue.end_tagging()
        for _ in requests:
            queue.popleft_n(REQUEST_BLOCKS)

    def lru_queue_ops() -> None:
        queue = plain_queue
        for request in requests:
            queue.append_n(request)
        for _ in requests:
            queue.popleft_n(REQUEST_BLOCKS)

    ranks = best_in_turn(repeats * 40, {"iac": rank, "lru": lru_rank, "tuples": density_rank,
                                         "columns": density_columns_rank})  # fmt: skip
    return ClientBenchResult(
        priorities_per_s=calls / _best_of(repeats, priorities),
        dict_lookups_per_s=calls / _best_of(repeats, lookups),
        rank_1000_s=ranks["iac"],
        lru_rank_1000_s=ranks["lru"],
        density_priorities_per_s=calls / _best_of(repeats, density_priorities),
        density_rank_1000_s=ranks["tuples"],
        density_columns_rank_1000_s=ranks["columns"],
        queue_ops_per_s=len(blocks) / _best_of(repeats, queue_ops),
        lru_queue_ops_per_s=len(blocks) / _best_of(repeats, lru_queue_ops),
    )
