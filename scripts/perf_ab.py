"""Before/after figures: the working tree against an older commit, alternating, same machine.

    .venv/bin/python scripts/perf_ab.py REV throughput|daemon [--rounds 2] [--no-hiredis-before]
    .venv-vllm/bin/python scripts/perf_ab.py REV engines [--rounds 3]

The old code is exported with ``git archive REV`` into a temporary directory and imported from
there alone (a ``kvcast`` package of symlinks to its top-level folders, first on ``sys.path``,
its C extension built in place); each measurement runs in a fresh process, old and new taking
turns, and prints one JSON line.
``daemon`` needs the broker and Redis of ``scripts/services.sh start``. The figures are those of
``kvcast bench`` (throughput: the replay pipeline against ``orjson.loads``, and the daemon
pipeline on block ids with the shared-prefix index on against off; daemon: Kafka ->
Redis against the bare consumer, and the flush cost per event; engines: kvcast's queue in
vLLM's ``BlockPool`` against vLLM's own, per kind, with the engines' venv of
``scripts/engine_venv.sh``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Top-level folders of either layout (lab/ and cli/ came with the packages by role, after 10bbadf).
PACKAGES = ("stats", "daemon", "classifier", "exporters", "lab", "cli")

# The exported package's __init__: without it the working tree's editable install (a finder at
# the end of sys.meta_path) would serve every module the old tree lacks from the working tree,
# kvcast.stats.replay in a tree that has kvcast.daemon.pipeline, say, mixing new code into old.
OLD_INIT = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not f.__module__.startswith("__editable__")]
"""

MEASURE = """
import json, sys
old_root, suite, block_hiredis = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if old_root:
    sys.path.insert(0, old_root)
    if block_hiredis:
        sys.modules["hiredis"] = None
try:
    from kvcast.daemon.gc_tuning import tune_for_streaming
except ImportError:  # older code had no tuning
    pass
else:
    tune_for_streaming()
# Each import tries the layout by role (lab/bench) first, then the one before it (daemon/bench,
# 10bbadf and older): the old tree may have either.
if suite == "throughput":
    try:
        from kvcast.lab.bench.throughput import run_throughput
    except ImportError:
        from kvcast.daemon.bench.throughput import run_throughput
    r = run_throughput(repeats=3)
    out = {"pipeline_per_s": r.pipeline_per_s, "decode_per_s": r.decode_per_s,
           "ratio": r.pipeline_per_s / r.decode_per_s}
    if getattr(r, "shared_index_off_per_s", 0.0):  # the shared-prefix index's row, where kept
        out |= {"index_on_per_s": r.shared_index_per_s,
                "index_off_per_s": r.shared_index_off_per_s,
                "index_ratio": r.shared_index_per_s / r.shared_index_off_per_s}
elif suite == "engines":
    from kvcast.lab.bench.engine_bench import run_engine_bench
    r = run_engine_bench(repeats=3)
    out = {"stock_get_ns": r.get_ns["stock"], "stock_free_ns": r.free_ns["stock"]}
    for kind in ("tagged", "density"):
        out[f"{kind}_get_x"] = r.get_ns[kind] / r.get_ns["stock"]
        out[f"{kind}_free_x"] = r.free_ns[kind] / r.free_ns["stock"]
else:
    try:
        from kvcast.lab.bench import daemon_bench as d
    except ImportError:
        from kvcast.daemon.bench import daemon_bench as d
    b, url = "127.0.0.1:19092", "redis://127.0.0.1:6379/0"
    topic, count = d._produce(b, 40000)
    bare, daemon = d._bare_consume(b, topic, count), d._daemon_throughput(b, url, topic, count)
    daemon = getattr(daemon, "events_per_s", daemon)  # older code returned the rate alone
    flush, apply, _ = d._flush_cost(url)
    out = {"daemon_per_s": daemon, "bare_per_s": bare, "ratio": daemon / bare,
           "flush_us_per_event": flush * 1e6, "apply_us_per_event": apply * 1e6}
print(json.dumps(out))
"""


def export(rev: str, into: Path) -> Path:
    """``git archive REV`` under ``into``; returns the directory to put first on sys.path.

    The replay engine's C extension (``stats/_replay.c``, later ``stats/native/_replay.c``) is
    built in place by the old ``setup.py``; where that fails the old code runs its Python engine,
    as an install without a compiler does, and a warning says so.
    """
    tree = into / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    if (tree / "setup.py").exists():
        built = subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
            cwd=tree, capture_output=True, text=True,
        )  # fmt: skip
        if built.returncode or not any(tree.glob("stats/**/_replay*.so")):
            print(f"perf_ab: {rev}'s C extension did not build; its Python engine runs instead\n"
                  f"{built.stderr}", file=sys.stderr)  # fmt: skip
    package = into / "path" / "kvcast"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(OLD_INIT)
    for name in PACKAGES:
        if (tree / name).is_dir():
            (package / name).symlink_to(tree / name)
    return into / "path"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rev")
    parser.add_argument("suite", choices=("throughput", "daemon", "engines"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-hiredis-before", action="store_true", help="old code without it")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvcast-ab-") as tmp:
        old_path = export(options.rev, Path(tmp))
        for round_ in range(1, options.rounds + 1):
            for label, root in (("before", str(old_path)), ("after", "")):
                done = subprocess.run(
                    [sys.executable, "-c", MEASURE, root, options.suite,
                     "1" if options.no_hiredis_before else "0"],
                    cwd=ROOT, capture_output=True, text=True, check=True,
                )  # fmt: skip
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                print(json.dumps({"round": round_, "code": label, **figures}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
