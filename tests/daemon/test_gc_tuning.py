"""The long-running commands tune the garbage collector for streaming; library code never does."""

from __future__ import annotations

import gc
import subprocess
import sys

from kvcast.daemon.gc_tuning import FIRST_GENERATION, OLDER_GENERATIONS, tune_for_streaming


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
