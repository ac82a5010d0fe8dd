"""The layering of the rooms, checked on the imports read from the source (nothing is imported).

The import graph comes from ``scripts/import_graph.py`` (shared with
``scripts/architecture_diagram.py``, which draws it into docs/architecture.md). Every import
counts: module level, inside a function (lazy) and under ``if TYPE_CHECKING:``; relative imports
are resolved; ``from X import name`` is an import of ``X.name`` when that is a module, else of
``X``. The rules:

1. ``kvcast.stats`` imports only ``kvcast.stats`` among kvcast modules, and does no I/O (no
   network, processes or files: :data:`STATS_NO_IO`).
2. The engine kit is a folder, ``exporters/kit/`` (``kvcast.exporters.kit``): it imports only
   the standard library, itself, and the stats modules of :data:`KIT_STATS`; lazily imported
   optional clients are allowed one by one in :data:`LAZY_THIRD_PARTY`. What those imports run
   at import time (the :data:`KIT_STATS` modules, the ``__init__`` of the parent packages) is
   held to the same rule. The producer (``kvcast.producer``), which runs in the serving stack
   too, is held to it with no kvcast module outside itself (:data:`SERVING_SIDE`).
   Outside the kit, a module imports only the kit's public modules (:data:`KIT_PUBLIC`), except
   in :data:`KIT_OPEN_TO` (the lab: simulators, reports, benches).
3. Downward only: :data:`FORBIDDEN` (the daemon never imports the lab or the CLI, the kit's
   adapters never import its client, ...).
4. No import cycle among kvcast modules.
5. Every ``__init__.py`` only re-exports (a docstring, imports, ``__all__``).

Each failure names the file, the line and the imported module (or the statement). The checks are
also run on small synthetic trees, so that they cannot pass vacuously.
"""

from __future__ import annotations

import ast
import importlib.util
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("stats", "daemon", "classifier", "exporters", "lab", "cli", "producer")


