"""Write (or, with --check, verify) docs/event.schema.json from the decoder's types."""

from __future__ import annotations

import sys
from pathlib import Path

from kvcast.stats.event_schema import render_event_schema

PATH = Path(__file__).resolve().parents[1] / "docs" / "event.schema.json"


def main(argv: list[str]) -> int:
    if "--check" in argv:
        if not PATH.exists() or PATH.read_text() != render_event_schema():
            print(f"{PATH.name} is out of date: run `.venv/bin/python scripts/event_schema.py`",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0
    PATH.write_text(render_event_schema())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
