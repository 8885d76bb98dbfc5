"""Private JAX and jaxlib API is used in aot/jaxcompat/ and nowhere else.

The source of aot/, cache/ and cli/ (outside aot/jaxcompat/) is walked with ``ast``
(standard library only) and every private use is reported as ``file:line: what``:
- an import of ``jax._src``, ``jax.interpreters``, ``jax.lib``, ``jax.extend`` or a
  submodule of ``jaxlib`` (``import jaxlib`` for ``jaxlib.__version__`` is public);
  ``jax.extend`` is included because JAX gives it no compatibility guarantee;
- the same reached as an attribute (``jax._src.core``, ``jaxlib.xla_client``) or named
  in a string (``sys.modules.get("jax._src.distributed")``, ``import_module``);
- a private attribute that aot/jaxcompat reads on JAX objects
  (``aot.jaxcompat.PRIVATE_ATTRIBUTES``: ``compiled._executable``, ...), read on
  anything but ``self``/``cls`` or through ``getattr(x, "_name")``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from aot.jaxcompat import PRIVATE_ATTRIBUTES

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("aot", "cache", "cli")
ALLOWED = ROOT / "aot" / "jaxcompat"

_PRIVATE_MODULE = re.compile(r"^(jax\.(_src|interpreters|lib|extend)|jaxlib\.[A-Za-z_]\w*)(\.\w+)*$")
_JAX_PRIVATE_ATTRIBUTES = {"jax": {"interpreters", "lib", "extend"}, "jaxlib": set()}


def _is_private_module(name: str) -> bool:
    return bool(_PRIVATE_MODULE.match(name)) and name != "jaxlib.__version__"


def _private_attribute_of_package(node: ast.Attribute) -> bool:
    """``jax._src``, ``jax.interpreters``, ``jaxlib.xla_client``, ... on the names
    ``jax`` and ``jaxlib`` (a dunder such as ``jaxlib.__version__`` is public)."""
    if not isinstance(node.value, ast.Name) or node.value.id not in _JAX_PRIVATE_ATTRIBUTES:
        return False
    attr = node.attr
    if attr.startswith("__"):
        return False
    if node.value.id == "jaxlib":
        return True  # every jaxlib attribute but its version is a private module
    return attr.startswith("_") or attr in _JAX_PRIVATE_ATTRIBUTES["jax"]


def private_uses(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """``(line, what)`` for each private JAX use in ``source``."""
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_private_module(alias.name):
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _is_private_module(node.module):
                yield node.lineno, f"from {node.module} import ..."
            elif node.module in ("jax", "jaxlib"):
                for alias in node.names:
                    if _is_private_module(f"{node.module}.{alias.name}"):
                        yield node.lineno, f"from {node.module} import {alias.name}"
        elif isinstance(node, ast.Attribute):
            if _private_attribute_of_package(node):
                yield node.lineno, f"{node.value.id}.{node.attr}"  # type: ignore[attr-defined]
            elif node.attr in PRIVATE_ATTRIBUTES and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                yield node.lineno, f"private attribute .{node.attr}"
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Name) and func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in PRIVATE_ATTRIBUTES
            ):
                yield node.lineno, f"{func.id}(..., {node.args[1].value!r})"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _is_private_module(node.value):
                yield node.lineno, f"the module name {node.value!r}"


def offenders(finder: Callable[[str, str], Iterable[tuple[int, str]]] | None = None) -> list[str]:
    """``finder(source, relative path)``'s findings (default: private uses) in every scanned
    file outside aot/jaxcompat, as ``path:line: what``."""
    finder = finder or private_uses
    found = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ALLOWED in path.parents:
                continue
            relative = path.relative_to(ROOT)
            found += [f"{relative}:{line}: {what}" for line, what in sorted(finder(path.read_text(), str(relative)))]
    return found


def test_no_private_jax_outside_jaxcompat() -> None:
    found = offenders()
    assert not found, (
        "private JAX/jaxlib API outside aot/jaxcompat/ (wrap it there, list it in "
        "aot.jaxcompat.PRIVATE_SYMBOLS and call the wrapper):\n  " + "\n  ".join(found)
    )


def test_the_walk_finds_each_kind_of_private_use() -> None:
    source = '''
import jaxlib
import jax._src.core
from jax._src import stages
from jax._src.lib import xla_client as xc
from jax.interpreters import pxla
from jax import _src
from jax.extend import backend
from jaxlib import xla_client
import sys, jax
version = jaxlib.__version__
client = jaxlib.xla_client
core = jax._src.core
module = sys.modules.get("jax._src.distributed")
unloaded = compiled._executable._unloaded_executable
maybe = getattr(compiled, "_executable", None)
self._executable = None
'''
    found = [(line, what) for line, what in private_uses(source)]
    assert found and {line for line, _ in found} == {3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15, 16}, found
    assert (15, "private attribute ._executable") in found and (15, "private attribute ._unloaded_executable") in found


def test_public_uses_are_not_reported() -> None:
    source = '''
import jax, jaxlib
import jax.numpy as jnp
from jax.sharding import NamedSharding
version = jaxlib.__version__
names = ("jax", "jaxlib")
structure = jax.tree_util.tree_structure(1)
self._executable(program)
'''
    assert list(private_uses(source)) == []


def test_jaxcompat_imports_nothing_of_ours_but_itself() -> None:
    """aot/jaxcompat is a leaf: the core imports it, never the other way round, so it
    can be reviewed (and replaced on a JAX upgrade) alone."""
    found = []
    for path in sorted(ALLOWED.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            for module in modules:
                if module.split(".")[0] == "aot" and not module.startswith("aot.jaxcompat"):
                    found.append(f"{path.name}:{node.lineno}: {module}")
    assert not found, "aot/jaxcompat imports the code that uses it:\n  " + "\n  ".join(found)


def _jax_names(tree: ast.AST) -> set[str]:
    """The names a module binds to JAX or jaxlib modules (``jax``, ``jnp``, ``lax``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("jax", "jaxlib"):
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in ("jax", "jaxlib"):
                names |= {alias.asname or alias.name for alias in node.names}
    return names


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def release_probes(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """``(line, what)`` for each probe of the JAX release outside aot/jaxcompat:
    a ``hasattr``, or a ``getattr`` with a default, on a JAX module or anything reached
    from one (``jax.export``, ``jnp``), a ``getattr`` of a computed name there, and a
    comparison with ``jax.__version__`` (that is ``jaxcompat.releases.same_release``).
    A two-argument ``getattr(jax.config, "jax_enable_x64")`` reads a flag every release
    has (it raises when one is missing): not a probe."""
    tree = ast.parse(source, filename)
    jax_names = _jax_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            func, target = node.func.id, node.args[0]
            if func not in ("getattr", "hasattr") or _root(target) not in jax_names:
                continue
            constant = len(node.args) == 2 and isinstance(node.args[1], ast.Constant)
            if func == "getattr" and constant and not node.keywords:
                continue
            yield node.lineno, f"{func}({ast.unparse(target)}, ...)"
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(
                isinstance(o, ast.Attribute) and o.attr == "__version__" and _root(o) in jax_names
                for o in operands
            ):
                yield node.lineno, f"{ast.unparse(node)} (use aot.jaxcompat.releases.same_release)"


def test_no_release_probe_outside_jaxcompat() -> None:
    """What differs between JAX releases is decided in aot/jaxcompat only (DESIGN.md,
    "one same_release(), no getattr(jax...) probes elsewhere")."""
    found = offenders(lambda source, _: release_probes(source))
    assert not found, (
        "JAX release probes outside aot/jaxcompat/ (move them there, e.g. into "
        "aot.jaxcompat.releases, and name each release difference):\n  " + "\n  ".join(found)
    )


def test_the_walk_finds_each_kind_of_release_probe() -> None:
    source = '''
import jax
import jax.numpy as jnp
from jax import export as jex
import jaxlib
low = getattr(jax.export, "minimum_supported_calling_convention_version", None)
has = hasattr(jnp, "float8_e8m0fnu")
again = getattr(jex, name)
dtype = getattr(jnp, "int2", None)
if manifest.jax_version != jax.__version__:
    pass
old = jaxlib.__version__ == "0.9.2"
x64 = getattr(jax.config, "jax_enable_x64")
other = getattr(thing, "field", None)
public = jax.__version__
'''
    found = {line for line, _ in release_probes(source)}
    assert found == {6, 7, 8, 9, 10, 12}, sorted(release_probes(source))