def _load_script(name: str) -> ModuleType:
    """A module of scripts/ by path (scripts/ is no package); registered in sys.modules under
    its file name, the name architecture_diagram.py imports import_graph by."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ig = _load_script("import_graph")
diagram = _load_script("architecture_diagram")

# --- the rules ---------------------------------------------------------------------------------

STATS = "kvcast.stats"

# Read from the modules: kvcast.stats computes from values handed to it (the CLI reads the delay
# file, cli/delays.py, and passes its text to kvcast.stats.delays); it logs through `logging`
# (the application configures the handlers) and touches no socket, process or file.
STATS_NO_IO = {
    # network clients and servers
    "socket": "network I/O",
    "socketserver": "network I/O",
    "ssl": "network I/O",
    "selectors": "network I/O",
    "asyncio": "network I/O",
    "http": "network I/O",
    "urllib.request": "network I/O",
    "urllib.error": "network I/O",
    "ftplib": "network I/O",
    "smtplib": "network I/O",
    "imaplib": "network I/O",
    "poplib": "network I/O",
    "xmlrpc": "network I/O",
    "webbrowser": "network I/O",
    "requests": "network I/O",
    "httpx": "network I/O",
    "urllib3": "network I/O",
    "aiohttp": "network I/O",
    "redis": "network I/O (Redis)",
    "hiredis": "network I/O (Redis)",
    "kafka": "network I/O (Kafka)",
    "prometheus_client": "the metrics exporter",
    "click": "the command line",
    # processes
    "subprocess": "processes",
    "multiprocessing": "processes",
    "signal": "processes",
    # files and the environment
    "os": "files or the environment",
    "pathlib": "files",
    "io": "files",
    "shutil": "files",
    "tempfile": "files",
    "glob": "files",
    "fileinput": "files",
    "mmap": "files",
    "sqlite3": "files",
    "shelve": "files",
    "dbm": "files",
}

KIT = "kvcast.exporters.kit"
# The stats modules the kit may import (and what they run at import time is checked too): the
# store URL grammar and the key layout, which the daemon writes by and the client reads by.
KIT_STATS = ("kvcast.stats.store_url",)
# What runs inside the serving stack, each unit with the kvcast modules outside itself it may
# import: the kit in the engines, the producer in a router or a proxy.
SERVING_SIDE = {KIT: KIT_STATS, "kvcast.producer": ()}
# The kit's face: what modules outside it may import (the CLI reads the table with the client;
# users import these, docs/engines.md). The rest is the kit's own.
KIT_PUBLIC = (
    KIT,
    f"{KIT}.client",
    f"{KIT}.index",
    f"{KIT}.plugins",
    f"{KIT}.adapters",
    f"{KIT}.adapters.vllm",
    f"{KIT}.adapters.sglang",
)
# Who may import any of the kit: the simulators replay its policies, the reports read its
# curves, the benches time its internals.
KIT_OPEN_TO = ("kvcast.lab",)

# The only third-party imports the serving side may make, each inside a function (so an
# engine that does not use that feature never needs the package). Exact module names: a new one,
# or one of these moved to module level, is a violation.
LAZY_THIRD_PARTY = {
    # RedisTableSource.__init__: redis-py only for redis:// table sources; HTTP-only engines
    # need not install it (exporters/kit/client.py).
    (f"{KIT}.client", "redis"): "optional Redis table source",
    # install(): registers IACStrategy as a virtual subclass of SGLang's EvictionStrategy, guarded
    # by `except ImportError` -- the engine that calls it is SGLang itself.
    (
        f"{KIT}.adapters.sglang",
        "sglang.srt.mem_cache.evict_policy",
    ): "the engine being adapted (optional)",
    # build_cache(): SGLang's own default cache factory, called from inside SGLang's registry.
    (
        f"{KIT}.adapters.sglang",
        "sglang.srt.mem_cache.registry",
    ): "the engine being adapted (its cache factory)",
    (f"{KIT}.adapters.sglang", "sglang.srt.runtime_context"): "the engine's flags",
    # register_sglang(): SGLang's plugin entry point, which only SGLang itself calls, registers
    # the `kvcast` radix-cache backend.
    (f"{KIT}.plugins", "sglang.srt.mem_cache.registry"): "the engine being adapted",
    # register_vllm(): vLLM's plugin entry point, which only vLLM itself calls, replaces the
    # block pool's queue class and wraps KVCacheManager.free.
    (f"{KIT}.plugins", "vllm.v1.core"): "the engine being adapted (its plugin)",
    # fast(): the ranking of many candidates sorts in numpy where an engine has it installed,
    # and in Python where it has not (the same order; exporters/kit/ranking.py).
    (f"{KIT}.ranking", "numpy"): "optional numpy for the density ranking",
    # KafkaEventProducer's sender thread: the broker client, only where events go to Kafka.
    ("kvcast.producer.kafka", "kafka"): "the producer's Kafka client",
}

# importer package -> packages it must never import (any kind of import)
FORBIDDEN = {
    "kvcast.daemon": ("kvcast.lab", "kvcast.cli"),
    "kvcast.lab": ("kvcast.cli",),
    "kvcast.exporters": ("kvcast.daemon", "kvcast.lab", "kvcast.cli"),
    # the adapters rank by anything holding an index; the plugins alone glue them to the client
    f"{KIT}.adapters": (f"{KIT}.client", f"{KIT}.plugins"),
    "kvcast.classifier": ("kvcast.daemon", "kvcast.exporters", "kvcast.lab", "kvcast.cli"),
}


@dataclass(frozen=True)
class Violation:
    where: str  # path:line
    subject: str  # the imported module, or the offending statement
    rule: str

    def __str__(self) -> str:
        return f"{self.where} -> {self.subject}: {self.rule}"


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _matches(name: str, prefixes: Iterable[str]) -> str | None:
    return next((p for p in prefixes if _within(name, p)), None)


def _serving_unit(name: str) -> str | None:
    return _matches(name, SERVING_SIDE)


def _violation(imp: ig.Import, rule: str) -> Violation:
    return Violation(imp.where(ROOT), imp.target, f"{rule} [{imp.kind} import]")


def check_imports(graph: ig.ImportGraph) -> list[Violation]:
    """Rules 1-3 on each import, plus: a kvcast import names a module that exists."""
    found: list[Violation] = []
    for imp in graph.imports:
        source, target = imp.importer, imp.target
        internal = ig.is_internal(target)
        if internal and target not in graph.modules:
            found.append(_violation(imp, "no such kvcast module"))
        elif target.partition(".")[0] in FOLDERS:
            found.append(_violation(imp, f"imports a folder name; use kvcast.{target}"))
        if _within(source, STATS):
            if internal and not _within(target, STATS):
                found.append(_violation(imp, "kvcast.stats imports only kvcast.stats"))
            if (io := _matches(target, STATS_NO_IO)) is not None:
                found.append(_violation(imp, f"kvcast.stats does no I/O ({STATS_NO_IO[io]})"))
        if (unit := _serving_unit(source)) is not None:
            if internal and not (_within(target, unit) or target in SERVING_SIDE[unit]):
                found.append(
                    _violation(imp, f"{unit} imports only itself and {SERVING_SIDE[unit]}")
                )
            elif not internal and not ig.is_stdlib(target):
                allowed = (source, target) in LAZY_THIRD_PARTY and imp.kind == "function"
                if not allowed:
                    found.append(_violation(imp, f"{unit}: standard library only (third-party)"))
        elif (
            _within(target, KIT) and target not in KIT_PUBLIC and not _matches(source, KIT_OPEN_TO)
        ):
            found.append(_violation(imp, "imports the engine kit's internals (KIT_PUBLIC only)"))
        for layer, banned in FORBIDDEN.items():
            if _within(source, layer) and (hit := _matches(target, banned)) is not None:
                found.append(_violation(imp, f"{layer} never imports {hit}"))
    return found


def check_client_closure(graph: ig.ImportGraph) -> list[Violation]:
    """Rule 2 on what an engine runs when it imports the client: the module-level imports of
    everything reached from it (and the parent packages' ``__init__``), transitively."""
    allowed = {name for names in SERVING_SIDE.values() for name in names}
    queue = [name for name in graph.modules if _serving_unit(name)]
    seen: set[str] = set()
    found: list[Violation] = []
    while queue:
        name = queue.pop()
        if name in seen or name not in graph.modules:
            continue
        seen.add(name)
        parts = name.split(".")
        parents = [".".join(parts[:i]) for i in range(2, len(parts))]
        queue.extend(parents)
        for imp in graph.imports_of(name):
            if not imp.runtime:
                continue
            if ig.is_internal(imp.target):
                queue.append(imp.target)
                if (
                    not _serving_unit(name)
                    and not _serving_unit(imp.target)
                    and imp.target not in allowed
                    and imp.target not in parents
                ):
                    found.append(
                        _violation(imp, "serving side: run at import time by the kit (closure)")
                    )
            elif not _serving_unit(name) and not ig.is_stdlib(imp.target):
                found.append(_violation(imp, "serving side: standard library only (closure)"))
    return sorted(found, key=str)


def check_cycles(graph: ig.ImportGraph) -> list[Violation]:
    """Rule 4: one violation per cycle, naming the chain of modules and where each import is."""
    found = []
    for chain in graph.cycles():
        modules = " -> ".join([chain[0].importer, *(imp.target for imp in chain)])
        steps = ", ".join(f"{imp.where(ROOT)} ({imp.kind})" for imp in chain)
        found.append(Violation(chain[0].where(ROOT), modules, f"import cycle: {steps}"))
    return found


def _reexport_only(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return True
    if isinstance(statement, ast.Assign):
        return all(isinstance(t, ast.Name) and t.id == "__all__" for t in statement.targets)
    if isinstance(statement, ast.AnnAssign | ast.AugAssign):
        return isinstance(statement.target, ast.Name) and statement.target.id == "__all__"
    if isinstance(statement, ast.If):  # if TYPE_CHECKING: imports only
        test = statement.test
        named = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )
        return named and not statement.orelse and all(_reexport_only(s) for s in statement.body)
    return False


def _describe(statement: ast.stmt) -> str:
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
        return f"def {statement.name}"
    if isinstance(statement, ast.ClassDef):
        return f"class {statement.name}"
    if isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        return "assignment to " + ", ".join(ast.unparse(t) for t in targets)
    return f"{type(statement).__name__} statement"


def check_inits(graph: ig.ImportGraph) -> list[Violation]:
    """Rule 5: an ``__init__.py`` holds a docstring, imports and ``__all__``, nothing else."""
    found = []
    for module in graph.modules.values():
        if not module.is_package or module.source is None:
            continue
        body = ast.parse(module.source, str(module.path)).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        for statement in body:
            if not _reexport_only(statement):
                where = ig.Import(module.name, module.path, statement.lineno, "", "module")
                found.append(
                    Violation(
                        where.where(ROOT),
                        _describe(statement),
                        "__init__.py only re-exports (docstring, imports, __all__)",
                    )
                )
    return found


def check_all(graph: ig.ImportGraph) -> list[Violation]:
    return [
        *check_imports(graph),
        *check_client_closure(graph),
        *check_cycles(graph),
        *check_inits(graph),
    ]


def _report(violations: list[Violation]) -> str:
    return f"{len(violations)} violation(s):\n" + "\n".join(f"  {v}" for v in violations)


# --- the tree ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> ig.ImportGraph:
    return ig.ImportGraph.from_tree(ROOT)


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_checker_sees_every_package(graph, folder):
    package = f"kvcast.{folder}"
    modules = [name for name in graph.modules if _within(name, package)]
    assert [name for name in modules if name != package], f"no module found in {folder}/"
    assert sum(len(graph.imports_of(name)) for name in modules) > 0
    # every .py file of the folder is a module the checker read (a subfolder missing from
    # pyproject's packages would be neither checked nor installed)
    read = {module.path.resolve() for module in graph.modules.values()}
    stray = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / folder).rglob("*.py")
        if path.resolve() not in read
    )
    assert not stray, f"files outside every package of pyproject.toml: {stray}"


