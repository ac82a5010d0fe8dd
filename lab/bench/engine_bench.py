"""kvcast inside vLLM's own code paths, against vLLM's stock queue in the same run.

Run it with the engines' venv (``scripts/engine_venv.sh``)::

    .venv-vllm/bin/python -m kvcast.lab.bench.engine_bench

A real ``vllm.v1.core.block_pool.BlockPool`` of 100,000 blocks (16 tokens each) hands out
64-block requests (``get_new_blocks``) until it is full, the blocks get hashes (as vLLM's
``cache_full_blocks`` gives them), and the requests are freed (``free_blocks``, tail first),
three rounds; from the second round on ``get_new_blocks`` evicts cached blocks. Three queues:
vLLM's ``FreeKVCacheBlockQueue``; kvcast's with nothing tagged; kvcast's with every request
tagged by one of 240 table states (freed inside ``begin_tagging`` / ``end_tagging``, as the
installed ``KVCacheManager.free`` does), ranked by IAC (``tagged``) or by density
(``density``). Figures: nanoseconds per block, best of ``repeats``.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

from kvcast.exporters.kit.adapters.request_state import FixedTable
from kvcast.exporters.kit.adapters.vllm import replace_queue
from kvcast.exporters.kit.index import PriorityIndex

KINDS = ("stock", "untagged", "tagged", "density")  # density: tagged, policy density


@dataclass(frozen=True)
class EngineBenchResult:
    """Nanoseconds per block of ``get_new_blocks`` and ``free_blocks``, by queue kind."""

    get_ns: dict[str, float]
    free_ns: dict[str, float]
    blocks: int
    request_blocks: int

    def rows(self) -> list[tuple[str, str, str, str]]:
        rows = []
        for kind in ("untagged", "tagged", "density"):
            for name, figures in (("get_new_blocks", self.get_ns), ("free_blocks", self.free_ns)):
                rows.append(
                    (
                        f"vLLM BlockPool.{name}, kvcast {kind}",
                        f"{figures[kind]:.0f} ns/block",
                        f"{figures['stock']:.0f} ns/block (stock queue)",
                        f"{figures[kind] / figures['stock']:.2f}x",
                    )
                )
        return rows

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def random_table(states: int, seed: int, medians_s: tuple[float, ...] = (60.0,)) -> PriorityIndex:
    """``states`` table states (``states // 8`` intents x turns 1-8) with random
    ``P(continue)`` and a median reuse delay (s) drawn from ``medians_s``: the engine
    benchmarks' table."""
    rng = random.Random(seed)

    def median() -> float:
        return medians_s[0] if len(medians_s) == 1 else rng.choice(medians_s)

    rows = [
        {"intent": f"intent-{k}", "turn": turn, "p_continue": rng.random(),
         "median_reuse_s": median()}
        for k in range(states // 8) for turn in range(1, 9)
    ]  # fmt: skip
    return PriorityIndex({"version": 1, "states": rows})


def _one_run(kind: str, blocks: int, request_blocks: int, index: PriorityIndex, seed: int):
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id

    pool = BlockPool(blocks, enable_caching=True, hash_block_size=16)
    table = FixedTable(index, "density") if kind == "density" else index
    queue = pool.free_block_queue if kind == "stock" else replace_queue(pool, table)
    rng = random.Random(seed)
    intents = sorted({intent for intent, _ in index.states()})
    requests = (blocks - 1) // request_blocks
    get_s = free_s = 0.0
    serial = 0
    for _ in range(3):
        held = []
        start = time.perf_counter()
        for _ in range(requests):
            held.append(pool.get_new_blocks(request_blocks))
        get_s += time.perf_counter() - start
        for request in held:
            for block in request:
                serial += 1
                key = make_block_hash_with_group_id(BlockHash(serial.to_bytes(8, "little")), 0)
                block.set_block_hash(key)
                pool.cached_block_hash_to_block.insert(key, block)
                pool.cached_block_hashes_by_block[block.block_id] = {key}
        states = [(rng.choice(intents), rng.randrange(1, 9)) for _ in held]
        start = time.perf_counter()
        if kind in ("tagged", "density"):
            for request, (intent, turn) in zip(held, states, strict=True):
                queue.begin_tagging(intent, turn)
                pool.free_blocks(reversed(request))
                queue.end_tagging()
        else:
            for request, _state in zip(held, states, strict=True):
                pool.free_blocks(reversed(request))
        free_s += time.perf_counter() - start
    per_block = 1e9 / (3 * requests * request_blocks)
    return get_s * per_block, free_s * per_block


def run_engine_bench(
    blocks: int = 100_000, request_blocks: int = 64, repeats: int = 3, seed: int = 5
) -> EngineBenchResult:
    index = random_table(240, seed)
    get_ns = {kind: float("inf") for kind in KINDS}
    free_ns = dict(get_ns)
    gc_was = gc.isenabled()
    gc.disable()  # vLLM's scheduler loop does not collect mid-step either
    try:
        for _ in range(repeats):
            for kind in KINDS:  # interleaved, so that drift hits every kind alike
                got, freed = _one_run(kind, blocks, request_blocks, index, seed)
                get_ns[kind], free_ns[kind] = min(get_ns[kind], got), min(free_ns[kind], freed)
    finally:
        if gc_was:
            gc.enable()
    return EngineBenchResult(get_ns, free_ns, blocks, request_blocks)


def print_figures(result: Any, heading: str, as_json: bool) -> None:
    """An engine benchmark's output: one JSON object (what ``kvcast bench --suite engines``
    reads), or the heading and one row a line."""
    if as_json:
        print(json.dumps({"rows": result.rows(), **result.to_dict()}))
        return
    print(heading)
    for row in result.rows():
        print(" | ".join(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=100_000)
    parser.add_argument("--request-blocks", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="one JSON object of figures")
    args = parser.parse_args()
    result = run_engine_bench(args.blocks, args.request_blocks, args.repeats)
    heading = f"{result.blocks:,} blocks, {result.request_blocks}-block requests, best of "
    print_figures(result, heading + str(args.repeats), args.json)


if __name__ == "__main__":
    main()
