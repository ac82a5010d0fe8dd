"""Entry points that engines load by themselves: kvcast installed with no edit of the engine.

``pyproject.toml`` names :func:`register_vllm` in ``vllm.general_plugins`` (vLLM calls it in
each of its processes before it builds a block pool) and :func:`register_sglang` in
``sglang.srt.plugins`` (SGLang's ``load_plugins()`` calls it in each of its processes before
the scheduler builds its cache). This module imports only the engine-side client and adapters
(standard library only) and, when called, the engine itself.
"""

from __future__ import annotations

import os
from typing import Any

from kvcast.exporters.kit.adapters import sglang
from kvcast.exporters.kit.adapters.vllm import IACFreeBlockQueue, marking_lookup, tagging_free
from kvcast.exporters.kit.client import TableClient

__all__ = ["POLICY_ENV", "TABLE_ENV", "register_sglang", "register_vllm"]

TABLE_ENV = "KVCAST_TABLE"  # the table's URL: redis://HOST:PORT, http://HOST:9400, a file path
POLICY_ENV = "KVCAST_POLICY"  # iac (default) or density: what the engine ranks by


def _client(url: str) -> TableClient:
    return TableClient(url, policy=os.environ.get(POLICY_ENV) or "iac").start()


def register_vllm() -> None:
    """With ``KVCAST_TABLE`` set: every block pool this vLLM process builds gets an
    :class:`IACFreeBlockQueue` bound to a ``TableClient`` of that URL (refreshed in the
    background; the first fetch waits at most its 2 s timeout), ``KVCacheManager.free``
    tags what a request frees with its state, and ``get_computed_blocks`` marks what a turn-1
    request finds cached as shared. Without it, nothing changes."""
    url = os.environ.get(TABLE_ENV)
    if not url:
        return
    from vllm.v1.core import block_pool, kv_cache_manager

    current = block_pool.FreeKVCacheBlockQueue
    if isinstance(current, type) and issubclass(current, IACFreeBlockQueue):
        return  # registered already in this process
    client = _client(url)
    block_pool.FreeKVCacheBlockQueue = IACFreeBlockQueue.bound(client)
    manager = kv_cache_manager.KVCacheManager
    manager.free = tagging_free(manager.free)
    manager.get_computed_blocks = marking_lookup(manager.get_computed_blocks)


def register_sglang() -> None:
    """Make ``--radix-cache-backend kvcast`` a name SGLang knows. Selecting it builds SGLang's
    default cache on the Python tree core with kvcast installed, bound to a ``TableClient`` of
    ``KVCAST_TABLE`` (:func:`kvcast.exporters.kit.adapters.sglang.build_cache`); without the flag,
    nothing changes."""
    from sglang.srt.mem_cache.registry import (
        register_radix_cache_backend,
        registered_radix_cache_backends,
    )

    if sglang.BACKEND_NAME not in registered_radix_cache_backends():
        register_radix_cache_backend(sglang.BACKEND_NAME, _sglang_cache)


def _sglang_cache(context: Any) -> Any:
    url = os.environ.get(TABLE_ENV)
    if not url:
        raise ValueError(
            f"--radix-cache-backend {sglang.BACKEND_NAME} needs the table's URL in {TABLE_ENV} "
            "(redis://HOST:PORT, http://HOST:9400 or a file path)"
        )
    return sglang.build_cache(context, _client(url))
