"""kvcast inside vLLM 0.33.0: the IAC free-block queue put into a block pool, and requests
tagged with their state where ``KVCacheManager.free`` frees their blocks.

The queue itself is :mod:`kvcast.exporters.kit.adapters.vllm_queue`; the plugin entry point that
installs all of this into every vLLM process is :func:`kvcast.exporters.kit.plugins.register_vllm`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcast.exporters.kit.adapters.request_state import INTENT_KEY, TURN_KEY, HasIndex, state_from
from kvcast.exporters.kit.adapters.vllm_queue import IACFreeBlockQueue
from kvcast.exporters.kit.index import PriorityIndex

__all__ = [
    "INTENT_KEY",
    "TURN_KEY",
    "IACFreeBlockQueue",
    "install",
    "marking_lookup",
    "replace_queue",
    "request_state",
    "tagging_free",
]


def request_state(request: Any) -> tuple[str | None, int]:
    """``(intent, turn)`` from a vLLM ``Request``'s ``sampling_params.extra_args`` (the
    OpenAI API's ``vllm_xargs``: ``{"kvcast_intent": "code_debugging", "kvcast_turn": 3}``);
    ``(None, 0)`` when the request carries no intent or a turn that is not a positive int."""
    params = getattr(request, "sampling_params", None)
    return state_from(getattr(params, "extra_args", None))


def tagging_free(free: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """``KVCacheManager.free`` that frees a request's blocks inside its state's tagging."""

    def free_tagged(manager: Any, request: Any) -> None:
        queue = manager.block_pool.free_block_queue
        intent, turn = request_state(request)
        if intent is None or not isinstance(queue, IACFreeBlockQueue):
            free(manager, request)
            return
        queue.begin_tagging(intent, turn)
        try:
            free(manager, request)
        finally:
            queue.end_tagging()

    free_tagged.__wrapped__ = free  # type: ignore[attr-defined]
    free_tagged.__doc__ = free.__doc__
    return free_tagged


def marking_lookup(lookup: Callable[..., Any]) -> Callable[..., Any]:
    """``KVCacheManager.get_computed_blocks`` that marks, in a ``density`` queue, the blocks a
    turn-1 request finds cached as shared by two conversations (a turn-1 request has no
    history of its own, so whatever it finds another conversation left):
    :meth:`IACFreeBlockQueue.mark_shared`."""

    def lookup_marking(manager: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        found = lookup(manager, request, *args, **kwargs)
        queue = manager.block_pool.free_block_queue
        if isinstance(queue, IACFreeBlockQueue) and queue.keeps_marks and found[1] > 0:
            intent, turn = request_state(request)
            if intent is not None and turn == 1:
                queue.mark_shared(found[0].blocks)
        return found

    lookup_marking.__wrapped__ = lookup  # type: ignore[attr-defined]
    lookup_marking.__doc__ = lookup.__doc__
    return lookup_marking


def replace_queue(pool: Any, table: HasIndex | PriorityIndex) -> IACFreeBlockQueue:
    """Give a built vLLM ``BlockPool`` an :class:`IACFreeBlockQueue` over the blocks free now,
    in their order (so the null block, already taken, stays taken)."""
    old = pool.free_block_queue
    if isinstance(old, IACFreeBlockQueue):
        raise ValueError("kvcast is already installed in this block pool")
    free_now = old.get_all_free_blocks()
    for block in free_now:
        block.prev_free_block = block.next_free_block = None
    queue = IACFreeBlockQueue(free_now, table=table)
    queue.reserve(len(pool.blocks))
    pool.free_block_queue = queue
    return queue


def install(manager: Any, table: HasIndex | PriorityIndex) -> IACFreeBlockQueue:
    """Put kvcast into a built vLLM ``KVCacheManager``: its block pool's queue is replaced
    (:func:`replace_queue`), ``manager.free`` tags what a request frees and
    ``manager.get_computed_blocks`` marks what a turn-1 request finds cached as shared."""
    queue = replace_queue(manager.block_pool, table)
    cls = type(manager)
    manager.free = tagging_free(cls.free).__get__(manager)
    manager.get_computed_blocks = marking_lookup(cls.get_computed_blocks).__get__(manager)
    return queue
