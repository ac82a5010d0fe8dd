"""Entry points that engines load by themselves: kvcast installed with no edit of the engine.

``vllm.general_plugins`` (``pyproject.toml``) names :func:`register_vllm`; vLLM calls it in
each of its processes before it builds a block pool. It imports only the engine-side client
and adapters (standard library only) and, when called, vLLM itself.
"""

from __future__ import annotations

import os

from kvcast.exporters.adapters.vllm import IACFreeBlockQueue, tagging_free
from kvcast.exporters.client import TableClient

__all__ = ["TABLE_ENV", "register_vllm"]

TABLE_ENV = "KVCAST_TABLE"  # the table's URL: redis://HOST:PORT, http://HOST:9400, a file path


def register_vllm() -> None:
    """With ``KVCAST_TABLE`` set: every block pool this vLLM process builds gets an
    :class:`IACFreeBlockQueue` bound to a ``TableClient`` of that URL (refreshed in the
    background; the first fetch waits at most its 2 s timeout), and ``KVCacheManager.free``
    tags what a request frees with its state. Without it, nothing changes."""
    url = os.environ.get(TABLE_ENV)
    if not url:
        return
    from vllm.v1.core import block_pool, kv_cache_manager

    current = block_pool.FreeKVCacheBlockQueue
    if isinstance(current, type) and issubclass(current, IACFreeBlockQueue):
        return  # registered already in this process
    client = TableClient(url).start()
    block_pool.FreeKVCacheBlockQueue = IACFreeBlockQueue.bound(client)
    manager = kv_cache_manager.KVCacheManager
    manager.free = tagging_free(manager.free)
