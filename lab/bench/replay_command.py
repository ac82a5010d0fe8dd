"""``kvcast replay FILE`` as a user runs it, against a bare ``json.loads`` loop over FILE; and
on a log with block ids, the native engine against the Python one.

Every figure is a whole command in a fresh process (interpreter start-up, imports and reading
the file included), the commands taking turns, best of ``rounds``. The first file is the
``mixed`` preset without prompts or block ids, about 300,000 events: the ratio is what a user
waits for beyond merely decoding the events. The second is the ``shared_system`` preset
(system prompts shared across conversations, 16-token blocks, ~36 block ids a request), about
200,000 events, replayed with the shared-prefix index by each engine, and by the native one
with the index off (``--shared-index-blocks 0``): what the shared-prefix statistics cost.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset

GOAL_RATIO = 0.75  # issue 35: the replay command at >= 0.75 of the json.loads loop's rate
JSON_LOOP = "import json, sys\nwith open(sys.argv[1], 'rb') as f:\n    for line in f:\n        json.loads(line)\n"  # noqa: E501


@dataclass(frozen=True)
class ReplayCommandResult:
    """Wall seconds of each command over ``events`` lines (best of the rounds)."""

    events: int
    replay_s: float
    json_loop_s: float

    @property
    def ratio(self) -> float:
        """The replay command's rate over the loop's (1: as fast as decoding alone)."""
        return self.json_loop_s / self.replay_s

    def rows(self) -> list[tuple[str, str, str, str]]:
        return [
            (
                f"`kvcast replay FILE`, {self.events:,} events (whole command: start-up, "
                "read, replay, forecast, table)",
                f"{self.replay_s:.2f} s ({self.events / self.replay_s:,.0f} events/s)",
                f"{self.json_loop_s:.2f} s (`json.loads` loop over FILE, its own process)",
                f"{self.ratio:.2f} (goal >= {GOAL_RATIO})",
            )
        ]

    def to_dict(self) -> dict[str, float]:
        return {**self.__dict__, "ratio": self.ratio}


@dataclass(frozen=True)
class SharingReplayResult:
    """Wall seconds of ``kvcast replay`` over ``events`` lines with block ids (best of the
    rounds): the native engine, the Python one, the native one without the index."""

    events: int
    native_s: float
    python_s: float
    native_no_index_s: float

    @property
    def speedup(self) -> float:
        """The native engine's rate over the Python engine's, both with the index."""
        return self.python_s / self.native_s

    def rows(self) -> list[tuple[str, str, str, str]]:
        return [
            (
                f"`kvcast replay FILE` with block ids, {self.events:,} events (`shared_system`,"
                " the shared-prefix index on; whole command)",
                f"{self.native_s:.2f} s ({self.events / self.native_s:,.0f} events/s, native"
                f" engine); {self.native_no_index_s:.2f} s with `--shared-index-blocks 0`",
                f"{self.python_s:.2f} s ({self.events / self.python_s:,.0f} events/s,"
                " `--engine python`, the same output)",
                f"{self.speedup:.2f}x",
            )
        ]

    def to_dict(self) -> dict[str, float]:
        return {**self.__dict__, "speedup": self.speedup}


def _wall(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def _write_trace(name: str, conversations: int, path: Path) -> int:
    """The preset's trace as a JSON-lines file; returns its events."""
    trace = generate(preset(name), lambda0=2.0, conversations=conversations, seed=0)
    events = 0
    with path.open("wb") as out:
        for line in trace.jsonl_lines():
            out.write(line)
            events += 1
    return events


def _best_of(commands: list[list[str]], rounds: int) -> list[float]:
    """Each command's best wall time (s), the commands taking turns for ``rounds`` rounds."""
    best = [float("inf")] * len(commands)
    for _ in range(rounds):
        best = [min(b, _wall(command)) for b, command in zip(best, commands, strict=True)]
    return best


def run_replay_command(conversations: int = 80_000, rounds: int = 3) -> ReplayCommandResult:
    """Generate the file, then time both commands in turn (about 30 s on 2 cores)."""
    with tempfile.TemporaryDirectory(prefix="kvcast-bench-") as folder:
        path = Path(folder) / "events.jsonl"
        events = _write_trace("mixed", conversations, path)
        replay = [sys.executable, "-m", "kvcast.cli.main", "replay", str(path)]
        loop = [sys.executable, "-c", JSON_LOOP, str(path)]
        replay_s, loop_s = _best_of([replay, loop], rounds)
    return ReplayCommandResult(events=events, replay_s=replay_s, json_loop_s=loop_s)


def run_replay_sharing(conversations: int = 50_000, rounds: int = 3) -> SharingReplayResult:
    """Generate the file with block ids, then time the three commands in turn (about 40 s on
    2 cores)."""
    with tempfile.TemporaryDirectory(prefix="kvcast-bench-") as folder:
        path = Path(folder) / "events.jsonl"
        events = _write_trace("shared_system", conversations, path)
        replay = [sys.executable, "-m", "kvcast.cli.main", "replay", "--json", str(path)]
        native_s, python_s, no_index_s = _best_of(
            [
                [*replay, "--engine", "native"],
                [*replay, "--engine", "python"],
                [*replay, "--engine", "native", "--shared-index-blocks", "0"],
            ],
            rounds,
        )
    return SharingReplayResult(events, native_s, python_s, no_index_s)
