"""State stores behind one protocol, chosen from a URL scheme.

``memory://`` (the embedded default), ``redis://`` / ``rediss://`` (production),
``redis+sentinel://`` (the same layout on Sentinel's master) and ``redis+cluster://``
(a Redis Cluster, partitions spread over its shards; its own layout).
"""

from kvcast.daemon.stores.base import StaleOwner, StateStore, StoreUnavailable, WindowState
from kvcast.daemon.stores.registry import STORES, open_store

__all__ = ["STORES", "StaleOwner", "StateStore", "StoreUnavailable", "WindowState", "open_store"]
