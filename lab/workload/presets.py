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

Coding agents (``kvcast.lab.workload.agent``; sizes in tokens, 1,024-token blocks by default):

- ``agent``: conversations of a median 45 requests whose context grows about 6% a turn from a
  shared 15,000-token system-plus-tools prefix (compacted at a 400,000-token window), each
  request's event labelled with how its response ended (``agent_tool_call``, ``agent_stop``,
  ``agent_length``), which sets the wait before the next; 1 conversation in 40 spawns 3-4
  sub-agents from one of its requests. Every parameter and its source: :func:`agent` and
  docs/workloads.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from kvcast.lab.workload.agent import AgentModel, Ending, LogNormalSize, TurnLaw
from kvcast.lab.workload.model import (
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


AGENT_INTENTS = ("agent_tool_call", "agent_stop", "agent_length")
"""The ``agent`` preset's intents: how each request's response ended (a tool call, the end of
the turn, the length limit or anything else), the label a producer derives from OpenAI's
``finish_reason`` (``tool_calls``, ``stop``, ``length``)."""


def agent_model() -> AgentModel:
    """The ``agent`` preset's parameters (tokens, seconds), fitted to real coding-agent
    sessions' own figures (issue 33; docs/workloads.md has the table and the fit).

    - Requests per root conversation: quartiles 19, 45, 101 (the sessions'), log-linear
      between, a Pareto tail of index 2 above P75 (mean 74 requests; P(M > 1,178) = 0.2%,
      about the sessions' maximum of 1,178 among ~600 conversations), capped at 1,178.
    - Context: a 15,000-token system-plus-tools prefix shared by every conversation; a first
      message of a median 20,000 tokens (sigma 0.7: the task, the repository's instructions and
      the first files read); each turn adds ``g`` of the context, ``g`` log-normal of median
      0.058, sigma 0.4 (so a request's share in the next, ``1 / (1 + g)``, has quartiles 0.93
      and 0.96, the sessions' 93-96%); past a 400,000-token window the context is compacted to
      the prefix plus a summary of a median 25,000 tokens (sigma 0.5). With these the requests'
      input tokens have P10/P50/P90 of about 42 K / 110 K / 300 K (the sessions' 43 K, 110 K,
      300 K), fitted by generating.
    - Endings: a tool call 85%, the end of the turn 6%, the rest (length limit and others) 9%
      (the sessions'). The next request follows the response after 4.4 s (the response's own
      time) plus a log-normal wait: after a tool call a median 3.9 s (sigma 1.64: tools run for
      seconds, builds and tests for minutes), after the end of the turn a median 600 s (sigma
      1.5: a person reads and answers), after the rest a median 256 s (sigma 1.5). The mix was
      solved to give the sessions' think-time quartiles 6 s, 10 s, 30 s and mean ~199 s; its
      maximum over ~40,000 waits is about a day (the sessions': 22 h). Output tokens: geometric
      of mean 150 (tool call), 500 (end of turn), 2,000 (length).
    - Sub-agents: 1 root in 40 spawns 3 or 4 (equally likely) from a uniformly chosen request
      ``k``, 4.4 s + exp(2 s) after it; each starts with request ``k``'s input (less its partly
      filled last block) plus a task message of a median 1,500 tokens (sigma 0.8) and runs
      quartiles 4, 8, 16 requests (tail index 2, cap 200: an assumption, the sessions give no
      figure for sub-agents' lengths).
    """
    return AgentModel(
        turns=TurnLaw(((0.25, 19.0), (0.5, 45.0), (0.75, 101.0)), tail_alpha=2.0, max_turns=1178),
        endings=(
            Ending("agent_tool_call", 0.85, Delay.lognormal(math.log(3.9), 1.64), 150.0),
            Ending("agent_stop", 0.06, Delay.lognormal(math.log(600.0), 1.5), 500.0),
            Ending("agent_length", 0.09, Delay.lognormal(math.log(256.0), 1.5), 2000.0),
        ),
        response_s=4.4,
        prefix_tokens=15_000,
        first_message=LogNormalSize(20_000.0, 0.7),
        growth=LogNormalSize(0.058, 0.4),
        windows=((400_000, 1.0),),
        summary=LogNormalSize(25_000.0, 0.5),
        subagent_share=1 / 40,
        subagent_counts=(3, 4),
        subagent_delay=Delay.exp(2.0),
        subagent_task=LogNormalSize(1_500.0, 0.8),
        subagent_turns=TurnLaw(
            ((0.25, 4.0), (0.5, 8.0), (0.75, 16.0)), tail_alpha=2.0, max_turns=200
        ),
    )


def agent() -> WorkloadModel:
    """Coding-agent traffic (see :func:`agent_model`): the intents name the endings."""
    am = agent_model()
    intents = tuple(IntentModel(e.intent) for e in am.endings)
    return WorkloadModel(intents, tuple(e.share for e in am.endings), agent=am)


PRESETS: dict[str, Callable[[], WorkloadModel]] = {
    "single": single,
    "mixed": mixed,
    "lognormal": lognormal,
    "shared_system": shared_system,
    "tools": tools,
    "agentic": agentic,
    "production": production,
    "agent": agent,
}

SHARING_PRESETS = ("shared_system", "tools", "agentic", "production")
"""Presets whose events carry ``block_hashes`` (cross-conversation sharing) on 16-token blocks
(``agent``'s carry them too, on 1,024-token blocks: see :data:`AGENT_PRESETS`)."""

AGENT_PRESETS = ("agent",)
"""Presets of coding-agent traffic (``kvcast.lab.workload.agent``): ``block_hashes`` on
1,024-token blocks, an intent per request."""


def preset(name: str) -> WorkloadModel:
    """A named workload model (see :data:`PRESETS`)."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None
