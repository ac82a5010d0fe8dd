"""The ``kvcast`` command line: one click group, one module per subcommand."""

from __future__ import annotations

import click

from kvcast.cli.commands.bench import bench
from kvcast.cli.commands.classify import classify_command
from kvcast.cli.commands.convert import convert_command
from kvcast.cli.commands.forecast import forecast
from kvcast.cli.commands.generate import generate_command
from kvcast.cli.commands.replay import replay
from kvcast.cli.commands.run import run
from kvcast.cli.commands.simulate import simulate_command
from kvcast.cli.commands.table import table
from kvcast.cli.commands.tap import tap_command
from kvcast.cli.commands.train_head import train_head_command

COMMANDS: list[click.Command] = [
    run,
    replay,
    forecast,
    simulate_command,
    convert_command,
    generate_command,
    bench,
    classify_command,
    train_head_command,
    table,
    tap_command,
]


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "KVCAST"}
)
@click.version_option(package_name="kvcast")
def cli() -> None:
    """kvcast: forecast the prefix-cache hit ratio of a multi-turn LLM serving cluster
    and publish the Intent-Aware Caching priority table."""


for _command in COMMANDS:
    cli.add_command(_command)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
