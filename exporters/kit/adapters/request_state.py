"""What every engine adapter shares: the live table it ranks by, and a request's state.

A request carries its state in the engine's per-request extension dict, under the same two
keys in both engines: vLLM's ``sampling_params.extra_args`` (the OpenAI API's ``vllm_xargs``)
and SGLang's ``sampling_params.custom_params`` (the OpenAI API's ``custom_params``), e.g.
``{"kvcast_intent": "code_debugging", "kvcast_turn": 3}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from kvcast.exporters.kit.index import POLICIES, PriorityIndex

__all__ = [
    "INTENT_KEY",
    "TURN_KEY",
    "FixedTable",
    "HasIndex",
    "live_table",
    "policy_of",
    "state_from",
]

INTENT_KEY = "kvcast_intent"
TURN_KEY = "kvcast_turn"


class HasIndex(Protocol):
    """A :class:`~kvcast.exporters.kit.client.TableClient`, or anything holding the live index."""

    index: PriorityIndex


class FixedTable:
    """One table that never changes (tests, benchmarks, an engine without a table source);
    ``policy``: what the adapters rank by, as ``TableClient(..., policy=...)``."""

    __slots__ = ("index", "policy")

    def __init__(self, index: PriorityIndex, policy: str = "iac") -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.index = index
        self.policy = policy


def live_table(table: HasIndex | PriorityIndex) -> HasIndex:
    """``table`` as something whose ``.index`` is read at each use (a refresh applies)."""
    return FixedTable(table) if isinstance(table, PriorityIndex) else table


def policy_of(table: HasIndex) -> str:
    """The policy an adapter ranks by: the table's ``policy`` (a ``TableClient``'s or a
    :class:`FixedTable`'s), ``iac`` for anything without one."""
    policy = getattr(table, "policy", "iac")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    return policy


def state_from(extension: Mapping[str, Any] | None) -> tuple[str | None, int]:
    """``(intent, turn)`` from a request's extension dict; ``(None, 0)`` when it carries no
    intent, or a turn that is not a positive int (a digit string counts: JSON clients send
    them). The turn defaults to 1."""
    if not isinstance(extension, Mapping):
        return None, 0
    intent = extension.get(INTENT_KEY)
    turn = extension.get(TURN_KEY, 1)
    if isinstance(turn, str) and turn.isdigit():
        turn = int(turn)
    if not isinstance(intent, str) or isinstance(turn, bool) or not isinstance(turn, int):
        return None, 0
    if turn < 1:
        return None, 0
    return intent, turn
