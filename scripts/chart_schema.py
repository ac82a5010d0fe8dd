"""The ``config`` part of the Helm chart's values schema, generated from ``kvcast run``'s flags.

    .venv/bin/python scripts/chart_schema.py          # rewrite properties.config
    .venv/bin/python scripts/chart_schema.py --check  # exit 1 when it is out of date

``deploy/helm/kvcast/values.yaml``'s ``config`` becomes kvcast.toml, whose keys are the flags'
names. Deriving the schema from the flags means ``helm install`` rejects a misspelt key or a
value of the wrong type before a pod starts, with the flag's own bounds and choices, and a new
flag cannot be forgotten: ``tests/deploy/test_helm.py`` runs ``--check``. The rest of the
schema is written by hand and left as it is.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import click

from kvcast.cli.commands.run import run

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "deploy" / "helm" / "kvcast" / "values.schema.json"

# Flags that have no place in the chart's kvcast.toml, and why.
LEFT_OUT = {
    "config": "the chart passes --config itself",
    "print-config": "makes kvcast exit",
    "metrics-addr": "set from http.port, which the probes and the Service use too",
    "store": "a URL with a password: it comes from the credentials Secret (KVCAST_STORE)",
    "kafka-sasl-password": "a password: it comes from the credentials Secret",
}


def _number(option: click.Option, kind: str) -> dict[str, Any]:
    found: dict[str, Any] = {"type": kind}
    param = option.type
    for bound, opened, inclusive, exclusive in (
        (param.min, param.min_open, "minimum", "exclusiveMinimum"),  # type: ignore[attr-defined]
        (param.max, param.max_open, "maximum", "exclusiveMaximum"),  # type: ignore[attr-defined]
    ):
        if bound is not None and math.isfinite(bound):
            found[exclusive if opened else inclusive] = bound
    return found


def _value_schema(option: click.Option) -> dict[str, Any]:
    """The JSON schema of one flag's value in kvcast.toml."""
    if option.is_flag:
        return {"type": "boolean"}
    if isinstance(option.type, click.Choice):
        return {"type": "string", "enum": list(option.type.choices)}
    if isinstance(option.type, click.types.IntParamType):
        return _number(option, "integer")
    if isinstance(option.type, click.types.FloatParamType):
        return _number(option, "number")
    return {"type": "string", "minLength": 1}


def config_schema() -> dict[str, Any]:
    """``properties.config`` of the values schema: one property per config key."""
    properties: dict[str, Any] = {}
    for option in run.params:
        if not isinstance(option, click.Option):
            continue
        key = option.opts[0].lstrip("-")
        if key in LEFT_OUT:
            continue
        value = _value_schema(option)
        if option.multiple:
            value = {"type": "array", "items": value, "minItems": 1}
        first_line = (option.help or "").split(". ")[0].strip().rstrip(".")
        properties[key] = {"description": first_line, **value} if first_line else value
    return {
        "type": "object",
        "description": "kvcast run settings written to kvcast.toml (keys are flag names).",
        "additionalProperties": False,
        "properties": dict(sorted(properties.items())),
    }


def rendered() -> str:
    """The schema file with its config part generated."""
    schema = json.loads(SCHEMA.read_text())
    schema["properties"]["config"] = config_schema()
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when out of date")
    args = parser.parse_args(argv)
    text = rendered()
    if args.check:
        if SCHEMA.read_text() != text:
            print(f"{SCHEMA} is out of date: rerun scripts/chart_schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
