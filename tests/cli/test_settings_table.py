"""docs/operating.md's table of ``kvcast run``'s settings is the one the command generates."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "chart_schema", ROOT / "scripts" / "chart_schema.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


table = _script()


def test_the_page_lists_every_setting_as_the_command_declares_it() -> None:
    assert table.main(["--check"]) == 0, "rerun .venv/bin/python scripts/chart_schema.py"
    page = table.DOC.read_text()
    # spot checks against the command's own words, so the table cannot be empty or shuffled
    assert "| `--commit-interval` | `KVCAST_COMMIT_INTERVAL` | `1.0` | Seconds between" in page
    assert "| `--taxonomy 30\\|20\\|10` | `KVCAST_TAXONOMY` | `30` |" in page
    assert "| `--target-hit-ratio` | `KVCAST_TARGET_HIT_RATIO` | `0.5` `0.7` |" in page


def test_a_stale_table_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    stale = tmp_path / "operating.md"
    stale.write_text(table.DOC.read_text().replace("`KVCAST_COMMIT_INTERVAL`", "`KVCAST_X`"))
    monkeypatch.setattr(table, "DOC", stale)
    assert table.main(["--check"]) == 1
    assert "is out of date" in capsys.readouterr().err
    assert table.main([]) == 0 and table.main(["--check"]) == 0
    assert "`KVCAST_COMMIT_INTERVAL`" in stale.read_text()
