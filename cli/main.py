"""The ``kvcast`` command line: one click group, one module per subcommand.

Each subcommand's module is imported only when that subcommand runs (or ``--help`` lists them
all): importing all eleven took about 3 s on the development machine (the benchmarks pull in
the simulators and SciPy, the tap aiohttp), three quarters of ``kvcast replay``'s wall time on
300,000 events.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import click

# name -> "module:attribute" of its click command
COMMANDS: Mapping[str, str] = {
    "run": "kvcast.cli.commands.run:run",
    "replay": "kvcast.cli.commands.replay:replay",
    "forecast": "kvcast.cli.commands.forecast:forecast",
    "simulate": "kvcast.cli.commands.simulate:simulate_command",
    "convert": "kvcast.cli.commands.convert:convert_command",
    "generate": "kvcast.cli.commands.generate:generate_command",
    "bench": "kvcast.cli.commands.bench:bench",
    "classify": "kvcast.cli.commands.classify:classify_command",
    "train-head": "kvcast.cli.commands.train_head:train_head_command",
    "table": "kvcast.cli.commands.table:table",
    "tap": "kvcast.cli.commands.tap:tap_command",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported by name, on first use."""

    def __init__(self, *args: object, lazy_commands: Mapping[str, str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy_commands = dict(lazy_commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in self.lazy_commands:
            command = load_command(cmd_name, self.lazy_commands[cmd_name])
            self.add_command(command, cmd_name)
        return command


def load_command(name: str, target: str) -> click.Command:
    """The click command at ``target`` (``module:attribute``), checked to be named ``name``."""
    module_name, _, attribute = target.partition(":")
    command = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(command, click.Command) or command.name != name:
        raise TypeError(f"{target} is not the click command {name!r}")
    return command


@click.group(
    cls=LazyGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "KVCAST"},
)
@click.version_option(package_name="kvcast")
def cli() -> None:
    """kvcast: forecast the prefix-cache hit ratio of a multi-turn LLM serving cluster
    and publish the Intent-Aware Caching priority table."""


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
