"""Same results: the working tree's statistics against an older commit's, on hostile workloads.

    .venv/bin/python scripts/equivalence_ab.py REV [--conversations 3000]

For a performance change that must not change a single number. Each workload (the ``single``,
``mixed`` and ``lognormal`` presets, locally shuffled, with duplicated and malformed lines, under
the default and a tight configuration) goes through the old code (``git archive REV``, imported
as in ``perf_ab.py``) and the new, each in a fresh process, two ways: the replay pipeline
(``Pipeline``: counters, arrival counters, window buckets, snapshot) and per-partition engines
committing every 500 events (``PartitionEngine.take_delta``: every delta, open conversations
decoded). The dumps must be equal. Orders that carry no meaning (delay samples within a bucket,
the order conversations completed in, dict order) are normalised; everything else, floats
included, must match exactly. Exits 1 on the first difference, naming the workload and path.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from perf_ab import ROOT, export

DUMP = r"""
import json, random, sys
old_root, preset_name, tight = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
conversations = int(sys.argv[4])
if old_root:
    sys.path.insert(0, old_root)
from kvcast.stats.config import StatsConfig
from kvcast.stats.events import EventRejected, parse_event
from kvcast.stats.partition import PartitionEngine, decode_conversation
# Both layouts, since the old revision may have either: the packages by role first, then the
# one before them (10bbadf and older: daemon/pipeline.py, stats/generator.py).
try:
    from kvcast.stats.replay import Pipeline
    from kvcast.lab.workload.generator import generate
    from kvcast.lab.workload.presets import preset
except ImportError:
    from kvcast.daemon.pipeline import Pipeline
    from kvcast.stats.generator import generate, preset

config = (
    StatsConfig(max_turn=3, completion_timeout_s=60.0, max_open_conversations=50,
                allowed_lateness_s=5.0)
    if tight else StatsConfig()
)
trace = generate(preset(preset_name), lambda0=3.0, conversations=conversations, seed=11)
lines = list(trace.jsonl_lines())
rng = random.Random(5)
for i in range(0, len(lines) - 8, 8):  # local disorder within the allowed lateness, mostly
    chunk = lines[i:i + 8]
    rng.shuffle(chunk)
    lines[i:i + 8] = chunk
