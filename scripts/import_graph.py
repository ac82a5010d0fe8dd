"""The import graph of the ``kvcast`` packages, read from the source with ``ast`` (no import).

Standard library only, so that the architecture test (``tests/test_architecture.py``) and the
diagram generator (``scripts/architecture_diagram.py``) run without the project's dependencies.

What it reads:

- the modules: every package named in ``pyproject.toml`` (``[tool.setuptools] packages``, each
  found through ``package-dir``), its ``__init__.py`` and the other ``*.py`` files of its folder,
  plus the C extensions declared with ``Extension("dotted.name", sources=[...])`` in
  ``setup.py`` (a C module's imports are its ``PyImport_ImportModule("name")`` calls);
- the imports of each module: ``import X`` and ``from X import name`` wherever they stand, at
  module level, inside a function, or under ``if TYPE_CHECKING:`` (recorded as such), plus
  ``importlib.import_module("X")`` / ``__import__("X")`` calls with a literal name. Relative
  imports are resolved against the importing module's package. ``from X import name`` is an
  import of ``X.name`` when that is a module (a known kvcast module, or a file on ``sys.path``
  for anything else), else an import of ``X``.

An import of ``a.b.c`` is recorded as an edge to ``a.b.c`` only, not to the parent packages
whose ``__init__`` Python also runs: the graph is the one written in the code.

    >>> graph = ImportGraph.from_tree(Path("."))            # doctest: +SKIP
    >>> graph.internal_edges()["kvcast.daemon.runner"]       # doctest: +SKIP
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.machinery
import re
import sys
import tomllib
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "ROOT_PACKAGE",
    "Import",
    "ImportGraph",
    "ImportKind",
    "Module",
    "discover",
    "is_stdlib",
    "package_dirs",
    "read_imports",
]

ROOT_PACKAGE = "kvcast"

ImportKind = Literal["module", "function", "type-checking"]
"""Where an import stands: ``module`` runs when the importer is imported (module level, class
bodies, module-level ``try``/``if``), ``function`` inside a function (a lazy import),
``type-checking`` under ``if TYPE_CHECKING:`` (never at run time)."""

_C_IMPORT = re.compile(r"\bPyImport_ImportModule(?:NoBlock)?\s*\(\s*\"([\w.]+)\"")


@dataclass(frozen=True)
class Module:
    """One importable module: a ``.py`` file, a package's ``__init__.py`` or a C extension."""

    name: str
    path: Path
    is_package: bool = False
    source: str | None = None
    """The Python source; None for a C extension (``path`` is then its C source file)."""

    @property
    def package(self) -> str:
        """The package the module's relative imports resolve against (its own, for a package)."""
        return self.name if self.is_package else self.name.rpartition(".")[0]

    @property
    def is_extension(self) -> bool:
        return self.source is None


@dataclass(frozen=True)
class Import:
    """One import statement (or call) naming one module."""

    importer: str
    path: Path
    line: int
    target: str
    kind: ImportKind

    @property
    def runtime(self) -> bool:
        """True when the import runs as soon as the importer is imported."""
        return self.kind == "module"

    def where(self, root: Path | None = None) -> str:
        """``path:line``, an absolute path made relative to ``root`` when it lies under it."""
        path = self.path
        if root is not None and path.is_absolute():
            with contextlib.suppress(ValueError):
                path = path.resolve().relative_to(root.resolve())
        return f"{path}:{self.line}"


def is_stdlib(name: str) -> bool:
    """True for a module of the standard library (decided by ``sys.stdlib_module_names``)."""
    return name.partition(".")[0] in sys.stdlib_module_names


def is_internal(name: str) -> bool:
    """True for ``kvcast`` and its submodules."""
    return name == ROOT_PACKAGE or name.startswith(ROOT_PACKAGE + ".")


@functools.cache
def _external_module_exists(name: str) -> bool:
    """Whether ``name`` is a module file (or package folder) somewhere on ``sys.path``."""
    *parents, last = name.split(".")
    for entry in sys.path:
        folder = Path(entry or ".", *parents)
        if not folder.is_dir():
            continue
        if (folder / f"{last}.py").is_file() or (folder / last / "__init__.py").is_file():
            return True
        if any((folder / f"{last}{suffix}").is_file() for suffix in _EXTENSION_SUFFIXES):
            return True
    return False


