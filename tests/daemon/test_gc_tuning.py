"""The long-running commands tune the garbage collector for streaming; library code never does."""

from __future__ import annotations

import gc
import subprocess
import sys

from kvcast.daemon.gc_tuning import (
    FIRST_GENERATION,
    LATENCY_THRESHOLDS,
    OLDER_GENERATIONS,
    latency_tuned,
    tune_for_streaming,
)


def test_tuning_raises_the_thresholds() -> None:
    tune_for_streaming()
    assert gc.get_threshold() == (FIRST_GENERATION, *OLDER_GENERATIONS)


def test_cycles_are_still_collected_after_tuning() -> None:
    tune_for_streaming()
    collected = []

    class Node:
        def __del__(self) -> None:
            collected.append(True)

    node = Node()
    node.self = node  # a reference cycle: only the cyclic collector frees it
    del node
    gc.collect()
    assert collected == [True]


def test_replay_command_tunes_and_importing_the_library_does_not(tmp_path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(
        b'{"session_id":"s","turn":1,"timestamp":1.0,"input_tokens":10,"output_tokens":5}\n'
    )
    code = (
        "import gc, sys\n"
        "import kvcast.stats.replay, kvcast.stats.engine, kvcast.daemon.runner\n"
        "print(gc.get_threshold()[0])\n"
        "from click.testing import CliRunner\n"
        "from kvcast.cli.main import cli\n"
        "result = CliRunner().invoke(cli, ['replay', sys.argv[1]])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(gc.get_threshold()[0])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(trace)], check=True, capture_output=True, text=True
    ).stdout.split()
    untouched, tuned = out
    assert untouched != str(FIRST_GENERATION) and tuned == str(FIRST_GENERATION)


def test_the_latency_tuning_freezes_start_up_and_keeps_a_small_young_generation() -> None:
    before = gc.get_threshold()
    kept = [object() for _ in range(10)] + [[] for _ in range(1000)]  # start-up's objects
    with latency_tuned():
        assert gc.get_threshold() == LATENCY_THRESHOLDS
        assert LATENCY_THRESHOLDS[0] == 700  # young collections stay short (module docstring)
        assert gc.get_freeze_count() >= 1000  # out of every later full collection's scan
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    assert len(kept) == 1010


def test_cycles_are_still_collected_under_the_latency_tuning() -> None:
    collected = []

    class Node:
        def __del__(self) -> None:
            collected.append(True)

    with latency_tuned():
        node = Node()
        node.self = node
        del node
        gc.collect()
    assert collected == [True]
