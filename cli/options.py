"""Command-line flags shared by several commands, each declared once here.

The statistics flags (``replay``, ``run``, ``table``), the cache being forecast and its tiers
(``--tier``, ``--tier-mode``: ``run``, ``forecast``, ``simulate``), the block size
(also ``forecast``, ``simulate``, ``generate``) and the classifier's backbone and taxonomy
(``classify``, ``train-head``).

Every flag also reads the environment variable ``KVCAST_`` + its name in capitals
(``--block-size`` reads ``KVCAST_BLOCK_SIZE``), shown in ``--help``; flags win over the
environment, which wins over a config file (``run --config``), which wins over the defaults.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

import click

from kvcast.daemon.logs import LOG_FORMATS
from kvcast.daemon.settings import declared
from kvcast.stats.config import StatsConfig
from kvcast.stats.declarations import Choice, Number, Text, declared_settings
from kvcast.stats.taxonomy import label_map
from kvcast.stats.tiers import DEFAULT_TIER_MODE, TIER_MODES, Tier, check_tiers, parse_tier

F = TypeVar("F", bound=Callable[..., Any])

_DEFAULTS = StatsConfig()


class _Uniform:
    """One message for a bad number, whichever layer gave it (flag, environment, config file):
    ``must be an integer >= 1 (x>=1), got -100 (from KVCAST_X)``."""

    min: float | None
    max: float | None
    min_open: bool
    max_open: bool
    kind = "a number"
    finite = False

    def describe(self) -> str:
        """``an integer >= 1 (x>=1)``: in words (the settings' own, kvcast.stats.declarations),
        then in click's notation as ``--help`` shows it."""
        number = Number(
            int if self.kind == "an integer" else float,
            self.min,
            self.max,
            self.min_open,
            self.max_open,
        )
        words = number.describe()
        if self.finite:
            words = words.replace(self.kind, "a finite " + self.kind.split(" ", 1)[1], 1)
        return f"{words} ({self._describe_range()})"  # type: ignore[attr-defined]

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            converted = super().convert(value, param, ctx)  # type: ignore[misc]
        except click.BadParameter:
            converted = None
        if converted is None or (self.finite and not math.isfinite(converted)):
            got = value if not isinstance(value, str) else value.strip()
            message = f"must be {self.describe()}, got {got!r}{_layer(ctx, param)}"
            raise click.BadParameter(message, ctx, param) from None
        return converted


class Ints(_Uniform, click.IntRange):
    """An integer within bounds (``click.IntRange``'s), with the uniform message."""

    kind = "an integer"


class Floats(_Uniform, click.FloatRange):
    """A number within bounds; ``finite`` also refuses inf (NaN is never in range)."""

    def __init__(self, *args: Any, finite: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.finite = finite


def _layer(ctx: click.Context | None, param: click.Parameter | None) -> str:
    """`` (from KVCAST_X)`` or `` (from the --config file)`` when the value came from there."""
    if ctx is None or param is None or param.name is None:
        return ""
    source = ctx.get_parameter_source(param.name)
    if source is click.core.ParameterSource.ENVIRONMENT:
        name = (
            param.envvar
            if isinstance(param, click.Option) and isinstance(param.envvar, str)
            else None
        )
        return f" (from {name})" if name else " (from the environment)"
    if source is click.core.ParameterSource.DEFAULT_MAP:
        return " (from the --config file)"
    return ""


def _click_type(kind: Number | Choice | Text) -> Any:
    """The click type checking what ``kind`` declares, with the uniform message for numbers."""
    if isinstance(kind, Number):
        numbers = Ints if kind.type is int else Floats
        return numbers(min=kind.min, max=kind.max, min_open=kind.min_open, max_open=kind.max_open)
    if isinstance(kind, Choice):
        return click.Choice([str(value) for value in kind.values])
    return click.STRING


# (flag, StatsConfig field, click type, help): as StatsConfig declares them (kvcast.stats.config).
_STATS_FLAGS: tuple[tuple[str, str, Any, str], ...] = tuple(
    (declared.flag, found.name, _click_type(declared.kind), declared.help)
    for found, declared in declared_settings(StatsConfig)
)
_BLOCK_SIZE = next(flag for flag in _STATS_FLAGS if flag[1] == "block_size")


def envvar_for(flag: str) -> str:
    """``--capacity-blocks`` -> ``KVCAST_CAPACITY_BLOCKS``."""
    return "KVCAST_" + flag.lstrip("-").upper().replace("-", "_")


def stats_options(command: F) -> F:
    """Add the statistics flags; the command receives them as ``stats_config``."""
    for flag, name, kind, help_text in reversed(_STATS_FLAGS):
        command = click.option(
            flag,
            name,
            type=kind,
            default=getattr(_DEFAULTS, name),
            show_default=True,
            envvar=envvar_for(flag),
            show_envvar=True,
            help=help_text,
        )(command)
    return command


def pop_stats_config(kwargs: dict[str, Any]) -> StatsConfig:
    """Remove the statistics flags from ``kwargs`` and build the validated config."""
    values = {name: kwargs.pop(name) for _, name, _, _ in _STATS_FLAGS}
    try:
        return StatsConfig(**values)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def declared_options(names: Collection[str] | None = None) -> Callable[[F], F]:
    """Add the options of the settings :class:`~kvcast.daemon.settings.DaemonSettings`
    declares (all, or those named), in field order; :func:`pop_declared` reads them back."""

    def add(command: F) -> F:
        chosen = [(found, how) for found, how in declared() if names is None or found.name in names]
        for found, how in reversed(chosen):
            default = None if found.default in (None, ()) else found.default
            command = click.option(
                how.flag,
                found.name,
                type=_click_type(how.kind),
                multiple=how.many,
                default=default,
                show_default=default is not None,
                envvar=how.envvar,
                show_envvar=True,
                help=how.help,
            )(command)
        return command

    return add


def pop_declared(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove the declared settings' options from ``kwargs``, as the fields' values: a choice
    as the declared value (``--taxonomy 20`` -> 20), a repeated or separated one as a tuple."""
    values: dict[str, Any] = {}
    for found, how in declared():
        if found.name not in kwargs:
            continue
        value = kwargs.pop(found.name)
        if isinstance(how.kind, Choice) and value is not None:
            value = next(choice for choice in how.kind.values if str(choice) == str(value))
        if how.many:
            value = tuple(value)
        if how.separator is not None:
            parts = (value or "").split(how.separator)
            value = tuple(part.strip() for part in parts if part.strip())
        values[found.name] = value
    return values


# The cache being forecast, shared by ``replay``.
capacity_options = declared_options(("capacity_blocks", "instances", "kv_bytes_per_token"))


def block_size_option(command: F) -> F:
    """``--block-size`` alone, for the commands that take no other statistics flag."""
    return click.option(
        "--block-size",
        type=_BLOCK_SIZE[2],
        default=_DEFAULTS.block_size,
        show_default=True,
        help=_BLOCK_SIZE[3],
    )(command)


TAXONOMY_CHOICE = click.Choice(["30", "20", "10"])


def backbone_options(command: F) -> F:
    """The flags that choose the backbone and the head (shared with ``train-head``)."""
    command = click.option(
        "--device", default=None, help="torch device (default: cuda when present, else cpu)."
    )(command)
    return click.option(
        "--backbone",
        type=click.Path(file_okay=False),
        default=None,
        help="Local directory of the embedding model (default: "
        "intfloat/multilingual-e5-large-instruct from the model cache, else the packaged "
        "all-MiniLM-L6-v2).",
    )(command)


def read_taxonomy_file(path: Path) -> tuple[str, ...]:
    """The intents a ``--taxonomy-file`` adds: one name a line, ``#`` starts a comment.

    ValueError naming the file and line for an unreadable file or a bad name.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--taxonomy-file {path}: cannot read it ({exc})") from None
    names: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        try:
            label_map(30, [name])
        except ValueError as exc:
            raise ValueError(f"--taxonomy-file {path}:{lineno}: {exc}") from None
        if name not in names:
            names.append(name)
    return tuple(names)


TAXONOMY_HELP = "Intent categories (30, or the IAC paper's 20 or 10 merges)."
TAXONOMY_FILE_HELP = (
    "File of intents to count as states of their own, one a line (a producer's intent outside "
    "the taxonomy and this file counts as unknown)."
)


def taxonomy_options(command: F) -> F:
    """``--taxonomy`` and ``--taxonomy-file``; :func:`pop_label_map` turns them into a map."""
    command = click.option(
        "--taxonomy-file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        envvar="KVCAST_TAXONOMY_FILE",
        show_envvar=True,
        help=TAXONOMY_FILE_HELP,
    )(command)
    return click.option(
        "--taxonomy",
        type=TAXONOMY_CHOICE,
        default="30",
        show_default=True,
        envvar="KVCAST_TAXONOMY",
        show_envvar=True,
        help=TAXONOMY_HELP,
    )(command)


def pop_label_map(kwargs: dict[str, Any]) -> dict[str, str]:
    """Remove ``--taxonomy`` and ``--taxonomy-file`` from ``kwargs``: producer label -> state."""
    size, path = int(kwargs.pop("taxonomy")), kwargs.pop("taxonomy_file")
    try:
        return label_map(size, read_taxonomy_file(path) if path is not None else ())
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def log_format_option(command: F) -> F:
    """``--log-format text|json`` (``KVCAST_LOG_FORMAT``), for the commands that run long."""
    return click.option(
        "--log-format",
        type=click.Choice(LOG_FORMATS),
        default="text",
        show_default=True,
        envvar="KVCAST_LOG_FORMAT",
        show_envvar=True,
        help="text: lines for people; json: one object per line (time, level, logger, "
        "message, pid, worker, exception).",
    )(command)


class TierSpec(click.ParamType):
    """``NAME=BLOCKS``, a tier below the GPU (``kvcast.stats.tiers.parse_tier``)."""

    name = "NAME=BLOCKS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Tier):
            return value
        try:
            return parse_tier(value)
        except ValueError as exc:
            self.fail(f"{exc}{_layer(ctx, param)}", param, ctx)


def tier_options(command: F) -> F:
    """``--tier NAME=BLOCKS`` (repeatable, in order below the GPU tier) and ``--tier-mode``;
    :func:`pop_tiers` checks them together with ``--capacity-blocks``."""
    command = click.option(
        "--tier-mode",
        type=click.Choice(TIER_MODES),
        default=DEFAULT_TIER_MODE,
        show_default=True,
        envvar="KVCAST_TIER_MODE",
        show_envvar=True,
        help="exclusive: a block evicted from a tier moves to the next, a hit moves it back to "
        "the GPU; inclusive: write-through, every tier keeps what the tiers above hold.",
    )(command)
    return click.option(
        "--tier",
        "tiers",
        type=TierSpec(),
        multiple=True,
        envvar="KVCAST_TIER",
        show_envvar=True,
        help="A cache tier below the GPU tier (--capacity-blocks) as NAME=BLOCKS, blocks per "
        "instance; repeat in order, top first: --tier host=200000 --tier disk=2000000.",
    )(command)


def pop_tiers(kwargs: dict[str, Any], capacity_blocks: float) -> tuple[tuple[Tier, ...], str]:
    """Remove ``--tier`` and ``--tier-mode`` from ``kwargs``; UsageError naming the flag."""
    tiers, mode = tuple(kwargs.pop("tiers") or ()), kwargs.pop("tier_mode")
    try:
        check_tiers(capacity_blocks, tiers, mode)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--tier'") from None
    return tiers, mode
