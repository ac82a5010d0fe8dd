"""The ``kvcast`` command line: one click group, one module per subcommand."""

from __future__ import annotations

import click

from kvcast.daemon.commands import COMMANDS


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