def test_the_kit_is_the_folder_exporters_kit(graph):
    """The kit's modules are the files of exporters/kit/, and every name the rules give for
    it is a module there (a renamed module would leave a rule checking nothing)."""
    kit = {name for name in graph.modules if _within(name, KIT)}
    files = {
        graph.modules[name].path.resolve() for name in kit if not graph.modules[name].is_extension
    }
    assert files == {path.resolve() for path in (ROOT / "exporters" / "kit").rglob("*.py")}
    missing = [name for name in (*KIT_PUBLIC, *KIT_STATS) if name not in graph.modules]
    assert not missing, f"named in the kit's rules but no module: {missing}"


def test_the_checker_sees_the_c_extension(graph):
    module = graph.modules["kvcast.stats.native._replay"]
    assert module.is_extension and module.path.name == "_replay.c"
    assert graph.internal_edges()["kvcast.stats.native.replay"].get(module.name)


def test_layering(graph):
    violations = check_imports(graph)
    if violations:
        pytest.fail(_report(violations), pytrace=False)


def test_engine_client_runs_only_the_standard_library(graph):
    violations = check_client_closure(graph)
    if violations:
        pytest.fail(_report(violations), pytrace=False)


def test_no_import_cycle(graph):
    violations = check_cycles(graph)
    if violations:
        pytest.fail(_report(violations), pytrace=False)


