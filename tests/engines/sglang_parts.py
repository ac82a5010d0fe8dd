"""SGLang 0.5.23's own parts, put together as its scheduler puts them for one request.

Everything here is SGLang's: ``ServerArgs`` parsed from a command line and published as the
scheduler process publishes it, the cache built by ``create_tree_cache`` (SGLang's selection
chain, ``--radix-cache-backend`` included) over a real ``ReqToTokenPool`` and
``TokenToKVPoolAllocator`` on the CPU, and real ``Req`` objects released through
``release_kv_cache``. What stands in for the scheduler is :func:`serve`: the match, lock,
allocation and row writes it does before a forward pass, with no model run (the KV contents
are never read, only the slots and the tree).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import release_kv_cache
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
from sglang.srt.runtime_context import publish
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import prepare_server_args

POOL_TOKENS = 65_536  # KV slots in the allocator
MAX_CONTEXT = 8_192  # tokens per request row
ROWS = 16  # concurrent request rows

# A model config SGLang's ServerArgs can read (it reads the config, never the weights here).
TINY_MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 32_000,
    "max_position_embeddings": MAX_CONTEXT,
    "torch_dtype": "float32",
}


def model_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(TINY_MODEL))
    return root


def publish_server_args(model: Path, *flags: str) -> Any:
    """``sglang serve --model-path MODEL --device cpu FLAGS...`` parsed by SGLang and
    published as the scheduler process publishes it."""
    args = prepare_server_args(["--model-path", str(model), "--device", "cpu", *flags])
    publish(args, role="scheduler")
    return args


@dataclass
class Engine:
    """A built cache and the pools it manages."""

    cache: Any
    rows: ReqToTokenPool
    slots: TokenToKVPoolAllocator
    served: int = 0
    paths: dict[str, list[Any]] = field(default_factory=dict)  # rid -> released path's nodes


def build_engine(
    server_args: Any, pool_tokens: int = POOL_TOKENS, tree_core: str | None = None
) -> Engine:
    """The cache ``create_tree_cache`` builds for these server args (the scheduler's call);
    ``tree_core``: ``CacheInitParams.tree_core_backend`` (default: SGLang's choice)."""
    rows = ReqToTokenPool(
        size=ROWS, max_context_len=MAX_CONTEXT, device="cpu", enable_memory_saver=False
    )
    slots = TokenToKVPoolAllocator(pool_tokens, torch.float16, "cpu", None, False)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=rows,
        token_to_kv_pool_allocator=slots,
        page_size=1,
        eviction_policy=server_args.radix_eviction_policy,
        tree_core_backend=tree_core,
    )
    context = TreeCacheBuildContext(
        server_args=server_args,
        params=params,
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        enable_hierarchical_cache=False,
        disable_radix_cache=False,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
    )
    return Engine(create_tree_cache(context), rows, slots)


def serve(
    engine: Engine,
    prompt: Sequence[int],
    output: Sequence[int],
    state: tuple[str, int] | None = None,
) -> tuple[Req, int]:
    """One request from admission to release; returns it and its cache hit in tokens.

    ``state``: ``(intent, turn)`` sent as the OpenAI API's ``custom_params``."""
    custom = None if state is None else {"kvcast_intent": state[0], "kvcast_turn": state[1]}
    engine.served += 1
    req = Req(
        f"r{engine.served}",
        "",
        array("q", prompt),
        SamplingParams(max_new_tokens=max(1, len(output)), custom_params=custom),
    )
    cache = engine.cache
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", prompt))))
    req.lock = cache.lock(match.last_device_node)
    hit = match.device_prefix_len
    prefix = cache.path_device_indices(match.last_device_node)[:hit].to(torch.int64)
    engine.rows.alloc([req])
    total = len(prompt) + len(output)
    new = engine.slots.alloc(total - hit)
    if new is None:
        cache.evict(EvictParams(num_tokens=total - hit - engine.slots.available_size()))
        new = engine.slots.alloc(total - hit)
    assert new is not None, "the pool is too small for this request"
    engine.rows.write((req.kv.req_pool_idx, slice(0, total)), torch.cat([prefix, new.long()]))
    req.kv.cache_protected_len = hit
    req.cached_tokens += hit  # as ScheduleBatch.prepare_for_extend counts a request's cache hit
    req.kv.kv_committed_len = req.kv.kv_allocated_len = total
    req.output_ids = array("q", output)
    req.finished_reason = FINISH_LENGTH(length=len(output))
    req.finished_len = len(output)
    release_kv_cache(req, cache, checkpoint=True)
    if not type(cache.tree_core).__name__.startswith("Rust"):  # whose nodes stay in Rust
        engine.paths[req.rid] = path_nodes(cache, req.last_node)
    return req, hit


def path_nodes(cache: Any, handle: Any) -> list[Any]:
    """The nodes from ``handle`` up to, not including, the root (Python tree core only)."""
    node = cache.tree_core.node_by_id(handle) if isinstance(handle, int) else handle
    nodes = []
    while node is not None and node.parent is not None:
        nodes.append(node)
        node = node.parent
    return nodes


def cached_tokens(engine: Engine, prompt: Sequence[int]) -> int:
    """How much of ``prompt`` the cache holds on the device now (a match without a lock)."""
    match = engine.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", prompt))))
    return match.device_prefix_len


def evict(engine: Engine, tokens: int) -> int:
    return engine.cache.evict(EvictParams(num_tokens=tokens)).num_tokens_evicted
