"""kvcast inside SGLang 0.5.23: the prefix cache evicts by the table (SGLang is not a
dependency of kvcast; everything SGLang is imported inside the functions that need it).

How SGLang evicts. Its default prefix cache is a ``UnifiedRadixCache`` whose tree lives in a
*tree core*: Rust by default, or Python. The Python tree core evicts from a heap of the
evictable leaves keyed by ``tree_core.eviction_strategy.get_priority(node)``, lowest first, and
pushes a parent once it has become a leaf (the older ``RadixCache`` does the same with
``cache.eviction_strategy``). The Rust tree core runs only its own native strategies (LRU, LFU,
FIFO, MRU, FILO, priority, SLRU, T-LRU): it never calls Python per node, so kvcast runs the
cache on the Python tree core, and everything else SGLang builds stays as it is.

What kvcast adds:

- :class:`IACStrategy`, an SGLang ``EvictionStrategy`` ranking by the table's IAC tuple;
- tags: when SGLang releases a request (``on_release(req, checkpointed=True)``, after the
  request's tokens went into the tree and ``req.last_node`` is the node they ended on), the
  path from that node to the root takes the request's state, read from
  ``req.sampling_params.custom_params`` (``kvcast_intent``, ``kvcast_turn``; the OpenAI API's
  ``custom_params``), and its release time. A request without a state leaves its path
  untagged, as does anything inserted outside a request;
- shared nodes (``density`` with a table that carries the shared blocks' reuse law): what a
  turn-1 request found cached (its ``cached_tokens``; a turn-1 request has no history of its
  own) another conversation left; those nodes are marked for as long as they live and take
  the table's ``shared`` law (``SHARED_INTENT``) instead of their last request's state;
- :func:`build_cache`: SGLang's default cache with the two above, which
  ``--radix-cache-backend kvcast`` builds (registered by
  :func:`kvcast.exporters.kit.plugins.register_sglang`); :func:`install` for a cache built by hand.

The order. Untagged nodes go first, among themselves in SGLang's LRU order, so that a cache
with nothing tagged evicts exactly as stock. Tagged nodes follow, by the IAC tuple of SPEC
section 5: ``(1[age < M(i, t)], P(t+1 | i, t), size in tokens)``, the age in seconds since the
release; or, when the table's client ranks by ``density`` (``TableClient(..., policy=
"density")``), by ``(hit density per token, -age)``, the client's :meth:`priority` key (SPEC
section 12). The table is looked up once per released request; a refreshed table revalues every
state at the next eviction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from math import log1p
from typing import Any

from kvcast.exporters.kit.adapters.request_state import HasIndex, live_table, policy_of, state_from
from kvcast.exporters.kit.adapters.state_values import StateCache, StateValues
from kvcast.exporters.kit.ages import AGE_BUCKETS, BUCKET_SCALE
from kvcast.exporters.kit.index import SHARED_INTENT, PriorityIndex

__all__ = [
    "BACKEND_NAME",
    "SHARED_ATTR",
    "TAG_ATTR",
    "IACStrategy",
    "RustTreeCoreError",
    "build_cache",
    "install",
    "request_state",
]

log = logging.getLogger(__name__)

BACKEND_NAME = "kvcast"  # --radix-cache-backend kvcast
TAG_ATTR = "kvcast_tag"  # on a tree node: (its state, released at: strategy clock s) or None
SHARED_ATTR = "kvcast_shared"  # on a tree node: True once a turn-1 request found it cached
UNTAGGED = -1  # first element of an untagged node's key: below every tagged one (0 or 1)
_LAST = AGE_BUCKETS - 1  # ages.age_bucket inlined in get_priority (its hot path)


class RustTreeCoreError(TypeError):
    """The cache's tree core is SGLang's Rust one, which cannot call a Python strategy."""


def request_state(req: Any) -> tuple[str | None, int]:
    """``(intent, turn)`` of an SGLang ``Req``, from ``sampling_params.custom_params``."""
    params = getattr(req, "sampling_params", None)
    return state_from(getattr(params, "custom_params", None))


class IACStrategy:
    """An SGLang ``EvictionStrategy``: ``get_priority(node)``, lowest evicted first.

    ``table``: a ``TableClient`` (its current index is read at each eviction) or a fixed
    :class:`PriorityIndex`. ``clock``: seconds, the clock release times are taken on (an
    attribute: tests replace it). The policy is the table's (``table.policy``, ``iac`` for a
    bare index).
    """

    def __init__(
        self, table: HasIndex | PriorityIndex, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._table = live_table(table)
        self.policy = policy_of(self._table)
        self._density = self.policy == "density"
        self.clock = clock
        # one StateValues per (intent, turn) tagged: what get_priority reads off a node's tag
        self._states = StateCache(
            self._table, StateValues, density=self._density, changed=self._table_changed
        )
        self._index: PriorityIndex | None = None  # the cache's table, one lookup per node
        self._states.sync()

    def get_priority(self, node: Any) -> tuple[Any, ...]:
        """``(-1, last_access_time)`` untagged, else ``(recency, P(t+1 | i, t), size)``
        (``iac``) or ``(0, hit density per token, -age)`` (``density``)."""
        tag = node.__dict__.get(TAG_ATTR)  # no AttributeError raised and caught per node
        if tag is None:
            return (UNTAGGED, node.last_access_time)
        if self._table.index is not self._index:
            self._states.sync()
        state, released_at = tag
        if self._density:
            age = self.clock() - released_at
            k = int(log1p(age) * BUCKET_SCALE) if age > 0.0 else 0
            return (0, state.curve[k if k < _LAST else _LAST] / (len(node.key) or 1), -age)
        recent = 1 if self.clock() - released_at < state.median_s else 0
        return (recent, state.p, len(node.key))

    def tag(
        self,
        node: Any,
        intent: str | None,
        turn: int,
        released_at: float | None = None,
        shared_tokens: int = 0,
    ) -> int:
        """Give ``node`` and its ancestors (not the root) a state; ``intent=None`` untags them.
        ``released_at``: clock seconds, default now. ``shared_tokens``: the path's first
        tokens are shared with another conversation (under ``density``, the nodes wholly
        inside them are marked so for as long as they live); marked nodes take the table's
        shared law where it has one. Returns the number of nodes."""
        now = self.clock() if released_at is None else released_at
        tag = None if intent is None else (self._states.get(intent, turn), now)
        path = []
        while node is not None and node.parent is not None:
            path.append(node)
            node = node.parent
        shared_tag = None
        if self._density:
            if shared_tokens > 0:
                depth = 0
                for node in reversed(path):  # from the root down
                    depth += len(node.key)
                    if depth > shared_tokens:
                        break
                    setattr(node, SHARED_ATTR, True)
            if self._table.index.has_shared:
                shared_tag = (self._states.get(SHARED_INTENT, 1), now)
        for node in path:
            marked = shared_tag is not None and node.__dict__.get(SHARED_ATTR)
            setattr(node, TAG_ATTR, shared_tag if marked else tag)
        return len(path)

    def _table_changed(self) -> None:
        self._index = self._states.index

    def tag_request(self, cache: Any, req: Any) -> int:
        """Tag the path a released request's tokens ended on with the request's state; what a
        turn-1 request found cached (``req.cached_tokens``, its cache hit) another conversation
        left, so it is shared."""
        node = _node_of(cache, getattr(req, "last_node", None))
        if node is None:
            return 0
        intent, turn = request_state(req)
        hit = getattr(req, "cached_tokens", 0) if intent is not None and turn == 1 else 0
        return self.tag(node, intent, turn, shared_tokens=hit if isinstance(hit, int) else 0)


def _node_of(cache: Any, handle: Any) -> Any:
    """The tree node behind ``req.last_node``: a node (``RadixCache``) or a node id
    (``UnifiedRadixCache``); None when it is gone or there is none."""
    if handle is None or not isinstance(handle, int):
        return handle
    try:
        return cache.tree_core.node_by_id(handle)
    except (KeyError, AttributeError):
        return None


def _tagging_release(on_release: Callable[..., None], cache: Any, strategy: IACStrategy) -> Any:
    """``cache.on_release`` that tags a checkpointed request's path once SGLang is done."""

    def on_release_tagged(req: Any, *, checkpointed: bool) -> None:
        on_release(req, checkpointed=checkpointed)
        if checkpointed:
            try:
                strategy.tag_request(cache, req)
            except Exception:  # a tag is worth less than the scheduler: never fail it
                log.warning("kvcast: request not tagged", exc_info=True)

    on_release_tagged.__wrapped__ = on_release  # type: ignore[attr-defined]
    return on_release_tagged


