"""Named workload models for ``generate`` and deterministic prompt texts per intent.

- ``single``: one intent, the paper's setting: p = 0.78, exponential delays of mean 135 s,
  E[Z] = 3 blocks.
- ``lognormal``: the same with log-normal delays, mu = 4.6, sigma = 1 (log seconds), as in IAC.
- ``mixed``: intent-heterogeneous: long, fast coding sessions; short, slow chit-chat with
  log-normal delays; writing with per-turn continuation; planning whose delays grow over its
  first five turns.
"""

from __future__ import annotations

from collections.abc import Callable

from kvcast.lab.workload.generator import Delay, IntentModel, WorkloadModel


def single() -> WorkloadModel:
    m = IntentModel(
        "general_explanations_definitions", p_continue=0.78, delay=Delay.exp(135.0), block_mean=3.0
    )
    return WorkloadModel((m,), (1.0,))


def lognormal() -> WorkloadModel:
    m = IntentModel(
        "general_explanations_definitions",
        p_continue=0.78,
        delay=Delay.lognormal(4.6, 1.0),
        block_mean=3.0,
    )
    return WorkloadModel((m,), (1.0,))


def mixed() -> WorkloadModel:
    coding = IntentModel(
        "code_debugging",
        p_continue=0.85,
        delay=Delay.exp(30.0),
        block_mean=4.0,
        first_block_mean=8.0,
        output_mean=400.0,
    )
    chat = IntentModel(
        "chitchat",
        p_continue=0.45,
        delay=Delay.lognormal(6.4, 1.0),
        block_mean=2.0,
        output_mean=60.0,
    )
    writing = IntentModel(
        "creative_writing",
        p_continue=(0.85, 0.75, 0.65, 0.55, 0.5),
        delay=(Delay.lognormal(4.0, 0.8), Delay.lognormal(4.6, 1.0)),
        block_mean=4.0,
        block_law="geometric",
        output_mean=600.0,
    )
    travel = IntentModel(
        "travel_planning",
        p_continue=0.7,
        block_mean=3.0,
        output_mean=300.0,
        delay=tuple(Delay.exp(s) for s in (120.0, 180.0, 240.0, 360.0, 480.0)),
    )
    return WorkloadModel((coding, chat, writing, travel), (0.3, 0.3, 0.2, 0.2))


PRESETS: dict[str, Callable[[], WorkloadModel]] = {
    "single": single,
    "mixed": mixed,
    "lognormal": lognormal,
}


def preset(name: str) -> WorkloadModel:
    """A named workload model (see :data:`PRESETS`)."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None