def test_init_modules_only_reexport(graph):
    violations = check_inits(graph)
    if violations:
        pytest.fail(_report(violations), pytrace=False)


def test_lazy_third_party_allow_list_is_current(graph):
    """Each entry of LAZY_THIRD_PARTY is still a lazy import there (else drop the entry)."""
    lazy = {(imp.importer, imp.target) for imp in graph.imports if imp.kind == "function"}
    stale = sorted(set(LAZY_THIRD_PARTY) - lazy)
    assert not stale, f"LAZY_THIRD_PARTY entries no longer imported lazily there: {stale}"


def test_architecture_doc_is_current(capsys):
    status = diagram.main(["--check"])
    assert status == 0, capsys.readouterr().err


# --- the checker itself, on synthetic trees ---------------------------------------------------

PACKAGES = {
    "kvcast.stats": '"""stats"""',
    "kvcast.stats.native": "",
    "kvcast.daemon": "",
    "kvcast.classifier": "",
    "kvcast.exporters": "",
    "kvcast.exporters.kit": '"""the engine kit"""',
    "kvcast.exporters.kit.adapters": "",
    "kvcast.lab": "",
    "kvcast.lab.sim": "",
    "kvcast.cli": "",
}
BASE = {
    **PACKAGES,
    "kvcast.stats.store_url": "import re\n",
    "kvcast.stats.config": "from dataclasses import dataclass\n",
    "kvcast.exporters.kit.index": "import math\n",
    "kvcast.exporters.kit.ranking": "from kvcast.exporters.kit.index import PriorityIndex\n",
    "kvcast.daemon.runner": "from kvcast.stats.config import StatsConfig\n",
    "kvcast.classifier.model": "import numpy\nfrom kvcast.stats import config\n",
    "kvcast.exporters.kit.client": (
        "import json\nfrom kvcast.exporters.kit.index import PriorityIndex\n"
        "from kvcast.stats.store_url import table_key\n"
        "def open_redis():\n    import redis\n"
    ),
    "kvcast.exporters.kit.adapters.vllm": "from kvcast.exporters.kit.index import PriorityIndex\n",
    "kvcast.exporters.kit.adapters.sglang": (
        "from . import vllm\n"
        "def install():\n    from sglang.srt.mem_cache.evict_policy import EvictionStrategy\n"
    ),
    "kvcast.lab.sim.lru": "import numpy\nfrom kvcast.daemon import runner\n",
    "kvcast.lab.sim.replay": "from kvcast.exporters.kit.ranking import rank\n",  # the lab may
    "kvcast.cli.main": (
        "import click\nfrom kvcast.lab.sim.lru import x\n"
        "from kvcast.exporters.kit.client import TableClient\n"  # public
    ),
}


