"""One module per CLI subcommand; ``kvcast.daemon.cli`` assembles them."""

from __future__ import annotations

import click

from kvcast.daemon.commands.bench import bench
from kvcast.daemon.commands.classify import classify_command
from kvcast.daemon.commands.convert import convert_command
from kvcast.daemon.commands.forecast import forecast
from kvcast.daemon.commands.generate import generate_command
from kvcast.daemon.commands.replay import replay
from kvcast.daemon.commands.run import run
from kvcast.daemon.commands.simulate import simulate_command
from kvcast.daemon.commands.table import table
from kvcast.daemon.commands.train_head import train_head_command

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
]