for i in rng.sample(range(len(lines)), len(lines) // 20):
    lines.append(lines[i])  # duplicates, some of them late
for bad in (b"{", b"[]", b'{"schema": 2}', b'{"session_id": "", "turn": 1}'):
    lines.insert(rng.randrange(len(lines)), bad)

def gap_pairs(gaps):
    # as [gap_s, blocks] pairs, from the pairs of older revisions or from the flat form
    if gaps and isinstance(gaps[0], (tuple, list)):
        return [list(p) for p in gaps]
    return [list(p) for p in zip(gaps[0::2], gaps[1::2])]

def turn_dump(record):
    row = list(record)
    if len(row) > 5:
        row[5] = gap_pairs(row[5])
    return row

def bucket_dump(bucket):
    return {
        "shared_gaps": sorted(gap_pairs(getattr(bucket, "shared_gaps", []))),
        "conversations": bucket.conversations,
        "states": sorted([k[0], k[1], s.reached, s.continued] for k, s in bucket.states.items()),
        "moments": sorted([i, m.conversations, m.sum_R, m.sum_H, m.sum_H_hash, m.sum_B, m.sum_M]
                          for i, m in bucket.moments.items()),
        "delays": sorted(list(d) for d in bucket.delays),
    }

def arrivals_dump(a):
    return [a.first_start, a.newest_start, a.start_count,
            sorted([s, c.starts, c.cached_tokens, c.input_tokens] for s, c in a.seconds.items())]

def conversation_dump(c):
    return [c.session_id, c.last_ts, sorted([t, turn_dump(r)] for t, r in c.turns.items()),
            list(getattr(c, "held", ()))]

pipeline = Pipeline(config)
for line in lines:
    pipeline.offer(line)
engine = pipeline.engine
engine.finish()
replay = {
    "counters": engine.counters.to_dict(),
    "arrivals": arrivals_dump(engine.arrivals),
    "buckets": {str(i): bucket_dump(b) for i, b in sorted(engine.window.buckets.items())},
    "snapshot": repr(engine.snapshot()),
}

engines = [PartitionEngine(config, f"p{p}") for p in range(3)]
deltas = []
for offset, line in enumerate(lines):
    part = engines[offset % 3]
    try:
        event = parse_event(line)
    except EventRejected as rejection:
        part.reject(rejection.reason, offset)
    else:
        part.apply(event, event.intent or "unknown", offset)
    if offset % 500 == 499:
        for part in engines:
            d = part.take_delta()
            deltas.append({
                "partition": d.partition, "base": d.base_offset, "offset": d.offset,
                "newest_ts": d.newest_ts,
                "upserts": sorted(conversation_dump(decode_conversation(s, p))
                                  for s, p in d.upserts.items()),
                "removals": sorted(d.removals), "ids_added": sorted(d.ids_added.items()),
                "ids_removed": sorted(d.ids_removed),
                "buckets": {str(i): bucket_dump(b) for i, b in sorted(d.buckets.items())},
                "arrivals": arrivals_dump(d.arrivals), "counters": d.counters.to_dict(),
                # the shared-prefix table's changes (revisions that have them), in their order
                "shared_upserts": list(getattr(d, "shared_upserts", {}).items()),
                "shared_removals": list(getattr(d, "shared_removals", [])),
            })
for part in engines:
    part.flush()
    d = part.take_delta()
    deltas.append({"partition": d.partition, "removals": sorted(d.removals),
                   "buckets": {str(i): bucket_dump(b) for i, b in sorted(d.buckets.items())}})
if old_root:  # the old revision's code alone (see perf_ab.export), none of the working tree's
    modules = [m for name, m in sys.modules.items() if name.startswith("kvcast.")]
    files = [getattr(m, "__file__", None) for m in modules]
    mixed = [f for f in files if f and not f.startswith(old_root)]
    if mixed:
        sys.exit(f"working tree modules in the old revision's process: {mixed}")
print(json.dumps({"replay": replay, "deltas": deltas}, sort_keys=True, default=str))
"""


def first_difference(old: object, new: object, path: str = "$") -> str | None:
    """Where two JSON values first differ (a path like ``$.replay.buckets.12``), or None."""
    if type(old) is not type(new):
        return f"{path}: {type(old).__name__} vs {type(new).__name__}"
    if isinstance(old, dict):
        assert isinstance(new, dict)
        for key in sorted(set(old) | set(new)):
            if key not in old or key not in new:
                return f"{path}.{key}: only in {'new' if key not in old else 'old'}"
            found = first_difference(old[key], new[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(old, list):
        assert isinstance(new, list)
        for index, (a, b) in enumerate(zip(old, new, strict=False)):
            found = first_difference(a, b, f"{path}[{index}]")
            if found:
                return found
        return None if len(old) == len(new) else f"{path}: length {len(old)} vs {len(new)}"
    return None if old == new else f"{path}: {old!r} vs {new!r}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rev")
    parser.add_argument("--conversations", type=int, default=3000)
    parser.add_argument(
        "--presets",
        default="single,mixed,lognormal",
        help="comma-separated generator presets (shared_system, agent: events with block_hashes)",
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvcast-eq-") as tmp:
        old_path = export(options.rev, Path(tmp))
        for preset_name in options.presets.split(","):
            for tight in ("0", "1"):
                dumps = []
                for root in (str(old_path), ""):
                    done = subprocess.run(
                        [sys.executable, "-c", DUMP, root, preset_name, tight,
                         str(options.conversations)],
                        cwd=ROOT, capture_output=True, text=True,
                    )  # fmt: skip
                    if done.returncode:
                        print(done.stderr, file=sys.stderr)
                        return 2
                    dumps.append(json.loads(done.stdout))
                where = first_difference(dumps[0], dumps[1])
                name = f"{preset_name}{' (tight)' if tight == '1' else ''}"
                deltas = len(dumps[1]["deltas"])
                if where:
                    print(f"DIFFERENT {name}: {where}")
                    return 1
                print(f"same      {name}: replay and {deltas} partition deltas")
    return 0


if __name__ == "__main__":
    sys.exit(main())