LAZY_CLIENT = "def f():\n    import kvcast.exporters.kit.client\n"


def synthetic(**changes: str) -> ig.ImportGraph:
    """BASE with modules added or replaced (``stats_x="..."`` stands for ``kvcast.stats.x``)."""
    sources = dict(BASE)
    for key, source in changes.items():
        sources["kvcast." + key.replace("__", ".")] = source
    return ig.ImportGraph.from_sources(sources, packages=PACKAGES)


def test_the_synthetic_base_is_clean():
    assert check_all(synthetic()) == []


@pytest.mark.parametrize(
    ("changes", "subject", "rule"),
    [
        # rule 1
        (
            {"stats__x": "import kvcast.daemon.runner\n"},
            "kvcast.daemon.runner",
            "only kvcast.stats",
        ),
        (
            {"stats__x": "def f():\n    from kvcast.cli import main\n"},
            "kvcast.cli.main",
            "only kvcast.stats [function import]",
        ),
        (
            {"stats__native__x": "from ...daemon import runner\n"},
            "kvcast.daemon.runner",
            "only kvcast.stats",
        ),
        (
            {
                "stats__x": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from kvcast.classifier.model import M\n"
            },
            "kvcast.classifier.model",
            "only kvcast.stats [type-checking import]",
        ),
        ({"stats__x": "import socket\n"}, "socket", "does no I/O (network I/O)"),
        ({"stats__x": "from urllib import request\n"}, "urllib.request", "does no I/O"),
        ({"stats__x": "def f():\n    import redis\n"}, "redis", "does no I/O"),
        ({"stats__x": "import subprocess\n"}, "subprocess", "does no I/O (processes)"),
        # rule 2: the kit
        ({"exporters__kit__client": "import numpy\n"}, "numpy", "standard library only"),
        ({"exporters__kit__client": "import redis\n"}, "redis", "third-party) [module import]"),
        (
            {"exporters__kit__client": "def f():\n    import requests\n"},
            "requests",
            "standard library only",
        ),
        (
            {
                "exporters__kit__adapters__vllm": "from kvcast.stats.engine import StatsEngine\n",
                "stats__engine": "",
            },
            "kvcast.stats.engine",
            "kvcast.exporters.kit imports only itself and ('kvcast.stats.store_url',)",
        ),
        (
            {
                "exporters__kit__plugins": "from kvcast.stats.engine import StatsEngine\n",
                "stats__engine": "",
            },
            "kvcast.stats.engine",
            "kvcast.exporters.kit imports only itself",
        ),
        (
            {
                "exporters__kit__index": "def f():\n    from kvcast.exporters import metrics\n",
                "exporters__metrics": "",
            },
            "kvcast.exporters.metrics",
            "kvcast.exporters.kit imports only itself",
        ),
        # rule 2: outside the kit, its public modules only (the lab excepted)
        (
            {"cli__main": "from kvcast.exporters.kit.ranking import rank\n"},
            "kvcast.exporters.kit.ranking",
            "imports the engine kit's internals",
        ),
        (
            {"daemon__x": "def f():\n    from kvcast.exporters.kit import ranking\n"},
            "kvcast.exporters.kit.ranking",
            "imports the engine kit's internals (KIT_PUBLIC only) [function import]",
        ),
        (
            {"stats__x": "from kvcast.exporters.kit.index import PriorityIndex\n"},
            "kvcast.exporters.kit.index",
            "kvcast.stats imports only kvcast.stats",
        ),
        # rule 3
        (
            {"daemon__runner": "def f():\n    from kvcast.lab.sim import lru\n"},
            "kvcast.lab.sim.lru",
            "kvcast.daemon never imports kvcast.lab",
        ),
        (
            {"daemon__runner": "from kvcast import cli\n"},
            "kvcast.cli",
            "kvcast.daemon never imports kvcast.cli",
        ),
        (
            {"lab__sim__lru": "import importlib\nimportlib.import_module('kvcast.cli.main')\n"},
            "kvcast.cli.main",
            "kvcast.lab never imports kvcast.cli",
        ),
        (
            {"exporters__x": "def f():\n    from kvcast.daemon.runner import Daemon\n"},
            "kvcast.daemon.runner",
            "kvcast.exporters never imports kvcast.daemon",
        ),
        (
            {"exporters__kit__adapters__vllm": LAZY_CLIENT},
            "kvcast.exporters.kit.client",
            "kvcast.exporters.kit.adapters never imports kvcast.exporters.kit.client",
        ),
        (
            {
                "exporters__kit__adapters__sglang": "from kvcast.exporters.kit import plugins\n",
                "exporters__kit__plugins": "",
            },
            "kvcast.exporters.kit.plugins",
            "kvcast.exporters.kit.adapters never imports kvcast.exporters.kit.plugins",
        ),
        (
            {
                "classifier__x": "import typing\nif typing.TYPE_CHECKING:\n"
                "    from kvcast.exporters.kit import client\n"
            },
            "kvcast.exporters.kit.client",
            "kvcast.classifier never imports kvcast.exporters",
        ),
        # a kvcast import that names no module, a folder name instead of kvcast.<folder>
        ({"daemon__runner": "import kvcast.daemon.gone\n"}, "kvcast.daemon.gone", "no such"),
        ({"daemon__x": "import stats.engine\n"}, "stats.engine", "folder name"),
    ],
)
def test_the_checker_catches(changes, subject, rule):
    violations = check_imports(synthetic(**changes))
    assert any(v.subject == subject and rule in v.rule for v in violations), _report(violations)
    # the message names the file and the line
    hit = next(v for v in violations if v.subject == subject)
    assert ".py:" in hit.where and hit.where.rsplit(":", 1)[1].isdigit(), hit


