"""Coverage-guided fuzzing (atheris/libFuzzer) of the event contract and the pipeline, bounded.

What is fuzzed (targets in ``fuzz_targets.py``, kvcast's modules instrumented):

- ``parse``: raw bytes into ``parse_event``, from a seed corpus of valid events and a dictionary
  of the contract's field names and JSON tokens;
- ``pipeline``: sequences of up to 50 events (valid-looking objects with fields dropped,
  duplicated or given fuzzed values of any type, raw numeric text, lone surrogates, raw bytes)
  through a ``Pipeline`` with a small fuzzed ``StatsConfig``, then ``finish()`` and
  ``snapshot()``.

How long: each target runs in a subprocess for at most 20 s (``-max_total_time``) or a cap on
runs, whichever comes first, with a fixed ``-seed``: about 45 s for both on a 2-core machine.

A failure is any input for which kvcast raises an exception other than ``EventRejected``, or
breaks an invariant: a rejection reason outside ``REJECT_REASONS``, a rejection detail that is
long or echoes a string of the event, an accepted event that breaks the contract or differs from
the payload, the fast path and the detailed validator disagreeing, counters that do not add up
to the events offered, a snapshot probability outside [0, 1]. The test then shows the
traceback and the input (also kept as ``crash-*`` under the test's tmp_path). Too few runs
(the fuzzer barely ran) fail as well.

A longer campaign by hand (the corpus directory is seeded when empty and grows; a crash input
is written to ``crash-<sha1>`` in the current directory and replays with
``python -m tests.reliability.fuzz_targets parse crash-<sha1>``)::

    .venv/bin/python -m tests.reliability.fuzz_targets parse -max_total_time=3600 corpus/
    .venv/bin/python -m tests.reliability.fuzz_targets pipeline -max_total_time=3600 corpus-p/
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.tally import TALLY
from tests.services import unavailable

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SECONDS_PER_TARGET = 20
# (runs cap, fewest runs that count as having fuzzed): the cap ends the run before the time
# limit on a fast machine; the minimum is far below what a slow, busy machine does in the time
# (parse ~10,000 runs/s, pipeline ~130/s on a shared 2-core machine). The fixed -seed makes
# runs comparable, not identical: libFuzzer's schedule drifts after a few thousand inputs.
BOUNDS = {"parse": (300_000, 5_000), "pipeline": (5_000, 300)}
FUZZ_LINE = re.compile(r"^FUZZ target=(\w+) status=(\w+) rc=(-?\d+) runs=(\d+) cov=(\d+)", re.M)


def require_atheris() -> None:
    """Fail in CI (atheris is in the ``test`` extra), skip elsewhere, when it is missing."""
    if importlib.util.find_spec("atheris") is None:
        unavailable("atheris is not installed; install the test extra: pip install -e '.[test]'")


def failure_report(stderr: str, artifacts: Path) -> str:
    """The fuzzer's traceback and the failing input(s), for the assertion message."""
    start = stderr.find("=== Uncaught Python exception")
    if start < 0:
        start = max(0, len(stderr) - 4000)
    lines = [stderr[start : start + 6000]]
    for crash in sorted(artifacts.glob("*-*")):
        data = crash.read_bytes()
        lines.append(f"{crash.name} ({len(data)} bytes): {data[:2000]!r}")
    return "\n".join(lines)


@pytest.mark.parametrize("target", ["parse", "pipeline"])
def test_fuzz_target_finds_nothing(target: str, tmp_path: Path) -> None:
    require_atheris()
    max_runs, min_runs = BOUNDS[target]
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    command = [
        sys.executable, "-m", "tests.reliability.fuzz_targets", target,
        "-seed=1", f"-runs={max_runs}", f"-max_total_time={SECONDS_PER_TARGET}",
        "-timeout=30", "-rss_limit_mb=2048", f"-artifact_prefix={artifacts}/",
    ]  # fmt: skip
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=SECONDS_PER_TARGET + 100,
    )
    summary = FUZZ_LINE.search(result.stdout)
    assert summary is not None, f"no FUZZ line; rc={result.returncode}\n{result.stderr[-4000:]}"
    _, status, rc, runs, cov = summary.groups()
    runs_done = int(runs)
    TALLY.add(hostile_inputs=runs_done)
    assert result.returncode == 0 and status == "ok", (
        f"the {target} fuzzer found a failing input after {runs_done} runs (rc={rc}):\n"
        + failure_report(result.stderr, artifacts)
    )
    assert runs_done >= min_runs, (
        f"the {target} fuzzer ran only {runs_done} inputs (fewer than {min_runs}); cov={cov}"
    )
    print(summary.group(0))
