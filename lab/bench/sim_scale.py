"""The block simulator at agent scale (issue 33 item 5): ``kvcast simulate --granularity block``
over ~10 M block references of the generated ``agent`` preset, per policy and capacity.

Each run is the user's command in a process of its own (``python -m kvcast.cli.main simulate
FILE --json``), so its figures are the whole command's: reading the JSONL file, building the
block trie, simulating, measuring. Wall seconds are the process's; peak memory is its maximum
resident set (``os.wait4``'s ``ru_maxrss``). The budget the issue sets: 2 GB and a few minutes
(180 s) per run. The figures move with the machine's load (the CPU may be shared).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset

BUDGET_BYTES = 2 * 10**9
BUDGET_S = 180.0
POLICIES = ("lru", "iac", "density")
CAPACITIES = (1000, 16000)  # blocks of 1,024 tokens: a few contexts, and most of the working set


@dataclass(frozen=True)
class SimRun:
    """One ``kvcast simulate`` process: ``wall_s`` whole command, ``load_s`` reading the file,
    ``simulate_s`` the policy's run (its JSON's ``elapsed_s``), ``peak_rss_bytes``."""

    policy: str
    capacity_blocks: int
    wall_s: float
    load_s: float
    simulate_s: float
    peak_rss_bytes: int
    hit_ratio: float
    references_per_s: float


@dataclass(frozen=True)
class SimScaleResult:
    """The workload (``references``: block references, ``requests``, ``conversations``, roots
    and sub-agents) and every run."""

    conversations: int
    requests: int
    references: int
    block_size: int
    seed: int
    runs: list[SimRun] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["budget_bytes"], out["budget_s"] = BUDGET_BYTES, BUDGET_S
        out["within_budget"] = all(
            r.peak_rss_bytes <= BUDGET_BYTES and r.wall_s <= BUDGET_S for r in self.runs
        )
        return out

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(benchmark, figure, baseline, ratio) rows: each run against the issue's budget."""
        refs = f"{self.references / 1e6:.1f} M block refs"
        return [
            (
                f"kvcast simulate --granularity block --policy {r.policy}, agent preset, {refs}, "
                f"{r.capacity_blocks:,} blocks",
                f"{r.references_per_s / 1e3:,.0f} K refs/s ({r.wall_s:.0f} s; simulation "
                f"{r.simulate_s:.0f} s), peak {r.peak_rss_bytes / 1e9:.2f} GB",
                f"budget {BUDGET_S:.0f} s, {BUDGET_BYTES / 1e9:.0f} GB",
                f"{r.wall_s / BUDGET_S:.2f} of the time, "
                f"{r.peak_rss_bytes / BUDGET_BYTES:.2f} of the memory",
            )
            for r in self.runs
        ]


def _simulate(path: Path, policy: str, capacity: int, block_size: int) -> SimRun:
    cmd = [sys.executable, "-m", "kvcast.cli.main", "simulate", str(path), "--policy", policy]
    cmd += ["--granularity", "block", "--capacity-blocks", str(capacity)]
    cmd += ["--block-size", str(block_size), "--json"]
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f)
        # Reap the child here (not proc.wait()): wait4 gives its own resource usage.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    if code != 0:
        raise RuntimeError(
            f"kvcast simulate --policy {policy} exited {code}: {err.decode()[-500:]}"
        )
    got = orjson.loads(out)
    return SimRun(
        policy=policy,
        capacity_blocks=capacity,
        wall_s=wall,
        load_s=float(got["load_s"]),
        simulate_s=float(got["elapsed_s"]),
        peak_rss_bytes=int(usage.ru_maxrss) * 1024,  # Linux: kilobytes
        hit_ratio=float(got["hit_ratio"]),
        references_per_s=0.0,  # set by the caller, who knows the trace
    )


def run_sim_scale(
    conversations: int = 1000,
    *,
    capacities: tuple[int, ...] = CAPACITIES,
    policies: tuple[str, ...] = POLICIES,
    seed: int = 1,
    lambda0: float = 0.02,
    progress: Any = None,
) -> SimScaleResult:
    """Generate the agent preset (1,000 root conversations at seed 1: 10.0 M references of
    1,024-token blocks) to a temporary file and time ``kvcast simulate`` on it per policy and
    capacity (``progress(line)`` after each run)."""
    trace = generate(preset("agent"), lambda0=lambda0, conversations=conversations, seed=seed)
    references, requests, total = int(trace.blocks.sum()), len(trace), trace.conversations
    runs: list[SimRun] = []
    with tempfile.TemporaryDirectory(prefix="kvcast-sim-scale-") as tmp:
        path = Path(tmp) / "agent.jsonl"
        with open(path, "wb") as fh:
            for line in trace.jsonl_lines():
                fh.write(line)
        del trace  # the child processes read the file; this one holds nothing big meanwhile
        for capacity in capacities:
            for policy in policies:
                run = _simulate(path, policy, capacity, 1024)
                run = SimRun(**{**asdict(run), "references_per_s": references / run.wall_s})
                runs.append(run)
                if progress is not None:
                    progress(
                        f"sim-scale {policy} at {capacity:,} blocks: {run.wall_s:.1f} s, "
                        f"peak {run.peak_rss_bytes / 1e9:.2f} GB, hit ratio {run.hit_ratio:.3f}"
                    )
    return SimScaleResult(total, requests, references, 1024, seed, runs)