def test_the_checker_locates_the_import():
    graph = synthetic(daemon__x='"""doc"""\n\nimport os\n\n\ndef f():\n    import kvcast.cli\n')
    [violation] = check_imports(graph)
    assert str(violation).startswith("kvcast/daemon/x.py:7 -> kvcast.cli: ")


def test_the_checker_follows_what_the_client_runs():
    # a KIT_STATS module pulling numpy at import time breaks the kit for engines without it ...
    graph = synthetic(stats__store_url="import numpy\n")
    assert [v.subject for v in check_client_closure(graph)] == ["numpy"]
    graph = synthetic(stats__store_url="from kvcast.stats.config import StatsConfig\n")
    assert [v.subject for v in check_client_closure(graph)] == ["kvcast.stats.config"]
    # ... and so does a parent package's __init__
    graph = synthetic(exporters="from kvcast.exporters.metrics import x\n", exporters__metrics="")
    assert [v.subject for v in check_client_closure(graph)] == ["kvcast.exporters.metrics"]
    # only for type checkers, or lazily: never run by an import of the client
    graph = synthetic(
        stats__store_url="from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from kvcast.stats.config import StatsConfig\ndef f():\n    import numpy\n"
    )
    assert check_client_closure(graph) == []


@pytest.mark.parametrize(
    ("changes", "chain"),
    [
        (
            {
                "stats__a": "from kvcast.stats.b import B\n",
                "stats__b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from kvcast.stats.a import A\n",
            },
            "kvcast.stats.a -> kvcast.stats.b -> kvcast.stats.a",
        ),
        (
            {
                "lab__sim__a": "from . import b\n",
                "lab__sim__b": "def f():\n    from .c import C\n",
                "lab__sim__c": "import kvcast.lab.sim.a\n",
            },
            "kvcast.lab.sim.a -> kvcast.lab.sim.b -> kvcast.lab.sim.c -> kvcast.lab.sim.a",
        ),
        ({"stats__a": "import kvcast.stats.a\n"}, "kvcast.stats.a -> kvcast.stats.a"),
    ],
)
def test_the_checker_catches_a_cycle(changes, chain):
    assert [v.subject for v in check_cycles(synthetic(**changes))] == [chain]


