"""The machine a benchmark ran on, printed with its figures (rates mean little without it)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model name (Linux), else what :mod:`platform` knows, else ``unknown``."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe_machine() -> dict[str, object]:
    """CPU model, cores usable by this process, memory (GiB), architecture and Python."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory_gib = None
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory_gib = round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)
    return {
        "cpu": cpu_model(),
        "cores": cores,
        "memory_gib": memory_gib,
        "arch": platform.machine(),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }


def machine_line(machine: dict[str, object]) -> str:
    """One line for the Markdown output, under the table."""
    return (
        f"Measured on: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB,"
        f" {machine['arch']}, {machine['os']}, {machine['python']}."
    )
