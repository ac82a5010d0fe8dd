"""Real vLLM 0.33.0 objects for the tests: a ``KVCacheManager`` of one full-attention group,
requests with block hashes, and a clock the tests move (seconds)."""

from __future__ import annotations

from typing import Any

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

BLOCK_TOKENS = 16
init_none_hash(sha256)
_HASHER = get_request_block_hasher(BLOCK_TOKENS, sha256)


class Clock:
    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def kv_cache_manager(num_blocks: int) -> KVCacheManager:
    """vLLM's manager over ``num_blocks`` blocks (block 0 becomes the null block)."""
    spec = FullAttentionSpec(
        block_size=BLOCK_TOKENS, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
    )
    return KVCacheManager(
        config,
        max_model_len=1 << 16,
        scheduler_block_size=BLOCK_TOKENS,
        hash_block_size=BLOCK_TOKENS,
        enable_caching=True,
    )


def request(
    request_id: str, tokens: list[int], intent: str | None = None, turn: int = 1
) -> Request:
    """A request whose ``vllm_xargs`` carry kvcast's state when ``intent`` is given."""
    extra: dict[str, Any] | None = (
        {"kvcast_intent": intent, "kvcast_turn": turn} if intent is not None else None
    )
    params = SamplingParams(max_tokens=1, extra_args=extra)
    return Request(request_id, tokens, params, None, block_hasher=_HASHER)


def serve(manager: KVCacheManager, req: Request) -> tuple[list[int], int] | None:
    """Look the prompt up, allocate it, free it: (its block ids, its cached tokens), or None
    when the pool cannot hold it."""
    computed, cached_tokens, *_ = manager.get_computed_blocks(req)
    blocks = manager.allocate_slots(
        req, len(req.all_token_ids) - cached_tokens, cached_tokens, computed
    )
    if blocks is None:
        return None
    ids = list(blocks.get_block_ids()[0])
    manager.free(req)
    return ids, cached_tokens


def cached_tokens(manager: KVCacheManager, tokens: list[int]) -> int:
    """How many tokens of ``tokens`` the pool would serve from cache now (nothing changed).

    The probe asks for one token more: vLLM never serves a prompt's last token from cache."""
    _, hit, *_ = manager.get_computed_blocks(request("probe", [*tokens, -1]))
    return hit


def free_ids(manager: KVCacheManager) -> list[int]:
    return [b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()]
