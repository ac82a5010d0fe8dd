"""How a setting is declared once: its flag, kind, help and rule, beside its field and default.

A field made with :func:`setting` carries a :class:`Setting` in its metadata (under
:data:`SETTING`); ``kvcast.daemon.settings`` declares the daemon's and
``kvcast.stats.config`` the statistics engine's, the CLI makes its options
from them and the settings check their values by them. A kind (:class:`Number`,
:class:`Choice`, :class:`Text`) says what a value must be and, in words, why one is refused.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

SETTING = "kvcast.setting"  # the key of a declared field's metadata


@dataclass(frozen=True)
class Number:
    """An ``int`` or a ``float`` within bounds; an open bound is itself refused."""

    type: type[int] | type[float]
    min: float | None = None
    max: float | None = None
    min_open: bool = False
    max_open: bool = False

    def describe(self) -> str:
        """``an integer >= 1 and <= 64``, ``a number > 0``."""
        low = None if self.min is None else f"{'>' if self.min_open else '>='} {self.min:g}"
        high = None if self.max is None else f"{'<' if self.max_open else '<='} {self.max:g}"
        kind = "an integer" if self.type is int else "a number"
        return " ".join([kind, " and ".join(bound for bound in (low, high) if bound)]).strip()

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is refused, or None."""
        number = numbers.Integral if self.type is int else numbers.Real
        if isinstance(value, bool) or not isinstance(value, number):
            return f"must be {self.describe()}, got {value!r}"
        fits = not math.isnan(value)
        if self.min is not None:
            fits = fits and (value > self.min if self.min_open else value >= self.min)
        if self.max is not None:
            fits = fits and (value < self.max if self.max_open else value <= self.max)
        return None if fits else f"must be {self.describe()}, got {value!r}"


@dataclass(frozen=True)
class Choice:
    """One of ``values`` (the CLI offers them as strings, ``--taxonomy 20``)."""

    values: tuple[Any, ...]

    def problem(self, value: Any) -> str | None:
        if value in self.values:
            return None
        names = [str(choice) for choice in self.values]
        return f"must be {', '.join(names[:-1])} or {names[-1]}, got {value!r}"


@dataclass(frozen=True)
class Text:
    """A string."""

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, str) else f"must be a string, got {value!r}"


@dataclass(frozen=True)
class Setting:
    """How one field of a settings dataclass is set: ``--flag``, ``KVCAST_FLAG`` and the
    config key ``flag``. ``many``: a repeatable flag (its variable takes the values separated
    by spaces), a TOML list, a tuple; ``separator``: one string split into a tuple (``a,b``).
    ``check``: a further rule, the whole message (naming the value) or None."""

    flag: str
    kind: Number | Choice | Text
    help: str
    many: bool = False
    separator: str | None = None
    check: Callable[[Any], str | None] | None = None

    @property
    def key(self) -> str:
        """The config file's key (``commit-interval``; the field's name is accepted too)."""
        return self.flag.removeprefix("--")

    @property
    def envvar(self) -> str:
        return "KVCAST_" + self.key.upper().replace("-", "_")

    def where(self) -> str:
        """``--commit-interval, KVCAST_COMMIT_INTERVAL or config key commit-interval``."""
        return f"{self.flag}, {self.envvar} or config key {self.key}"

    def problems(self, name: str, value: Any, optional: bool) -> Iterator[str]:
        """What is wrong with ``value`` for the field ``name``, each saying where it is set."""
        if value is None and optional:
            return
        for item in value if self.many or self.separator else (value,):
            problem = self.kind.problem(item)
            if problem is not None:
                yield f"{name} {problem} (set by {self.where()})"
            elif self.check is not None and (message := self.check(item)) is not None:
                yield f"{message} (set by {self.where()})"


def setting(default: Any, flag: str, kind: Number | Choice | Text, help: str, **how: Any) -> Any:
    """A dataclass field with its default and its :class:`Setting`."""
    return field(default=default, metadata={SETTING: Setting(flag, kind, help, **how)})


def declared_settings(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Setting]]:
    """Each declared field of the dataclass ``cls`` with its setting, in field order."""
    for found in dataclasses.fields(cls):
        if SETTING in found.metadata:
            yield found, found.metadata[SETTING]
