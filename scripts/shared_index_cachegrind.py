"""What the shared-prefix index costs the daemon's pipeline, counted instead of timed.

    .venv/bin/python scripts/shared_index_cachegrind.py [CONVERSATIONS]

On a shared 2-core machine the wall clock of `kvcast bench --suite throughput` moves by more
than any one change to the index is worth (the same command's rate moved from 37 K to 56 K
events/s between runs minutes apart). Valgrind's cachegrind counts instead: the instructions
the pipeline executes and its data-cache misses in a simulated last level the size of this
machine's L2 (a miss there is a trip to L3, the index's cost on a busy core). The workload is
the bench's (`shared_system`, lambda 2, seed 0, a quarter of 20,000 conversations); each side
runs the pipeline once and twice in separate processes, and the difference is one run, so
start-up is not counted. Needs `valgrind` on the PATH (not a product dependency); about four
minutes here, two processes at a time.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

COUNTS = re.compile(r"(I\s+refs|LLd misses):\s+([\d,]+)")


def child(lines_path: str, mode: str, runs: int) -> None:
    """The pipeline on the pickled lines, ``runs`` times (what valgrind runs)."""
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


def counted(lines_path: str, mode: str, runs: int) -> tuple[int, int]:
    """(instructions, last-level data misses) of the child under cachegrind."""
    command = [
        "valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--LL={l2_bytes()},16,64",
        "--cachegrind-out-file=/dev/null",
        sys.executable, __file__, "--child", lines_path, mode, str(runs),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    found = dict(COUNTS.findall(done.stderr))
    return int(found["I   refs"].replace(",", "")), int(found["LLd misses"].replace(",", ""))


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    from kvcast.lab.workload.generator import generate
    from kvcast.lab.workload.presets import preset

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    trace = generate(preset("shared_system"), lambda0=2.0, conversations=count, seed=0)
    lines = list(trace.jsonl_lines())
    with tempfile.TemporaryDirectory() as scratch:
        lines_path = str(Path(scratch) / "lines.pickle")
        Path(lines_path).write_bytes(pickle.dumps(lines))
        jobs = [(mode, runs) for mode in ("off", "on") for runs in (1, 2)]
        with ThreadPoolExecutor(2) as pool:
            found = pool.map(lambda job: counted(lines_path, *job), jobs)
            results = dict(zip(jobs, found, strict=True))
    per_event = {
        mode: [
            (two - one) / len(lines)
            for one, two in zip(results[mode, 1], results[mode, 2], strict=True)
        ]
        for mode in ("off", "on")
    }
    print(f"{len(lines):,} events (shared_system), L2 of {l2_bytes() // 1024} KiB simulated")
    print("| index | instructions / event | L2 misses / event |")
    print("|---|---|---|")
    for mode in ("off", "on"):
        instructions, misses = per_event[mode]
        print(f"| {mode} | {instructions:,.0f} | {misses:.1f} |")
    (off_i, off_m), (on_i, on_m) = per_event["off"], per_event["on"]
    print(f"index on costs {on_i - off_i:,.0f} instructions and {on_m - off_m:.1f} L2 misses an "
          f"event more; instructions off / on {off_i / on_i:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
