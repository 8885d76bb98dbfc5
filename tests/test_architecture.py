"""The architecture of DESIGN.md, checked on the source tree with ``ast`` alone.

What is checked, each by its own test:
- no import circles among our modules, function-level and type-only imports (under
  ``if TYPE_CHECKING:``) included: a type names a dependency as an import does;
- no ``_private`` name imported from another module (dunder names are public);
- no source file over 800 lines, no class over 400;
- the layers: the core (``aot.*`` outside ``aot.cache`` and ``aot.cli``) never imports
  the cache or the command line, the cache never imports the command line, and inside
  the cache a module never imports one of a higher layer (:data:`CACHE_LAYERS`), with
  no exception list: the public ``aot.Cache`` sits at the top and composes the rest.

The source folders are mapped into the ``aot`` namespace as ``pyproject.toml`` installs
them (``aot/`` -> ``aot.*``, ``cache/`` -> ``aot.cache.*``, ``cli/`` -> ``aot.cli.*``), so
the tree is read as written, without importing anything.

An import edge goes to the module named: ``import a.b.c`` and ``from a.b import c`` (when
``a.b.c`` is a module) import ``a.b.c``; ``from a.b import name`` imports ``a.b``. The
packages a dotted import passes through are not edges: every module would otherwise
depend on its package's ``__init__``. ``importlib.import_module("a.b")`` with a literal
name is an import of ``a.b``; a name computed at run time (the lazy public names of
``aot/__init__.py``) cannot be read and is no edge.

The tests at the end run the checker on small trees written to ``tmp_path``, so each
check is seen to fail on what it forbids.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent

# Source folder -> the package it is installed as (pyproject.toml, package-dir).
SOURCE_ROOTS: tuple[tuple[str, str], ...] = (("aot", "aot"), ("cache", "aot.cache"), ("cli", "aot.cli"))

MAX_FILE_LINES = 800
MAX_CLASS_LINES = 400

CORE = "core"
CACHE = "cache"
CLI = "cli"
ENTRY = "entry"

# The layers inside the cache, lowest first (DESIGN.md: cli -> admin, reports, warmup ->
# serving -> index, storage -> aot core). A module may import modules of its own layer
# or of a lower one, never of a higher one, type-only imports (``if TYPE_CHECKING:``)
# included: a type names what a module depends on. ``pkg.*`` names a sub-package and all
# its modules, any other entry one module; a new module at the top of cache/ must be
# placed here deliberately (the test of unplaced modules fails until it is).
#
# - base: the package and small utilities any layer may use (entry names, sizes and
#   ages, the pauses of the race tests); they import only the core.
# - index/storage: the SQL index and the blob stores; one layer, because a store kept in
#   the database shares the index's engine.
# - store: the ArtifactStore (index and blobs wired), its local read-through tier, what
#   storing and compiling an entry does, and the settings that say which cache to open.
# - serving: aot.load, the dispatcher, call statistics.
# - warmup, admin, reports: the top floor, ordered by what each builds on: admin's gc
#   reads warm-up manifests (``gc --manifest``), reports show admin's results (verify,
#   doctor) and the warm-up's coverage.
# - cache: ``aot.Cache``, whose public methods compose the layers below (verify, gc,
#   bundles, explain), and ``aot.jax_cache``, JAX's persistent cache over a cache.
CACHE_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("aot.cache", "aot.cache.names", "aot.cache.units", "aot.cache.pauses", "aot.cache.timeouts")),
    ("index/storage", ("aot.cache.index.*", "aot.cache.storage.*")),
    ("store", ("aot.cache.store", "aot.cache.tiered", "aot.cache.compiling", "aot.cache.stats_recorder",
               "aot.cache.serving_events",
               "aot.cache.stats_report", "aot.cache.rows", "aot.cache.config")),
    ("serving", ("aot.cache.serving.*",)),
    ("warmup", ("aot.cache.warmup.*",)),
    ("admin", ("aot.cache.admin.*",)),
    ("reports", ("aot.cache.reports.*",)),
    ("cache", ("aot.cache.cache", "aot.cache.jax_cache", "aot.cache.jax_cache.*")),
)

# Entry points, neither core nor cache nor command line: ``import aot`` names the public
# classes (``aot.Cache``, ``aot.load``) of the cache; ``python -m aot`` runs the
# command line; ``import aot.jax_cache`` is the cache's backend of JAX's persistent cache
# under the name users write (aot/jax_cache.py puts aot.cache.jax_cache in its place).
ENTRY_POINTS = frozenset({"aot", "aot.__main__", "aot.jax_cache"})


# ---------------------------------------------------------------- reading the tree


@dataclass(frozen=True, slots=True)
class Module:
    """One source file and the module name it is installed as."""

    name: str
    path: Path
    is_package: bool


@dataclass(frozen=True, slots=True)
class Import:
    """One import statement's edge: ``importer`` imports ``imported`` at ``path:line``."""

    importer: str
    imported: str
    path: Path
    line: int
    names: tuple[str, ...] = ()  # what a from-import takes from ``imported``
    type_only: bool = False  # under ``if TYPE_CHECKING:``: never runs, still a dependency

    def where(self, root: Path) -> str:
        return f"{_relative(self.path, root)}:{self.line}"


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def discover(root: Path, source_roots: Sequence[tuple[str, str]] = SOURCE_ROOTS) -> dict[str, Module]:
    """Every ``.py`` file under the source folders, by the module name it is installed as."""
    modules: dict[str, Module] = {}
    for folder, package in source_roots:
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            name = ".".join((package, *parts))
            modules[name] = Module(name, path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` (as :func:`ast.walk`) except those that never run: the
    body of ``if TYPE_CHECKING:`` (its ``else`` does run)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            children: Iterable[ast.AST] = [node.test, *node.orelse]
        else:
            children = ast.iter_child_nodes(node)
        stack.extend(reversed(list(children)))


def _package_of(module: Module) -> str:
    return module.name if module.is_package else module.name.rpartition(".")[0]


def _absolute(module: Module, node: ast.ImportFrom) -> str | None:
    """The absolute module name of a from-import (relative ones resolved)."""
    if not node.level:
        return node.module
    package = _package_of(module).split(".")
    if node.level - 1 >= len(package):
        return None  # beyond the top-level package: Python refuses it too
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str, modules: Mapping[str, Module]) -> str | None:
    """``name`` if it is one of our modules, else its longest prefix that is."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def imports_of(module: Module, modules: Mapping[str, Module]) -> list[Import]:
    """The imports of one module that name one of our modules: those that run
    (function-level ones included) and the type-only ones, marked so."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
    runs = {id(node) for node in runtime_nodes(tree)}
    found: list[Import] = []

    def edge(target: str, node: ast.stmt | ast.expr, names: tuple[str, ...] = ()) -> Import:
        return Import(module.name, target, module.path, node.lineno, names, id(node) not in runs)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known(alias.name, modules)
                if target is not None:
                    found.append(edge(target, node))
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            if source is None:
                continue
            from_package: list[str] = []
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if alias.name != "*" and submodule in modules:
                    found.append(edge(submodule, node))
                else:
                    from_package.append(alias.name)
            target = _known(source, modules)
            if from_package and target is not None:
                found.append(edge(target, node, tuple(from_package)))
        elif isinstance(node, ast.Call):
            name = _imported_by_call(node)
            target = _known(name, modules) if name is not None else None
            if target is not None:
                found.append(edge(target, node))
    return found


def _imported_by_call(node: ast.Call) -> str | None:
    """The module named by ``importlib.import_module("a.b")`` or ``__import__("a.b")``
    with a literal absolute name: an import all the same. (A name computed at run time
    cannot be read; the lazy public names of ``aot/__init__.py`` are of that kind.)"""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("."):
        return first.value
    return None


@dataclass(frozen=True, slots=True)
class Tree:
    """A source tree read once: its modules and their import edges."""

    root: Path
    modules: dict[str, Module]
    imports: tuple[Import, ...]

    @classmethod
    def read(cls, root: Path, source_roots: Sequence[tuple[str, str]] = SOURCE_ROOTS) -> Tree:
        modules = discover(root, source_roots)
        edges = [edge for module in modules.values() for edge in imports_of(module, modules)]
        return cls(root, modules, tuple(edges))


# ---------------------------------------------------------------- the checks


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit), of
    those with more than one node or a node importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    components.append(sorted(component))
    return sorted(components)


def import_circles(tree: Tree) -> list[str]:
    """One report per circle: its modules, and every import among them with file:line."""
    graph: dict[str, set[str]] = {name: set() for name in tree.modules}
    for edge in tree.imports:
        graph[edge.importer].add(edge.imported)
    reports = []
    for component in strongly_connected(graph):
        members = set(component)
        lines = [f"circle of {len(component)} modules: {', '.join(component)}"]
        for edge in sorted(tree.imports, key=lambda e: (e.importer, e.imported, e.line)):
            if edge.importer in members and edge.imported in members:
                lines.append(f"  {edge.importer} -> {edge.imported}  ({edge.where(tree.root)})")
        reports.append("\n".join(lines))
    return reports


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _module_aliases(module: Module, modules: Mapping[str, Module], tree: ast.AST) -> dict[str, str]:
    """Local names bound to one of our modules: ``import a.b as m`` binds ``m``,
    ``import a.b`` binds ``a`` (so ``a.b`` reads as a dotted name), ``from a import b``
    binds ``b`` when ``a.b`` is a module."""
    aliases: dict[str, str] = {}
    for node in runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for alias in node.names:
                if source and f"{source}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
    return aliases


def private_imports(tree: Tree) -> list[str]:
    """Every ``_private`` name one module takes from another: ``from m import _x``,
    ``import m._x`` / ``from m import _x`` of a private module outside its package, and
    ``m._x`` on a module imported as ``m``."""
    found: list[str] = []

    def report(module: Module, line: int, owner: str, name: str) -> None:
        found.append(
            f"{_relative(module.path, tree.root)}:{line}: {module.name} uses {owner}.{name}"
        )

    for edge in tree.imports:
        if edge.importer == edge.imported:
            continue
        importer = tree.modules[edge.importer]
        for name in edge.names:
            if _is_private(name):
                report(importer, edge.line, edge.imported, name)
        package, _, last = edge.imported.rpartition(".")
        if _is_private(last) and not _inside(edge.importer, package):
            report(importer, edge.line, package, last)  # private to its package
    for module in tree.modules.values():
        parsed = ast.parse(module.path.read_text(encoding="utf-8"))
        aliases = _module_aliases(module, tree.modules, parsed)
        if not aliases:
            continue
        for node in runtime_nodes(parsed):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            dotted = _dotted(node.value)
            if dotted is None:
                continue
            head, _, rest = dotted.partition(".")
            if head not in aliases:
                continue
            owner_name = ".".join(filter(None, (aliases[head], rest)))
            if owner_name in tree.modules and owner_name != module.name:
                report(module, node.lineno, owner_name, node.attr)
    return sorted(set(found))


def long_files(tree: Tree, limit: int = MAX_FILE_LINES) -> list[str]:
    reports = []
    for module in tree.modules.values():
        count = len(module.path.read_text(encoding="utf-8").splitlines())
        if count > limit:
            reports.append(f"{_relative(module.path, tree.root)}: {count} lines (limit {limit})")
    return sorted(reports)


def long_classes(tree: Tree, limit: int = MAX_CLASS_LINES) -> list[str]:
    reports = []
    for module in tree.modules.values():
        parsed = ast.parse(module.path.read_text(encoding="utf-8"))
        for node in ast.walk(parsed):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                count = node.end_lineno - node.lineno + 1
                if count > limit:
                    reports.append(
                        f"{_relative(module.path, tree.root)}:{node.lineno}: class {node.name} "
                        f"is {count} lines (limit {limit})"
                    )
    return sorted(reports)


def part_of(module: str) -> str:
    """``cli``, ``cache``, ``core`` or ``entry``."""
    if module in ENTRY_POINTS:
        return ENTRY
    if _inside(module, "aot.cli"):
        return CLI
    if _inside(module, "aot.cache"):
        return CACHE
    return CORE


def cache_layer(module: str, layers: Sequence[tuple[str, tuple[str, ...]]] = CACHE_LAYERS) -> tuple[int, str] | None:
    """(rank, name) of a cache module's layer, lowest rank first; None if unplaced."""
    for rank, (layer, members) in enumerate(layers):
        for member in members:
            if member.endswith(".*"):
                if _inside(module, member[:-2]):
                    return rank, layer
            elif module == member:
                return rank, layer
    return None


def unplaced_modules(tree: Tree, layers: Sequence[tuple[str, tuple[str, ...]]] = CACHE_LAYERS) -> list[str]:
    return sorted(
        f"{_relative(m.path, tree.root)}: {m.name} has no layer in CACHE_LAYERS"
        for m in tree.modules.values()
        if part_of(m.name) == CACHE and cache_layer(m.name, layers) is None
    )


def layer_violations(tree: Tree, layers: Sequence[tuple[str, tuple[str, ...]]] = CACHE_LAYERS) -> list[str]:
    """Imports against the layering, type-only ones included: core -> cache or cli,
    cache -> cli, and inside the cache an import of a higher layer."""
    reports = []
    for edge in tree.imports:
        source, target = part_of(edge.importer), part_of(edge.imported)
        why = None
        if source == CORE and target in (CACHE, CLI):
            why = f"the core never imports the {target}"
        elif source == CACHE and target == CLI:
            why = "the cache never imports the command line"
        elif source == CACHE and target == CACHE:
            lower, upper = cache_layer(edge.importer, layers), cache_layer(edge.imported, layers)
            if lower is not None and upper is not None and upper[0] > lower[0]:
                why = f"layer {lower[1]!r} never imports the higher layer {upper[1]!r}"
        if why:
            reports.append(f"{edge.where(tree.root)}: {edge.importer} -> {edge.imported}: {why}")
    return sorted(set(reports))


def _fail(what: str, reports: Sequence[str]) -> None:
    if reports:
        pytest.fail(f"{len(reports)} {what}:\n" + "\n".join(reports), pytrace=False)


# ---------------------------------------------------------------- the real tree


@pytest.fixture(scope="module")
def source_tree() -> Tree:
    return Tree.read(REPOSITORY)


def test_the_tree_is_read(source_tree: Tree) -> None:
    """A guard against a checker that passes because it read nothing."""
    for name in ("aot.errors", "aot.cache.cache", "aot.cache.storage.objectstore", "aot.cli.main"):
        assert name in source_tree.modules
    assert any(e.importer == "aot.cli.main" and e.imported.startswith("aot.cli.") for e in source_tree.imports)


def test_no_import_circles(source_tree: Tree) -> None:
    _fail("import circles (function-level and TYPE_CHECKING imports count)", import_circles(source_tree))


def test_no_private_names_across_modules(source_tree: Tree) -> None:
    _fail("private names used across modules (give them a public name)", private_imports(source_tree))


def test_no_file_over_800_lines(source_tree: Tree) -> None:
    _fail("source files over the limit", long_files(source_tree))


def test_no_class_over_400_lines(source_tree: Tree) -> None:
    _fail("classes over the limit", long_classes(source_tree))


def test_every_cache_module_has_a_layer(source_tree: Tree) -> None:
    _fail("cache modules without a layer", unplaced_modules(source_tree))


def test_layers(source_tree: Tree) -> None:
    _fail("imports against the layers of DESIGN.md", layer_violations(source_tree))


# ---------------------------------------------------------------- the checker itself


def _write(root: Path, files: Mapping[str, str]) -> Tree:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for folder, _ in SOURCE_ROOTS:
        (root / folder).mkdir(exist_ok=True)
    return Tree.read(root)


def test_checker_finds_a_two_module_circle(tmp_path: Path) -> None:
    tree = _write(tmp_path, {
        "aot/__init__.py": "",
        "aot/a.py": "from aot.b import thing\n",
        "aot/b.py": "import aot.a\nthing = 1\n",
        "aot/c.py": "from aot import a\n",
    })
    (report,) = import_circles(tree)
    assert report.splitlines() == [
        "circle of 2 modules: aot.a, aot.b",
        "  aot.a -> aot.b  (aot/a.py:1)",
        "  aot.b -> aot.a  (aot/b.py:1)",
    ]


def test_checker_finds_a_function_level_circle_through_relative_imports(tmp_path: Path) -> None:
    tree = _write(tmp_path, {
        "cli/__init__.py": "",
        "cli/main.py": "from .common import State\n",
        "cli/common.py": "class State:\n    def helper(self):\n        from .main import main\n        return main\n",
    })
    (report,) = import_circles(tree)
    assert "aot.cli.common -> aot.cli.main  (cli/common.py:3)" in report
    assert "aot.cli.main -> aot.cli.common  (cli/main.py:1)" in report


def test_checker_finds_a_longer_circle_and_keeps_two_apart(tmp_path: Path) -> None:
    ring = {f"aot/m{i}.py": f"import aot.m{(i + 1) % 5}\n" for i in range(5)}
    tree = _write(tmp_path, {
        **ring,
        "aot/x.py": "from aot import y\n",
        "aot/y.py": "def f():\n    import aot.x\n",
        "aot/z.py": "import aot.m0\n",  # imports the ring, is not part of it
    })
    reports = import_circles(tree)
    assert [r.splitlines()[0] for r in reports] == [
        "circle of 5 modules: aot.m0, aot.m1, aot.m2, aot.m3, aot.m4",
        "circle of 2 modules: aot.x, aot.y",
    ]


def test_checker_counts_importlib_with_a_literal_name(tmp_path: Path) -> None:
    tree = _write(tmp_path, {
        "aot/a.py": "import aot.b\n",
        "aot/b.py": "import importlib\ndef f():\n    return importlib.import_module('aot.a')\n",
    })
    (report,) = import_circles(tree)
    assert "aot.b -> aot.a  (aot/b.py:3)" in report


def test_checker_counts_type_checking_imports_as_type_only(tmp_path: Path) -> None:
    tree = _write(tmp_path, {
        "aot/a.py": "import aot.b\n",
        "aot/b.py": (
            "import typing\n"
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from aot.a import A\n"
            "if typing.TYPE_CHECKING:\n    import aot.a\n"
        ),
    })
    assert [(e.line, e.type_only) for e in tree.imports if e.importer == "aot.b"] == [(4, True), (6, True)]
    assert len(import_circles(tree)) == 1  # a type names a dependency: a circle all the same
    # ... and what runs in the else branch runs.
    tree = _write(tmp_path, {
        "aot/b.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    pass\nelse:\n    import aot.a\n",
    })
    assert [(e.line, e.type_only) for e in tree.imports if e.importer == "aot.b"] == [(5, False)]


def test_checker_finds_private_names_across_modules(tmp_path: Path) -> None:
    tree = _write(tmp_path, {
        "cache/__init__.py": "",
        "cache/index/__init__.py": "",
        "cache/index/sql.py": "_ART = 1\n__all__ = []\ndef _engine(): pass\n",
        "cache/stats.py": "from aot.cache.index.sql import _ART, __all__\n",
        "cache/storage.py": "def f():\n    from .index.sql import _engine\n",
        "cache/attr.py": "import aot.cache.index.sql as sql\nx = sql._ART\n",
        "cache/dotted.py": "import aot.cache.index.sql\nx = aot.cache.index.sql._engine\n",
        "cache/inside.py": "_mine = 1\ny = _mine\n",
        # A private module is private to its package.
        "cache/index/_impl.py": "",
        "cache/index/reader.py": "from . import _impl\n",
        "cache/outside.py": "from aot.cache.index import _impl\n",
    })
    assert private_imports(tree) == [
        "cache/attr.py:2: aot.cache.attr uses aot.cache.index.sql._ART",
        "cache/dotted.py:2: aot.cache.dotted uses aot.cache.index.sql._engine",
        "cache/outside.py:1: aot.cache.outside uses aot.cache.index._impl",
        "cache/stats.py:1: aot.cache.stats uses aot.cache.index.sql._ART",
        "cache/storage.py:2: aot.cache.storage uses aot.cache.index.sql._engine",
    ]


def test_checker_finds_long_files_and_classes(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(400))
    tree = _write(tmp_path, {
        "aot/long.py": "x = 1\n" * 801,
        "aot/fits.py": "x = 1\n" * 800,
        "aot/big_class.py": f"class Big:\n{body}",  # 401 lines
        "aot/fit_class.py": f"class Fits:\n{body[: body.rindex('    x399')]}",  # 400 lines
    })
    assert long_files(tree) == ["aot/long.py: 801 lines (limit 800)"]
    assert long_classes(tree) == ["aot/big_class.py:1: class Big is 401 lines (limit 400)"]


def test_checker_finds_imports_against_the_layers(tmp_path: Path) -> None:
    tree = _write(tmp_path, {
        "aot/__init__.py": "",
        "aot/core.py": "def f():\n    from aot.cache import names\n",
        "cache/__init__.py": "",
        "cache/names.py": "",
        "cache/store.py": "from aot.cache.names import x\nfrom aot.cache.admin import gc\n",
        "cache/admin/__init__.py": "",
        "cache/admin/gc.py": "import aot.cache.store\nimport aot.cli.main\n",
        "cache/storage/__init__.py": "",
        "cache/storage/folder.py": "from aot.cache.index import sql\n",
        "cache/index/__init__.py": "",
        "cache/index/sql.py": "from aot.cache.storage import folder\n",
        "cache/stray.py": "",
        "cli/__init__.py": "",
        "cli/main.py": "import aot.cache.cache\nimport aot.core\n",
    })
    assert layer_violations(tree) == [
        "aot/core.py:2: aot.core -> aot.cache.names: the core never imports the cache",
        "cache/admin/gc.py:2: aot.cache.admin.gc -> aot.cli.main: the cache never imports the command line",
        "cache/store.py:2: aot.cache.store -> aot.cache.admin.gc: layer 'store' never imports the higher layer 'admin'",
    ]
    assert unplaced_modules(tree) == ["cache/stray.py: aot.cache.stray has no layer in CACHE_LAYERS"]


def test_a_type_only_import_of_a_higher_layer_is_against_the_layers(tmp_path: Path) -> None:
    tree = _write(tmp_path, {
        "cache/__init__.py": "",
        "cache/store.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from aot.cache.admin.gc import Plan\n"
            "def collect():\n    from aot.cache.admin import gc\n"
        ),
        "cache/admin/__init__.py": "",
        "cache/admin/gc.py": "from aot.cache.store import collect\n",
    })
    assert layer_violations(tree) == [
        "cache/store.py:3: aot.cache.store -> aot.cache.admin.gc: layer 'store' never imports the higher layer 'admin'",
        "cache/store.py:5: aot.cache.store -> aot.cache.admin.gc: layer 'store' never imports the higher layer 'admin'",
    ]
    (circle,) = import_circles(tree)
    assert "aot.cache.store -> aot.cache.admin.gc  (cache/store.py:3)" in circle


def test_the_checks_fail_with_every_report(tmp_path: Path) -> None:
    tree = _write(tmp_path, {"aot/a.py": "import aot.b\n", "aot/b.py": "import aot.a\n"})
    with pytest.raises(pytest.fail.Exception, match=r"1 import circles.*\n.*aot\.a, aot\.b"):
        _fail("import circles", import_circles(tree))


def test_the_readme_layout_names_every_module() -> None:
    """README.md's layout section names every module of aot/, cache/ and cli/ (and each
    sub-package), so that the map a reader gets is the tree there is: a new module
    without its line fails here."""
    readme = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout"):].split("```")[1]
    missing = []
    for top in ("aot", "cache", "cli"):
        root = REPOSITORY / top
        for path in sorted(root.rglob("*.py")):
            if path.name != "__init__.py" and not re.search(rf"(?<![\w]){re.escape(path.name)}\b", layout):
                missing.append(str(path.relative_to(REPOSITORY)))
        for package in sorted(p for p in root.rglob("*") if (p / "__init__.py").is_file() and p != root):
            if f"{package.name}/" not in layout:
                missing.append(f"{package.relative_to(REPOSITORY)}/")
    assert missing == []


#: A string naming a platform, compared (issue 56): a platform branch, which the rooms of
#: aot/platforms own (DeviceTarget, the key, the compile step and the cache ask the room).
_PLATFORM_LITERAL = re.compile(r"""(==|!=| in )\s*\(?["'](cuda|gpu|tpu|rocm)["']|["']cuda:["']""")


def test_no_platform_branch_outside_the_platform_rooms() -> None:
    found = [
        f"{path.relative_to(REPOSITORY)}:{number}: {line.strip()}"
        for top in ("aot", "cache", "cli")
        for path in sorted((REPOSITORY / top).rglob("*.py"))
        if "platforms" not in path.relative_to(REPOSITORY).parts
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _PLATFORM_LITERAL.search(line)
    ]
    assert found == [], "\n".join(found)


def test_the_platform_literal_pattern_finds_a_branch() -> None:
    for line in ('if platform == "gpu":', "x in ('cuda', 'rocm')", 'name.startswith("cuda:")', 'p != "tpu"'):
        assert _PLATFORM_LITERAL.search(line), line
    assert not _PLATFORM_LITERAL.search("room = platforms.of(first.platform)")
