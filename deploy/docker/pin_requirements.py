"""Write the pinned runtime closure of kvcast[classifier] from an installed environment.

    .venv/bin/python deploy/docker/pin_requirements.py > deploy/docker/requirements.txt

Walks kvcast's requirements (with the `classifier` extra) through the installed distributions
and prints `name==version` for each, sorted. torch is printed without its local label (+cpu):
each image installs its own torch build first (CPU index or the CUDA default) at that version.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, distribution

from packaging.markers import default_environment
from packaging.requirements import Requirement


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str, extras: set[str]) -> dict[str, str]:
    """Installed version of every distribution `root[extras]` needs at run time."""
    pinned: dict[str, str] = {}
    todo = [(root, extras)]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (_key(name), frozenset(wanted)) in done:
            continue
        done.add((_key(name), frozenset(wanted)))
        dist = distribution(name)
        pinned[_key(dist.metadata["Name"])] = dist.version.split("+")[0]
        for text in dist.requires or []:
            req = Requirement(text)
            envs = [{**default_environment(), "extra": extra} for extra in ("", *wanted)]
            if req.marker is not None and not any(req.marker.evaluate(e) for e in envs):
                continue
            try:
                distribution(req.name)
            except PackageNotFoundError:
                raise SystemExit(f"{name} needs {req.name}, which is not installed") from None
            todo.append((req.name, set(req.extras)))
    pinned.pop(_key(root))
    return pinned


if __name__ == "__main__":
    print("# Runtime closure of kvcast[classifier]; written by deploy/docker/pin_requirements.py.")
    for name, ver in sorted(closure("kvcast", {"classifier"}).items()):
        print(f"{name}=={ver}")