_EXTENSION_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def package_dirs(root: Path) -> dict[str, Path]:
    """Each package of ``pyproject.toml`` and the folder it is installed from."""
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = config.get("tool", {}).get("setuptools", {})
    mapping: Mapping[str, str] = setuptools.get("package-dir", {})
    packages: list[str] = setuptools.get("packages", list(mapping))
    dirs: dict[str, Path] = {}
    for package in packages:
        if package in mapping:
            dirs[package] = root / mapping[package]
            continue
        # setuptools: a package without its own entry lies under its nearest mapped parent
        parent, _, rest = package.rpartition(".")
        while parent and parent not in mapping:
            parent, _, head = parent.rpartition(".")
            rest = f"{head}.{rest}"
        base = root / mapping[parent] if parent else root / mapping.get("", ".")
        dirs[package] = base.joinpath(*rest.split("."))
    return dirs


def _extensions(root: Path) -> Iterator[tuple[str, list[Path]]]:
    """``(name, C sources)`` of every ``Extension("name", sources=[...])`` call in setup.py."""
    setup = root / "setup.py"
    if not setup.is_file():
        return
    for node in ast.walk(ast.parse(setup.read_text(encoding="utf-8"), str(setup))):
        if not (isinstance(node, ast.Call) and _call_name(node.func) == "Extension"):
            continue
        if not (node.args and isinstance(node.args[0], ast.Constant)):
            continue
        name = node.args[0].value
        sources: list[Path] = []
        for keyword in node.keywords:
            if keyword.arg == "sources" and isinstance(keyword.value, ast.List | ast.Tuple):
                sources = [
                    root / item.value
                    for item in keyword.value.elts
                    if isinstance(item, ast.Constant) and isinstance(item.value, str)
                ]
        if len(node.args) > 1 and isinstance(node.args[1], ast.List):
            sources = [
                root / item.value
                for item in node.args[1].elts
                if isinstance(item, ast.Constant) and isinstance(item.value, str)
            ]
        if isinstance(name, str):
            yield name, sources


