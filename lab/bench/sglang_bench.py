"""kvcast inside SGLang's own eviction, against SGLang's LRU strategy in the same run.

Run it with SGLang's venv (``scripts/engine_venv.sh sglang``)::

    .venv-sglang/bin/python -m kvcast.lab.bench.sglang_bench

SGLang's default cache (``UnifiedRadixCache``, built by ``create_unified_radix_cache`` over a
real ``TokenToKVPoolAllocator`` on the CPU) holds ``leaves`` distinct cached sequences of
``leaf_tokens`` tokens each (2,000 x 96 = 192,000 tokens), inserted through ``insert``; one
``evict`` call then frees all of them. Timed: that call. Kinds, interleaved:

- ``lru``: SGLang's ``LRUStrategy`` on the Python tree core (the tree kvcast runs on: the
  baseline of the ratio);
- ``untagged``: kvcast's strategy installed, nothing tagged;
- ``tagged``: kvcast's strategy, every sequence tagged with one of 240 table states;
- ``density``: the same, the strategy ranking by density (``policy="density"``);
- ``rust lru``: SGLang's default build, the Rust tree core and its native LRU (for scale: the
  cost of leaving the Rust tree for the Python one, whatever the strategy).

Figures: milliseconds per ``evict`` call, best of ``repeats`` (12: the run-to-run noise of one
call is several milliseconds).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from array import array
from dataclasses import asdict, dataclass
from typing import Any

from kvcast.exporters.kit.adapters.request_state import FixedTable
from kvcast.exporters.kit.adapters.sglang import install
from kvcast.exporters.kit.index import PriorityIndex
from kvcast.lab.bench.engine_bench import print_figures, random_table

KINDS = ("lru", "untagged", "tagged", "density", "rust lru")


@dataclass(frozen=True)
class SGLangBenchResult:
    """Milliseconds per ``evict`` of every leaf, by kind."""

    evict_ms: dict[str, float]
    leaves: int
    leaf_tokens: int

    def rows(self) -> list[tuple[str, str, str, str]]:
        name = f"SGLang UnifiedRadixCache.evict, {self.leaves:,} leaves x {self.leaf_tokens} tokens"
        lru, rust = self.evict_ms["lru"], self.evict_ms["rust lru"]
        rows = [
            (
                f"{name}, kvcast {kind}",
                f"{self.evict_ms[kind]:.1f} ms",
                f"{lru:.1f} ms (LRUStrategy, Python tree core)",
                f"{self.evict_ms[kind] / lru:.2f}x",
            )
            for kind in ("untagged", "tagged", "density")
        ]
        rows.append(
            (
                f"{name}, kvcast tagged",
                f"{self.evict_ms['tagged']:.1f} ms",
                f"{rust:.1f} ms (SGLang's default: Rust tree core, LRU)",
                f"{self.evict_ms['tagged'] / rust:.2f}x",
            )
        )
        return rows

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cache(kind: str, tokens: int) -> Any:
    import torch
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    slots = TokenToKVPoolAllocator(tokens + 16, torch.float16, "cpu", None, False)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=slots,
        page_size=1,
        tree_core_backend="rust" if kind == "rust lru" else "python",
    )
    params.tree_components = (ComponentType.FULL,)
    return UnifiedRadixCache(params), slots


def _one_run(kind: str, leaves: int, leaf_tokens: int, index: PriorityIndex, seed: int) -> float:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    cache, slots = _cache(kind, leaves * leaf_tokens)
    table = FixedTable(index, "density") if kind == "density" else index
    strategy = install(cache, table) if kind in ("untagged", "tagged", "density") else None
    rng = random.Random(seed)
    intents = sorted({intent for intent, _ in index.states()})
    now = time.monotonic()
    for leaf in range(leaves):
        key = RadixKey(array("q", range(leaf * leaf_tokens, (leaf + 1) * leaf_tokens)))
        result = cache.insert(InsertParams(key=key, value=slots.alloc(leaf_tokens).long()))
        if kind in ("tagged", "density"):
            node = cache.tree_core.node_by_id(result.last_device_node)
            age_s = rng.uniform(0.0, 900.0)
            strategy.tag(node, rng.choice(intents), rng.randrange(1, 9), now - age_s)
    start = time.perf_counter()
    evicted = cache.evict(EvictParams(num_tokens=leaves * leaf_tokens)).num_tokens_evicted
    elapsed = time.perf_counter() - start
    if evicted != leaves * leaf_tokens:
        raise RuntimeError(f"{kind}: evicted {evicted} of {leaves * leaf_tokens} tokens")
    return elapsed * 1e3


def run_sglang_bench(
    leaves: int = 2_000, leaf_tokens: int = 96, repeats: int = 12, seed: int = 5
) -> SGLangBenchResult:
    index = random_table(240, seed, medians_s=(30.0, 60.0, 600.0))
    best = {kind: float("inf") for kind in KINDS}
    gc_was = gc.isenabled()
    gc.disable()  # the scheduler's step does not collect mid-eviction either
    try:
        for repeat in range(repeats):
            # Interleaved, each repeat in another order: drift and position hit every kind alike.
            order = KINDS[repeat % len(KINDS) :] + KINDS[: repeat % len(KINDS)]
            for kind in order:
                best[kind] = min(best[kind], _one_run(kind, leaves, leaf_tokens, index, seed))
                gc.collect()
    finally:
        if gc_was:
            gc.enable()
    return SGLangBenchResult(best, leaves, leaf_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--leaves", type=int, default=2_000)
    parser.add_argument("--leaf-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--json", action="store_true", help="one JSON object of figures")
    args = parser.parse_args()
    result = run_sglang_bench(args.leaves, args.leaf_tokens, args.repeats)
    heading = f"{result.leaves:,} leaves x {result.leaf_tokens} tokens, best of {args.repeats}"
    print_figures(result, heading, args.json)


if __name__ == "__main__":
    main()
