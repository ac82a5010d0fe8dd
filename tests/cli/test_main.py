"""The ``kvcast`` group: every subcommand listed, each imported only when it runs."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from kvcast.cli.main import COMMANDS, cli, load_command

EVENT = b'{"session_id":"s","turn":1,"timestamp":1.0,"input_tokens":10,"output_tokens":5}\n'


def test_help_lists_every_subcommand() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    listed = {line.split()[0] for line in result.output.split("Commands:")[1].splitlines()[1:]
              if line.strip()}  # fmt: skip
    assert listed == set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_subcommand_loads_under_its_name(name: str) -> None:
    command = load_command(name, COMMANDS[name])
    assert isinstance(command, click.Command) and command.name == name
    assert CliRunner().invoke(cli, [name, "--help"]).exit_code == 0


def test_a_target_that_is_not_the_named_command_is_refused() -> None:
    with pytest.raises(TypeError, match="is not the click command 'replay'"):
        load_command("replay", "kvcast.cli.commands.run:run")


def test_replay_imports_neither_the_tap_nor_the_benchmarks(tmp_path) -> None:
    # Importing every subcommand took ~3 s of start-up: 3/4 of a 300,000-event replay.
    trace = tmp_path / "events.jsonl"
    trace.write_bytes(EVENT)
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(m for m in ('aiohttp', 'kvcast.lab.bench.throughput',"
        " 'kvcast.cli.commands.tap', 'kvcast.cli.commands.bench') if m in sys.modules),"
        " file=sys.stderr))\n"
        "from kvcast.cli.main import main\n"
        f"sys.argv = ['kvcast', 'replay', {str(trace)!r}]\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "processed" in done.stdout or "forecast" in done.stdout
    assert done.stderr.strip().splitlines()[-1] == "[]"
