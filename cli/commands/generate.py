"""``kvcast generate OUT.jsonl``: a synthetic multi-turn workload as a replay file."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any, BinaryIO

import click
import orjson

from kvcast.cli.options import Floats, Ints, block_size_option
from kvcast.lab.workload.generator import generate, unbounded_hit_ratio
from kvcast.lab.workload.model import ground_truth
from kvcast.lab.workload.presets import PRESETS, preset

_CHUNK = 4096


def _write(lines: Any, out: BinaryIO) -> None:
    buf: list[bytes] = []
    for line in lines:
        buf.append(line)
        if len(buf) >= _CHUNK:
            out.write(b"".join(buf))
            buf.clear()
    out.write(b"".join(buf))


@click.command("generate")
@click.argument("out", type=click.Path(dir_okay=False, writable=True, allow_dash=True))
@click.option(
    "--preset",
    "preset_name",
    type=click.Choice(list(PRESETS)),
    default="single",
    show_default=True,
    help="Workload model.",
)
@click.option(
    "--lambda",
    "lambda0",
    type=Floats(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Conversation arrival rate, per second.",
)
@click.option(
    "--duration",
    "duration_s",
    type=Floats(min=0, min_open=True),
    help="Arrival window in seconds (default 3600 unless --conversations is given).",
)
@click.option(
    "--conversations",
    type=Ints(min=1),
    help="Number of conversations instead of a duration.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@block_size_option
@click.option(
    "--prompts/--no-prompts",
    default=True,
    show_default=True,
    help="Add a short template user message per turn.",
)
@click.option(
    "--cached-capacity-blocks",
    type=Ints(min=0),
    help="Add cached_tokens from whole-content LRU (Algorithm 1) at this capacity.",
)
@click.option(
    "--start-time",
    type=float,
    default=0.0,
    show_default=True,
    help="Time of the arrival window's start, seconds (e.g. a Unix epoch).",
)
@click.option(
    "--block-hashes/--no-block-hashes",
    "block_hashes",
    default=None,
    help="Add the input's KV block ids (default: with the sharing presets, which need them; "
    "--no-block-hashes gives the same workload with every conversation's content its own).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def generate_command(
    out: str,
    preset_name: str,
    lambda0: float,
    duration_s: float | None,
    conversations: int | None,
    seed: int,
    block_size: int,
    prompts: bool,
    cached_capacity_blocks: int | None,
    start_time: float,
    block_hashes: bool | None,
    as_json: bool,
) -> None:
    """Write a synthetic workload (the mean-field paper's multi-turn conversation model with
    intents) to OUT.jsonl ('-' for stdout), one event per line in timestamp order."""
    if duration_s is not None and conversations is not None:
        raise click.UsageError("give --duration or --conversations, not both")
    if duration_s is None and conversations is None:
        duration_s = 3600.0
    model = preset(preset_name)
    if model.agent is not None:
        given = click.get_current_context().get_parameter_source("block_size")
        if given is click.core.ParameterSource.DEFAULT:
            # The agent model's sizes are tokens: its own block size (1,024) unless asked,
            # 16-token blocks would give ~7,000 ids per request.
            block_size = model.agent.block_size
    trace = generate(
        model,
        lambda0=lambda0,
        duration_s=duration_s,
        conversations=conversations,
        seed=seed,
        block_size=block_size,
        prompts=prompts,
        cached_capacity_blocks=cached_capacity_blocks,
        start_time=start_time,
        block_hashes=block_hashes,
    )
    if out == "-":
        _write(trace.jsonl_lines(), sys.stdout.buffer)
        sys.stdout.buffer.flush()
    else:
        with open(out, "wb") as fh:
            _write(trace.jsonl_lines(), fh)

    first = float(trace.timestamp[0]) if len(trace) else start_time
    last = float(trace.timestamp[-1]) if len(trace) else start_time
    per_intent = Counter(trace.intent_names[i] for i in trace.intent[trace.turn == 1].tolist())
    summary: dict[str, Any] = {
        "out": out,
        "preset": preset_name,
        "seed": seed,
        "lambda_per_s": lambda0,
        "duration_s": duration_s,
        "block_size": block_size,
        "conversations": trace.conversations,
        "events": len(trace),
        "first_timestamp": first,
        "last_timestamp": last,
        "span_s": last - first,
        "intents": dict(sorted(per_intent.items())),
    }
    if model.agent is not None:
        # An intent per request (its response's ending); no closed-form bound.
        every = Counter(trace.intent_names[i] for i in trace.intent.tolist())
        summary["request_intents"] = dict(sorted(every.items()))
        summary["compactions"] = trace.meta.get("compactions", 0)
        if trace.lineage is not None:
            summary["subagents"] = int((trace.lineage.parent >= 0).sum())
    else:
        truth = ground_truth(model)
        a_r = sum(t.share * t.A_R for t in truth.values())
        summary["upper_bound_model"] = sum(t.share * t.A_H_hash for t in truth.values()) / a_r
    if model.sharing is not None or model.agent is not None:
        # The model bound ignores sharing; the trace's own bound counts it (unbounded cache).
        summary.pop("upper_bound_model", None)
        if trace.block_ids is not None:
            summary["upper_bound_trace"] = unbounded_hit_ratio(trace)
    if trace.cached_tokens is not None:
        total_in = int(trace.input_tokens.sum())
        cached = int(trace.cached_tokens.sum())
        summary["observed_hit_ratio"] = cached / total_in if total_in else 0.0
    stream = sys.stderr if out == "-" else sys.stdout
    if as_json:
        stream.write(orjson.dumps(summary).decode() + "\n")
    else:
        stream.write(
            f"wrote {len(trace)} events of {trace.conversations} conversations spanning "
            f"{last - first:.1f} s to {out} (preset {preset_name}, lambda {lambda0:g}/s, "
            f"seed {seed}, {block_size}-token blocks)\n"
        )
