"""What the shared-prefix index costs the daemon's pipeline, counted instead of timed.

    .venv/bin/python scripts/shared_index_cachegrind.py [CONVERSATIONS] [--rev REV]

On a shared 2-core machine the wall clock of `kvcast bench --suite throughput` moves by more
than any one change to the index is worth (the same command's rate moved from 37 K to 56 K
events/s between runs minutes apart). Valgrind's cachegrind counts instead: the instructions
the pipeline executes and its data-cache misses in a simulated last level the size of this
machine's L2 (a miss there is a trip to L3, the index's cost on a busy core). The workload is
the bench's (`shared_system`, lambda 2, seed 0, a quarter of 20,000 conversations); each side
runs the pipeline once and twice in separate processes, and the difference is one run, so
start-up is not counted. Needs `valgrind` on the PATH (not a product dependency); about four
minutes here, two processes at a time. With ``--rev REV`` the code of commit REV is counted
too, first (exported and built as ``perf_ab.py`` does; REV must have
``kvcast.lab.bench.throughput.daemon_pipeline``, b7bd6c1 or later): a before/after pair in one
command.
"""

from __future__ import annotations

import argparse
import pickle
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from perf_ab import export

COUNTS = re.compile(r"(I\s+refs|LLd misses):\s+([\d,]+)")


def child(lines_path: str, mode: str, runs: int, root: str) -> None:
    """The pipeline on the pickled lines, ``runs`` times (what valgrind runs); the code under
    ``root`` (an exported commit) where it is not empty, else the working tree's."""
    if root:
        sys.path.insert(0, root)
    from kvcast.daemon.gc_tuning import tune_for_streaming
    from kvcast.lab.bench.throughput import daemon_pipeline
    from kvcast.stats.config import StatsConfig

    tune_for_streaming()  # as `kvcast bench` runs it
    lines = pickle.loads(Path(lines_path).read_bytes())
    config = StatsConfig() if mode == "on" else StatsConfig(shared_index_blocks=0)
    for _ in range(runs):
        daemon_pipeline(lines, config)


def l2_bytes() -> int:
    """This machine's L2 cache size (bytes), 2 MiB where the kernel does not say."""
    path = Path("/sys/devices/system/cpu/cpu0/cache/index2/size")
    text = path.read_text().strip() if path.exists() else "2048K"
    return int(text[:-1]) * 1024 if text.endswith("K") else int(text)


def counted(lines_path: str, mode: str, runs: int, root: str = "") -> tuple[int, int]:
    """(instructions, last-level data misses) of the child under cachegrind."""
    command = [
        "valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--LL={l2_bytes()},16,64",
        "--cachegrind-out-file=/dev/null",
        sys.executable, __file__, "--child", lines_path, mode, str(runs), root,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    found = dict(COUNTS.findall(done.stderr))
    return int(found["I   refs"].replace(",", "")), int(found["LLd misses"].replace(",", ""))


def per_event(lines_path: str, events: int, root: str) -> dict[str, tuple[float, float]]:
    """Per index mode, (instructions, L2 misses) an event of one pipeline run of ``root``'s
    code: a run of two minus a run of one, so that start-up cancels."""
    jobs = [(mode, runs) for mode in ("off", "on") for runs in (1, 2)]
    with ThreadPoolExecutor(2) as pool:
        found = pool.map(lambda job: counted(lines_path, *job, root), jobs)
        results = dict(zip(jobs, found, strict=True))
    return {
        mode: tuple(  # type: ignore[misc]
            (two - one) / events
            for one, two in zip(results[mode, 1], results[mode, 2], strict=True)
        )
        for mode in ("off", "on")
    }


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("conversations", nargs="?", type=int, default=5000)
    parser.add_argument("--rev", help="also count the code of this commit (first)")
    options = parser.parse_args()
    from kvcast.lab.workload.generator import generate
    from kvcast.lab.workload.presets import preset

    trace = generate(
        preset("shared_system"), lambda0=2.0, conversations=options.conversations, seed=0
    )
    lines = list(trace.jsonl_lines())
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        lines_path = str(Path(scratch) / "lines.pickle")
        Path(lines_path).write_bytes(pickle.dumps(lines))
        builds = [("working tree", "")]
        if options.rev:
            builds.insert(0, (options.rev, str(export(options.rev, Path(scratch)))))
        for name, root in builds:
            rows.append((name, per_event(lines_path, len(lines), root)))
    print(f"{len(lines):,} events (shared_system), L2 of {l2_bytes() // 1024} KiB simulated")
    print("| build | instructions / event, index off | on | on - off "
          "| L2 misses / event, off | on | on - off |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, counts in rows:
        (off_i, off_m), (on_i, on_m) = counts["off"], counts["on"]
        print(f"| {name} | {off_i:,.0f} | {on_i:,.0f} | {on_i - off_i:,.0f} "
              f"| {off_m:.1f} | {on_m:.1f} | {on_m - off_m:.1f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