def discover(root: Path) -> dict[str, Module]:
    """Every module of the project under ``root``, by dotted name (sorted)."""
    modules: dict[str, Module] = {}
    for package, folder in package_dirs(root).items():
        for path in sorted(folder.glob("*.py")):
            source = path.read_text(encoding="utf-8")
            if path.name == "__init__.py":
                modules[package] = Module(package, path, is_package=True, source=source)
            else:
                name = f"{package}.{path.stem}"
                modules[name] = Module(name, path, source=source)
    for name, sources in _extensions(root):
        if sources:
            modules[name] = Module(name, sources[0])
    return dict(sorted(modules.items()))


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def resolve_relative(module: Module, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    parts = module.package.split(".")
    if level - 1 >= len(parts):
        raise ValueError(f"{module.name}: relative import beyond the top-level package")
    base = ".".join(parts[: len(parts) - (level - 1)])
    return f"{base}.{name}" if name else base


class _ImportVisitor(ast.NodeVisitor):
    def __init__(self, module: Module, known: Collection[str]) -> None:
        self.module = module
        self.known = known
        self.imports: list[Import] = []
        self._functions = 0
        self._type_checking = 0

    @property
    def _kind(self) -> ImportKind:
        if self._type_checking:
            return "type-checking"
        return "function" if self._functions else "module"

    def _add(self, node: ast.stmt | ast.expr, target: str) -> None:
        self.imports.append(
            Import(self.module.name, self.module.path, node.lineno, target, self._kind)
        )

    def _is_module(self, name: str) -> bool:
        if is_internal(name):
            return name in self.known
        return _external_module_exists(name)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = resolve_relative(self.module, node.level, node.module)
        if base == "__future__":
            return  # a compiler directive, not a module dependency
        plain = False
        for alias in node.names:
            candidate = f"{base}.{alias.name}"
            if alias.name != "*" and self._is_module(candidate):
                self._add(node, candidate)
            else:
                plain = True
        if plain:
            self._add(node, base)

    def visit_Call(self, node: ast.Call) -> None:
        name = _call_name(node.func)
        if (
            name in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            self._add(node, node.args[0].value)
        self.generic_visit(node)

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        # decorators, defaults and annotations run at definition time, the body at call time
        if not isinstance(node, ast.Lambda):
            for decorator in node.decorator_list:
                self.visit(decorator)
            if node.returns is not None:
                self.visit(node.returns)
        self.visit(node.args)
        self._functions += 1
        body = node.body if isinstance(node.body, list) else [node.body]
        for statement in body:
            self.visit(statement)
        self._functions -= 1

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function
    visit_Lambda = _visit_function

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self._type_checking += 1
        for statement in node.body:
            self.visit(statement)
        self._type_checking -= 1
        for statement in node.orelse:
            self.visit(statement)


def read_imports(module: Module, known: Collection[str]) -> list[Import]:
    """The imports of ``module``, in source order; ``known`` is the set of kvcast module names."""
    if module.source is None:
        text = module.path.read_text(encoding="utf-8") if module.path.is_file() else ""
        return [
            Import(module.name, module.path, text.count("\n", 0, match.start()) + 1, name, "module")
            for match in _C_IMPORT.finditer(text)
            for name in [match.group(1)]
        ]
    tree = ast.parse(module.source, str(module.path))
    visitor = _ImportVisitor(module, known)
    visitor.visit(tree)
    return sorted(visitor.imports, key=lambda imp: imp.line)


@dataclass(repr=False)
class ImportGraph:
    """The modules of the project and every import they make."""

    modules: dict[str, Module]
    imports: list[Import] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"<ImportGraph: {len(self.modules)} modules, {len(self.imports)} imports>"

    @classmethod
    def from_modules(cls, modules: Iterable[Module]) -> ImportGraph:
        by_name = {module.name: module for module in sorted(modules, key=lambda m: m.name)}
        imports = [imp for module in by_name.values() for imp in read_imports(module, by_name)]
        return cls(by_name, imports)

    @classmethod
    def from_tree(cls, root: Path) -> ImportGraph:
        return cls.from_modules(discover(root).values())

    @classmethod
    def from_sources(
        cls, sources: Mapping[str, str], packages: Collection[str] = ()
    ) -> ImportGraph:
        """A graph of in-memory modules (for testing the checks): ``{dotted name: source}``;
        the names in ``packages`` (or that are a parent of another name) are packages."""
        parents = {name.rpartition(".")[0] for name in sources}
        modules = []
        for name, source in sources.items():
            is_package = name in packages or name in parents
            filename = "__init__.py" if is_package else f"{name.rpartition('.')[2]}.py"
            folder = Path(*name.split(".")[: None if is_package else -1])
            modules.append(Module(name, folder / filename, is_package, source))
        return cls.from_modules(modules)

    def imports_of(self, name: str) -> list[Import]:
        return [imp for imp in self.imports if imp.importer == name]

    def internal_edges(
        self, kinds: Collection[ImportKind] = ("module", "function", "type-checking")
    ) -> dict[str, dict[str, list[Import]]]:
        """``{importer: {imported module: [imports]}}`` between known kvcast modules."""
        edges: dict[str, dict[str, list[Import]]] = {name: {} for name in self.modules}
        for imp in self.imports:
            if imp.kind in kinds and imp.target in self.modules:
                edges[imp.importer].setdefault(imp.target, []).append(imp)
        return edges

    def cycles(self) -> list[list[Import]]:
        """One cycle (as its chain of imports) for every strongly connected group of modules
        (a module importing itself included), all import kinds counted."""
        edges = self.internal_edges()
        found: list[list[Import]] = []
        for component in _strongly_connected(edges):
            start = min(component)
            chain = _shortest_cycle(start, component, edges)
            if chain:
                found.append(chain)
        return sorted(found, key=lambda chain: chain[0].importer)

    def room_of(self, name: str) -> str:
        """The package a module belongs to (itself for a package)."""
        module = self.modules[name]
        return module.name if module.is_package else module.package

    def rooms(self) -> list[str]:
        """The packages that hold code: a module besides ``__init__``, or an ``__init__`` that
        imports something (so that no import is left out of a room-level picture)."""
        rooms = set()
        for name, module in self.modules.items():
            if not module.is_package or self.imports_of(name):
                rooms.add(self.room_of(name))
        return sorted(rooms)

    def room_edges(self) -> dict[tuple[str, str], list[Import]]:
        """``{(importing room, imported room): [imports]}`` between different rooms."""
        rooms = set(self.rooms())
        edges: dict[tuple[str, str], list[Import]] = {}
        for imp in self.imports:
            if imp.target not in self.modules:
                continue
            pair = (self.room_of(imp.importer), self.room_of(imp.target))
            if pair[0] != pair[1] and pair[0] in rooms and pair[1] in rooms:
                edges.setdefault(pair, []).append(imp)
        return dict(sorted(edges.items()))


def _strongly_connected(edges: Mapping[str, Mapping[str, object]]) -> list[set[str]]:
    """Tarjan's algorithm (iterative): the components with a cycle (size > 1, or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(edges.get(succ, {})))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges.get(node, {}):
                    components.append(component)
    return components


def _shortest_cycle(
    start: str, component: set[str], edges: Mapping[str, Mapping[str, list[Import]]]
) -> list[Import]:
    """The shortest chain of imports from ``start`` back to itself inside ``component``."""
    previous: dict[str, Import] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        following: list[str] = []
        for node in frontier:
            for succ in sorted(edges.get(node, {})):
                if succ not in component:
                    continue
                first = edges[node][succ][0]
                if succ == start:
                    chain = [first]
                    while chain[0].importer != start:
                        chain.insert(0, previous[chain[0].importer])
                    return chain
                if succ not in seen:
                    seen.add(succ)
                    previous[succ] = first
                    following.append(succ)
        frontier = following
    return []
