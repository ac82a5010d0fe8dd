"""Named workload models for ``generate`` and deterministic prompt texts per intent.

- ``single``: one intent, the paper's setting: p = 0.78, exponential delays of mean 135 s,
  E[Z] = 3 blocks.
- ``lognormal``: the same with log-normal delays, mu = 4.6, sigma = 1 (log seconds), as in IAC.
- ``mixed``: intent-heterogeneous: long, fast coding sessions; short, slow chit-chat with
  log-normal delays; writing with per-turn continuation; planning whose delays grow over its
  first five turns.

Presets with cross-conversation sharing (their events carry ``block_hashes``; ``mixed``'s
intents; ``lambda0`` counts root conversations, branches come on top):

- ``shared_system``: every conversation starts with one of four system prompts of 16, 8, 24 and
  12 blocks, chosen with probabilities 0.5, 0.25, 0.15, 0.1.
- ``tools``: a common 8-block system prompt, then one of three tool sets of 16, 10 and 24 blocks
  (probabilities 0.4, 0.25, 0.15) or none (0.2): prefixes nest, system -> system + tools.
- ``agentic``: no shared prefix; 40% of conversations spawn 1 + Poisson(2) branches from one of
  their turns, each arriving exp(10 s) after it and starting with that turn's input.
- ``production``: all three: ``tools``' prefixes for 70% of conversations, one of two plain
  system prompts (8 and 4 blocks, 0.2 and 0.1) for the rest, and 15% of conversations branching.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kvcast.lab.workload.generator import (
    Branching,
    Delay,
    IntentModel,
    Segment,
    SharedPrefix,
    Sharing,
    WorkloadModel,
)


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


def _system_prompts() -> tuple[SharedPrefix, ...]:
    # Few prompts, skewed popularity (a product's default prompt dominates).
    sizes, weights = (16, 8, 24, 12), (0.5, 0.25, 0.15, 0.1)
    return tuple(
        SharedPrefix((Segment(f"system-{k}", b),), w)
        for k, (b, w) in enumerate(zip(sizes, weights, strict=True))
    )


def _tool_prefixes(scale: float = 1.0) -> tuple[SharedPrefix, ...]:
    system = Segment("tools-system", 8)
    tools = (("tools-a", 16, 0.4), ("tools-b", 10, 0.25), ("tools-c", 24, 0.15))
    nested = [SharedPrefix((system, Segment(name, b)), w * scale) for name, b, w in tools]
    return (SharedPrefix((system,), 0.2 * scale), *nested)


def shared_system() -> WorkloadModel:
    return replace(mixed(), sharing=Sharing(prefixes=_system_prompts()))


def tools() -> WorkloadModel:
    return replace(mixed(), sharing=Sharing(prefixes=_tool_prefixes()))


def agentic() -> WorkloadModel:
    branching = Branching(p_parent=0.4, mean_branches=3.0, delay=Delay.exp(10.0))
    return replace(mixed(), sharing=Sharing(branching=branching))


def production() -> WorkloadModel:
    plain = (
        SharedPrefix((Segment("chat-system", 8),), 0.2),
        SharedPrefix((Segment("lite-system", 4),), 0.1),
    )
    sharing = Sharing(
        prefixes=_tool_prefixes(0.7) + plain,
        branching=Branching(p_parent=0.15, mean_branches=3.0, delay=Delay.exp(10.0)),
    )
    return replace(mixed(), sharing=sharing)


PRESETS: dict[str, Callable[[], WorkloadModel]] = {
    "single": single,
    "mixed": mixed,
    "lognormal": lognormal,
    "shared_system": shared_system,
    "tools": tools,
    "agentic": agentic,
    "production": production,
}

SHARING_PRESETS = ("shared_system", "tools", "agentic", "production")
"""Presets whose events carry ``block_hashes`` (cross-conversation sharing)."""


def preset(name: str) -> WorkloadModel:
    """A named workload model (see :data:`PRESETS`)."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None
