"""One module per CLI subcommand; ``kvcast.daemon.cli`` assembles them."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
