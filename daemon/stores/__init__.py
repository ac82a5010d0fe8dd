"""State stores behind one protocol, chosen from a URL scheme.

``memory://`` (the embedded default) and ``redis://`` / ``rediss://`` (production).
"""

from kvcast.daemon.stores.base import StaleOwner, StateStore, StoreUnavailable, WindowState
from kvcast.daemon.stores.registry import STORES, open_store

__all__ = ["STORES", "StaleOwner", "StateStore", "StoreUnavailable", "WindowState", "open_store"]
