"""A full disk cannot stop the daemon: it writes no file of its own (only logs, to stderr).

1. The daemon (classifier off) runs under ``strace -f`` with a working directory, HOME and
   TMPDIR that nothing should touch; every file-creating or file-writing system call outside
   ``/dev``, ``/proc`` and ``/sys`` is listed afterwards, and there must be none. (Tests run as
   root, where a read-only mode bit stops nothing, so the trace is the evidence.)
2. With the classifier ``auto`` (the packaged model loads when installed), torch's import
   probes the temporary directory (a file created and removed) and creates an empty
   ``torchinductor_<user>`` directory. So the daemon runs again in a mount namespace where
   its TMPDIR, HOME and cwd (one directory) and /var/tmp are full tmpfs file systems (no space,
   no inodes): it must start, keep statistics equal to the reference and exit 0 on SIGTERM.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import orjson
import pytest

from kvcast.lab.bench.processes import DaemonProcess, wait_until
from kvcast.lab.bench.soak import workload
from tests.reliability.tally import TALLY
from tests.services import missing

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WRITE_FLAGS = re.compile(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND")
CALLS = "trace=open,openat,openat2,creat,mkdir,mkdirat,rename,renameat,renameat2,unlink,unlinkat"


def file_writes(trace: str) -> list[str]:
    """System calls in an strace log that create, change or remove a file outside /dev."""
    found = []
    for line in trace.splitlines():
        if "= -1" in line or ("resumed>" in line and "(" not in line.split("resumed>")[0]):
            continue
        match = re.search(
            r"\b(open|openat|openat2|creat|mkdir|mkdirat|rename\w*|unlink\w*)\(", line
        )
        if match is None:
            continue
        path = re.search(r'"([^"]*)"', line)
        if path is not None and path.group(1).startswith(("/dev/", "/proc/", "/sys/")):
            continue
        if match.group(1).startswith("open") and not WRITE_FLAGS.search(line):
            continue
        found.append(line.strip())
    return found


def test_the_daemon_writes_no_file(tmp_path: Path, redis_url: str, redis_namespace: str) -> None:
    if shutil.which("strace") is None:
        missing("strace", "PATH", "the trace is this test's evidence")
    events = tmp_path / "input" / "events.jsonl"
    events.parent.mkdir()
    lines = workload(600, seed=12)
    with_text = [orjson.dumps({**orjson.loads(line), "prompt": "how do I sort a list?"})
                 for line in lines]  # fmt: skip
    events.write_bytes(b"\n".join(with_text) + b"\n")
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    env = {**os.environ, "HOME": str(sandbox), "TMPDIR": str(sandbox),
           "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1"}  # fmt: skip
    trace = tmp_path / "strace.log"
    logs = tmp_path / "logs"
    logs.mkdir()
    daemon = DaemonProcess(
        ["--source", f"file://{events}", "--store", redis_url, "--namespace", redis_namespace,
         "--metrics-addr", "127.0.0.1:0", "--refresh-interval", "0.3", "--classifier", "off",
         "--status-interval", "0.5", "--log-level", "debug"],
        logs / "daemon.log", env=env, cwd=sandbox,
        prefix=["strace", "-f", "-qq", "-e", CALLS, "-o", str(trace)], start_timeout=120,
    )  # fmt: skip
    try:
        wait_until(lambda: daemon.get("/v1/table").get("window_conversations", 0) > 0
                   if _answers(daemon) else False, 120, "a published table")  # fmt: skip
        time.sleep(1.5)  # a few status lines and refreshes
        traced = _children(daemon.process.pid)  # the daemon under strace
        assert len(traced) == 1
        os.kill(traced[0], signal.SIGTERM)
        assert daemon.process.wait(timeout=60) == 0, daemon.text()  # strace exits as it did
    finally:
        for pid in _children(daemon.process.pid):
            os.kill(pid, signal.SIGKILL)
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)
    writes = file_writes(trace.read_text())
    TALLY.add(faults=1, differences=len(writes))
    assert writes == [], "\n".join(writes[:20])
    assert list(sandbox.iterdir()) == []


def _answers(daemon: DaemonProcess) -> bool:
    try:
        daemon.raw("/healthz")
        return daemon.get("/v1/table") is not None
    except Exception:
        return False


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return children


# $1: a directory to fill. Only it (and /var/tmp) are mounted over, never /tmp itself: the
# repository and its venv may live under /tmp (a CI clone) and must stay visible.
FULL_DISK = """set -e
full="$1"; shift
for d in "$full" /var/tmp; do
  mount -t tmpfs -o size=8k,nr_inodes=4 tmpfs "$d"
  dd if=/dev/zero of="$d/fill" bs=4k count=8 2>/dev/null || true
  i=0; while touch "$d/f$i" 2>/dev/null; do i=$((i+1)); done
done
cd "$full"
exec "$@"
"""


def test_the_daemon_runs_on_a_full_disk_with_the_classifier(
    tmp_path: Path, kafka_bootstrap, kafka_topic, redis_url, redis_client, redis_namespace
) -> None:
    from kvcast.lab.bench.soak import compare, wait_consumed
    from tests.support import produce

    probe = ["unshare", "--user", "--map-root-user", "--mount", "true"]
    if shutil.which("unshare") is None or os.system(" ".join(probe) + " 2>/dev/null"):
        missing("user and mount namespaces", "unshare", "cannot mount a full file system")
    records: list = []
    produce(kafka_bootstrap, kafka_topic, workload(1500, seed=13), records)
    full = tmp_path / "full"
    full.mkdir()
    env = {**os.environ, "HOME": str(full), "TMPDIR": str(full), "HF_HUB_OFFLINE": "1"}
    daemon = DaemonProcess(
        ["--source", f"kafka://{kafka_bootstrap}/{kafka_topic}", "--store", redis_url,
         "--namespace", redis_namespace, "--metrics-addr", "127.0.0.1:0",
         "--commit-interval", "0.2", "--refresh-interval", "0.3", "--table-interval", "0.1",
         "--classifier", "auto", "--classifier-budget", "0.2",
         "--completion-timeout", "900", "--allowed-lateness", "30", "--capacity-blocks", "3000"],
        tmp_path / "daemon.log", env=env,
        prefix=[*probe[:-1], "sh", "-c", FULL_DISK, "full-disk", str(full)],
        start_timeout=120,
    )  # fmt: skip
    try:
        wait_consumed(redis_client, redis_namespace, kafka_topic, records, 4, timeout=90)
        differences = compare(daemon, records)  # the workload carries intents
        TALLY.add(faults=1, events_compared=len(records), differences=len(differences))
        assert differences == []
        assert daemon.stop(signal.SIGTERM, timeout=30) == 0, daemon.text()
    finally:
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)