@pytest.mark.parametrize(
    ("source", "subject"),
    [
        ('"""doc"""\ndef open_store():\n    pass\n', "def open_store"),
        ("from kvcast.stats.config import C\nclass Registry:\n    pass\n", "class Registry"),
        ('FORMATS = ("a", "b")\n__all__ = ["FORMATS"]\n', "assignment to FORMATS"),
        ("import logging\nlogging.basicConfig()\n", "Expr statement"),
    ],
)
def test_the_checker_catches_an_init_that_does_more_than_reexport(source, subject):
    assert [v.subject for v in check_inits(synthetic(daemon=source))] == [subject]


def test_the_checker_accepts_an_init_that_reexports():
    source = (
        '"""The daemon."""\nfrom __future__ import annotations\nfrom typing import TYPE_CHECKING\n'
        "from kvcast.daemon.runner import Daemon\nif TYPE_CHECKING:\n"
        "    from kvcast.stats.config import StatsConfig\n__all__ = ['Daemon']\n"
        "__all__ += ['StatsConfig']\n"
    )
    assert check_inits(synthetic(daemon=source)) == []


def test_from_import_names_the_submodule_only_when_it_is_one():
    graph = synthetic(
        daemon__x="from kvcast.stats import config, StatsConfig\nfrom os import path, sep\n"
    )
    targets = [imp.target for imp in graph.imports_of("kvcast.daemon.x")]
    assert targets == ["kvcast.stats.config", "kvcast.stats", "os"]


# --- the diagram -------------------------------------------------------------------------------


def test_the_diagram_has_a_node_per_room_and_an_arrow_per_room_import(graph):
    text = diagram.rooms_diagram(graph)
    for room in graph.rooms():
        assert f'["{room.removeprefix("kvcast.")}"]' in text
    arrows = [line for line in text.splitlines() if "->" in line]
    assert len(arrows) == len(graph.room_edges()) > 0
    assert "r_kvcast_daemon --> r_kvcast_stats" in text


def test_the_diagram_marks_lazy_and_typing_imports():
    graph = synthetic(
        stats__a="def f():\n    import kvcast.stats.b\n",
        stats__b="from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import kvcast.stats.c\n",
        stats__c="import kvcast.stats.config\n",
    )
    text = diagram.modules_diagram(graph)
    assert "m_kvcast_stats_a -. lazy .-> m_kvcast_stats_b" in text
    assert "m_kvcast_stats_b -. typing .-> m_kvcast_stats_c" in text
    assert "m_kvcast_stats_c --> m_kvcast_stats_config" in text


def test_check_fails_on_a_stale_doc_and_a_rerun_fixes_it(tmp_path, capsys):
    doc = tmp_path / "architecture.md"
    shutil.copy(diagram.DOC, doc)
    text = doc.read_text(encoding="utf-8")
    doc.write_text(text.replace("flowchart TD", "flowchart LR", 1), encoding="utf-8")
    assert diagram.main(["--check", "--doc", str(doc)]) == 1
    assert "rerun `.venv/bin/python scripts/architecture_diagram.py`" in capsys.readouterr().err
    assert diagram.main(["--doc", str(doc)]) == 0
    assert diagram.main(["--check", "--doc", str(doc)]) == 0


def test_the_generator_leaves_the_rest_of_the_doc_alone():
    text = f"# Title\n\nprose\n\n{diagram.BEGIN}\nold\n{diagram.END}\n\nmore prose\n"
    assert diagram.replace_block(text, "new") == (
        f"# Title\n\nprose\n\n{diagram.BEGIN}\nnew\n{diagram.END}\n\nmore prose\n"
    )
    with pytest.raises(ValueError, match="marker"):
        diagram.replace_block("# no markers\n", "new")
