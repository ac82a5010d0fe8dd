"""The priority table the daemon publishes (SPEC section 5): built from a snapshot as the
JSON-ready dict that ``kvcast.stats.documents.TableDocument`` carries to HTTP and the store.

The reading side (checks, laws, the index engines rank by) is the engine kit's
(``kvcast.exporters.kit``); this module is what the daemon, the CLI and the lab need to write
a table, and imports only ``kvcast.stats``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvcast.stats.config import StatsConfig
    from kvcast.stats.snapshot import SharedReuse, Snapshot

__all__ = ["TC_DIGITS", "table_document"]

TC_DIGITS = 3  # significant digits of the published T_C: a table is republished when it
# changes, and T_C moves a little at every refresh without changing the ranking


def table_document(
    snapshot: Snapshot,
    config: StatsConfig,
    version: int,
    characteristic_time_s: float | None = None,
    instances: int = 1,
) -> dict[str, Any]:
    """The versioned table: one entry per observed (intent, turn) state, defaults filled in.

    ``characteristic_time_s``: the live forecast's ``T_C`` (s), the ``density`` horizon
    (None: not known yet; engines then use their default horizon,
    ``kvcast.exporters.kit.density.DEFAULT_HORIZON_S``).
    ``instances``: engine instances behind session-affine routing; each sees the shared
    blocks' references ``instances`` times further apart (the ``shared`` row's gaps).
    """
    t_c = characteristic_time_s
    if t_c is not None and not (math.isfinite(t_c) and t_c > 0):
        t_c = None
    return {
        "version": version,
        "generated_at": snapshot.generated_at,
        "window_conversations": snapshot.window_conversations,
        # Turns above it share its state: clients cap a node's turn here before looking it up.
        "max_turn": config.max_turn,
        "defaults": {
            "p_continue": config.default_p_continue,
            "median_reuse_s": config.default_median_reuse_s,
        },  # (an optional "sigma", log-s, would replace DEFAULT_SIGMA for unfitted states)
        "characteristic_time_s": None if t_c is None else float(f"{t_c:.{TC_DIGITS}g}"),
        "states": [state.to_dict() for state in snapshot.states],
        "shared": _shared_row(snapshot.shared, config, instances),
    }


def _shared_row(shared: SharedReuse | None, config: StatsConfig, instances: int) -> Any:
    """The table's ``shared`` entry: the reuse law of blocks that two or more conversations
    share (a state of its own for the ``density`` policy), or None where the window saw none.

    ``p_continue``: the chance that a reference is followed by another; ``mu``, ``sigma``: the
    log-normal fit of the gaps (log s) as one of ``instances`` instances sees them (stretched
    by ``instances``, as the forecast's shared term does); ``median_reuse_s`` its median, or
    the default where fewer than ``min_delay_samples`` gaps were seen.
    """
    if shared is None:
        return None
    mu = None if shared.mu is None else shared.mu + math.log(max(instances, 1))
    fitted = shared.references >= config.min_delay_samples
    median = math.exp(mu) if fitted and mu is not None else config.default_median_reuse_s
    return {
        "p_continue": shared.p_continue,
        "median_reuse_s": median,
        "mu": mu,
        "sigma": shared.sigma,
        "references": shared.references,
        "lives": shared.lives,
    }