def _keeping_tags(split: Callable[..., Any]) -> Callable[..., Any]:
    """A tree core's ``_split_node(key, child, split_len)`` after which the new node (the
    first ``split_len`` tokens of ``child``) has the child's tag and shared mark: a split
    cuts a node in two, and both parts were used by the same requests."""

    def split_keeping_tags(key: Any, child: Any, split_len: int) -> Any:
        result = split(key, child, split_len)
        found = child.__dict__
        if TAG_ATTR in found or SHARED_ATTR in found:
            new_node = result[0] if isinstance(result, tuple) else result  # Unified: (node, action)
            for attr in (TAG_ATTR, SHARED_ATTR):
                if attr in found:
                    setattr(new_node, attr, found[attr])
        return result

    split_keeping_tags.__wrapped__ = split  # type: ignore[attr-defined]
    return split_keeping_tags


def install(cache: Any, table: HasIndex | PriorityIndex, **options: Any) -> IACStrategy:
    """Make a built SGLang cache evict by the table; returns the strategy.

    ``cache``: a ``UnifiedRadixCache`` on the Python tree core (``CacheInitParams(...,
    tree_core_backend="python")`` or ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python``), or a
    ``RadixCache``. Raises :class:`RustTreeCoreError` on the Rust tree core, ``ValueError``
    when kvcast is installed already. ``options`` go to :class:`IACStrategy`.
    """
    owner = getattr(cache, "tree_core", cache)
    if not hasattr(owner, "eviction_strategy"):
        raise RustTreeCoreError(
            f"{type(owner).__name__} keeps its eviction strategy in Rust and cannot rank by "
            "kvcast's table: build the cache on the Python tree core (CacheInitParams("
            "tree_core_backend='python') or SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python), "
            "or start SGLang with --radix-cache-backend kvcast"
        )
    if isinstance(owner.eviction_strategy, IACStrategy):
        raise ValueError("kvcast is already installed in this cache")
    try:
        from sglang.srt.mem_cache.evict_policy import EvictionStrategy
    except ImportError:
        pass
    else:
        EvictionStrategy.register(IACStrategy)
    strategy = IACStrategy(table, **options)
    owner.eviction_strategy = strategy
    for component in getattr(cache, "components", {}).values():
        # The Python tree core's full-KV component binds get_priority at its first eviction.
        if getattr(component, "session_ref_eviction_strategy", None) is not None and not getattr(
            cache, "enable_session_radix_cache", False
        ):
            component.session_ref_eviction_strategy = None
    cache.on_release = _tagging_release(cache.on_release, cache, strategy)
    owner._split_node = _keeping_tags(owner._split_node)
    return strategy


def build_cache(context: Any, table: HasIndex | PriorityIndex) -> Any:
    """The cache SGLang builds by default for ``context`` (its ``TreeCacheBuildContext``),
    on the Python tree core, with kvcast installed: the ``--radix-cache-backend kvcast``
    factory."""
    from sglang.srt.mem_cache.registry import create_unified_radix_cache
    from sglang.srt.runtime_context import get_memory

    memory = get_memory()
    for flag in ("enable_lmcache", "enable_flexkv"):
        if getattr(memory, flag, False):
            raise ValueError(
                f"--radix-cache-backend {BACKEND_NAME} builds SGLang's UnifiedRadixCache; "
                f"--{flag.replace('_', '-')} selects another cache: use one or the other"
            )
    if context.is_hybrid_swa and context.full_tokens_per_layer == 0:
        raise ValueError(
            f"--radix-cache-backend {BACKEND_NAME}: a pure sliding-window model gets SGLang's "
            "PureSWARadixCache, which has no eviction strategy to replace"
        )
    context.params.tree_core_backend = "python"
    cache = create_unified_radix_cache(context)
    install(cache, table)
    return cache
