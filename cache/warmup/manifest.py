"""Warmup manifests (TOML): parsing, validation and ``vary`` expansion into items.

A manifest is TOML with one ``[[function]]`` table per function::

    [[function]]
    name     = "mlp.forward"                    # the name aot.load() serves it under
    function = "fixtures.models:mlp_forward"    # module:attribute of the function
    args     = ["@fixtures.models:mlp_param_specs", "f32[{batch},784]"]
    vary     = { batch = [1, 8, 32] }           # one entry per value (cartesian product)

Optional keys: ``args_from = "module:callable"`` (its result comes before ``args``: a
tuple is several positional arguments, anything else one), ``kwargs`` (a table of
spec strings), ``static`` (a table of JSON-able
values passed as static keyword arguments), ``pmap = "AXIS"`` (lower with
:func:`aot.lower_pmap`), ``mesh = "data=4,model=2"`` with ``in_shardings`` (one
partition-spec string per positional argument, ``"auto"`` for unspecified) and
``out_shardings`` (a string or a list), ``donate`` (argument indices), ``x64 = true``
(lower and compile this entry with 64-bit types enabled, as under
``jax.enable_x64(True)``; without it the process's own mode applies), ``target`` (the
device target(s) this function is compiled for, ``"tpu:v5e:2x2"`` or a list, instead of
the top-level ``target``; ``"host"`` is this host's devices).

``target`` always names a device target (:mod:`aot.targets`). Manifests written before
``function`` existed name the Python function with ``target = "module:attr"``; that is
still read (a ``target`` that is MODULE:ATTRIBUTE, in a table without ``function``), with
one warning per manifest naming the lines to change.

A spec string is ``DTYPE[DIMS][@SHARDING]`` (see :mod:`aot.specs`); ``"@module:callable"``
stands for the pytree of specs that the callable returns (for example
``jax.eval_shape(init, ...)``). ``"{key}"`` placeholders in args, kwargs, static values
and the name are replaced by each value of ``vary[key]``; the name usually stays the
same, because buckets are signatures of one name.

:func:`load_manifest` parses and validates a file (raising :class:`aot.ManifestError`
with the file, the TOML line and the entry) and :func:`expand` turns it into
:class:`WarmupItem` s. Nothing here imports JAX or the functions: see
:mod:`aot.cache.warmup.functions` for resolving an item and :mod:`aot.cache.warmup.run` for running.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aot import platforms
from aot.errors import AotError, IncompatibleEnvironmentError, ManifestError, SpecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "AUTO_SHARDING",
    "FLEET_DISTRIBUTIONS",
    "FunctionEntry",
    "HOST",
    "RESERVED_KWARGS",
    "WarmupItem",
    "WarmupManifest",
    "expand",
    "installed_version",
    "items_named",
    "load_manifest",
    "parse_manifest",
    "parse_mesh",
]


# Keyword arguments of aot.lower(): a function's own kwargs cannot use these names.
RESERVED_KWARGS = frozenset({
    "fn", "name", "pmap", "static_argnums", "static_argnames", "donate_argnums", "mesh",
    "in_shardings", "out_shardings", "compiler_options",
})

log = logging.getLogger(__name__)

_FUNCTION_KEYS = (
    "name", "function", "target", "args", "args_from", "kwargs", "static", "vary", "pmap", "mesh",
    "in_shardings", "out_shardings", "donate", "x64",
)
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")  # MODULE:ATTRIBUTE
#: ``target = "host"``: this host's own devices, even where the top level names targets.
HOST = "host"
_TOML_LINE = re.compile(r"\(at line (\d+), column (\d+)\)")

#: How deeply arrays and tables may nest in a manifest (a real one nests 3 or 4 levels:
#: ``static = { layers = [[1, 2], [3]] }``). Deeper input would exhaust Python's stack
#: in the TOML reader or in expanding ``vary`` placeholders.
MAX_NESTING = 64


def _nesting_depth(value: Any) -> int:
    """How deeply lists and dicts nest in ``value`` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if depth <= MAX_NESTING:
            stack.extend((child, depth) for child in children)
    return deepest


def _too_deep(path: str) -> ManifestError:
    return ManifestError(
        f"{path}: arrays or tables nest more than {MAX_NESTING} levels deep (the limit); a "
        "manifest's args, kwargs, static and vary need a few levels: flatten the nesting, or "
        "build a deep pytree in Python and name it with args_from = \"MODULE:CALLABLE\""
    )
_FUNCTION_HEADER = re.compile(r"^\s*\[\[\s*function\s*\]\]")
_MESH_AXIS = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+)\s*$")
AUTO_SHARDING = "auto"


# ---------------------------------------------------------------- data


@dataclass(frozen=True, slots=True)
class WarmupItem:
    """One compile: a function, its argument specs, and how to lower it.

    ``args`` / ``kwargs`` values are spec strings or ``"@module:callable"``; ``static``
    values are JSON values passed as static keyword arguments. Items are plain data,
    so they cross process boundaries (spawned workers) as they are.
    """

    name: str
    function: str  # MODULE:ATTRIBUTE of the Python function
    args: tuple[str, ...] = ()
    kwargs: tuple[tuple[str, str], ...] = ()
    args_from: str | None = None
    static: tuple[tuple[str, Any], ...] = ()
    pmap: str | None = None
    mesh: tuple[tuple[str, int], ...] | None = None
    in_shardings: tuple[str, ...] | None = None
    out_shardings: str | tuple[str, ...] | None = None
    donate: tuple[int, ...] = ()
    x64: bool = False  # lower and compile under jax.enable_x64(True)
    bucket: tuple[tuple[str, Any], ...] = ()
    base_dir: str | None = None
    source: str | None = None  # "file.toml:LINE" of the [[function]] it came from
    device_target: str | None = None  # compile for this accelerator (aot.targets), not this host

    def __post_init__(self) -> None:
        problem = _item_problem(self)
        if problem is not None:
            error = ManifestError(f"{self.label}: {problem}")
            error.problem = problem  # type: ignore[attr-defined]
            raise error

    @property
    def label(self) -> str:
        """``name[batch=8]``: the name and the bucket this item compiles."""
        label = self.name
        if self.bucket:
            label += f"[{','.join(f'{k}={v}' for k, v in self.bucket)}]"
        return label + (f"@{self.device_target}" if self.device_target else "")

    def describe_args(self) -> str:
        parts = ([f"*@{self.args_from}"] if self.args_from else []) + list(self.args) + [f"{k}={v}" for k, v in self.kwargs]
        parts += [f"{k}={json.dumps(v)}" for k, v in self.static]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "function": self.function,
            "target": self.device_target,  # None: this host's devices
            "args": list(self.args),
            "args_from": self.args_from,
            "kwargs": dict(self.kwargs),
            "static": dict(self.static),
            "bucket": dict(self.bucket),
            "pmap": self.pmap,
            "mesh": dict(self.mesh) if self.mesh is not None else None,
            "in_shardings": list(self.in_shardings) if self.in_shardings is not None else None,
            "out_shardings": (
                list(self.out_shardings) if isinstance(self.out_shardings, tuple)
                else self.out_shardings
            ),
            "donate": list(self.donate),
            "x64": self.x64,
            "source": self.source,
        }


def _item_problem(item: WarmupItem) -> str | None:
    if not item.name:
        return "the name is empty"
    if not _FUNCTION.match(item.function):
        return f"function {item.function!r} is not MODULE:ATTRIBUTE (e.g. 'fixtures.models:tiny')"
    if item.args_from is not None and not _FUNCTION.match(item.args_from.lstrip("@")):
        return f"args_from {item.args_from!r} is not MODULE:CALLABLE"
    clash = sorted(RESERVED_KWARGS & ({k for k, _ in item.kwargs} | {k for k, _ in item.static}))
    if clash:
        return (
            f"keyword arguments {clash} clash with aot.lower()'s own parameters; rename "
            "them in the function"
        )
    both = sorted({k for k, _ in item.kwargs} & {k for k, _ in item.static})
    if both:
        return f"{both} are given both as kwargs and as static"
    if item.pmap is not None:
        extra = [
            what for what, present in (
                ("kwargs", item.kwargs), ("static", item.static), ("mesh", item.mesh),
                ("in_shardings", item.in_shardings is not None),
                ("out_shardings", item.out_shardings is not None),
            ) if present
        ]
        if extra:
            return f"pmap entries take positional args only; remove {', '.join(extra)}"
    elif item.mesh is None:
        sharded = [a for a in item.args if "@" in a.lstrip("@")] + [
            v for _, v in item.kwargs if "@" in v.lstrip("@")
        ]
        if item.in_shardings is not None or item.out_shardings is not None:
            return "in_shardings / out_shardings need a mesh (mesh = \"data=4,model=2\")"
        if sharded:
            return f"spec {sharded[0]!r} names a sharding but no mesh is given"
    if any(d < 0 for d in item.donate):
        return f"donate indices must be >= 0, got {list(item.donate)}"
    return None


@dataclass(frozen=True, slots=True)
class FunctionEntry:
    """One ``[[function]]`` table of a manifest, validated, before ``vary`` expansion."""

    index: int
    line: int | None
    name: str
    function: str
    args: tuple[str, ...]
    args_from: str | None
    kwargs: tuple[tuple[str, str], ...]
    static: tuple[tuple[str, Any], ...]
    vary: tuple[tuple[str, tuple[Any, ...]], ...]
    pmap: str | None
    mesh: tuple[tuple[str, int], ...] | None
    in_shardings: tuple[str, ...] | None
    out_shardings: str | tuple[str, ...] | None
    donate: tuple[int, ...]
    x64: bool = False
    # Its own ``target``: the device targets it is compiled for (canonical names, "host"
    # for this host's devices); None: the manifest's top-level targets.
    targets: tuple[str, ...] | None = None

    @property
    def buckets(self) -> int:
        count = 1
        for _, values in self.vary:
            count *= len(values)
        return count


@dataclass(frozen=True, slots=True)
class WarmupManifest:
    path: str
    functions: tuple[FunctionEntry, ...]
    # Top-level ``target``: the device targets every function without its own ``target``
    # is compiled for (aot.targets; empty: this host's devices).
    targets: tuple[str, ...] = ()
    # What a reader of the file should change (the old ``target = "module:attr"``
    # spelling); already logged once when the file was parsed.
    warnings: tuple[str, ...] = ()
    # ``[fleet]``: (distribution, version) the fleet runs, which a runner compiling for
    # it must have (:meth:`check_fleet`): libtpu, jax, jaxlib.
    fleet: tuple[tuple[str, str], ...] = ()

    def check_fleet(self) -> None:
        """Raises :class:`aot.IncompatibleEnvironmentError` naming each ``[fleet]`` pin
        this process's installed version differs from: a runner with another compiler
        fails its warm-up or gate, not the fleet's deploy (its entries would be for an
        environment the fleet does not run)."""
        differences = []
        for distribution, pinned in self.fleet:
            installed = installed_version(distribution)
            if installed != pinned:
                differences.append(f"{distribution} {pinned} != {installed or 'not installed'}")
        if differences:
            pins = " ".join(f"'{d}=={v}'" for d, v in self.fleet)
            raise IncompatibleEnvironmentError(
                f"{self.path}: [fleet] pins {', '.join(f'{d} {v}' for d, v in self.fleet)}, and this "
                f"process has another: {'; '.join(differences)} (pinned != installed); entries compiled "
                f"here would not be the fleet's. Install the pinned versions (pip install {pins}) or "
                "change the pins", tuple(differences),
            )

    def for_targets(self, targets: Iterable[str]) -> WarmupManifest:
        """The same functions for other device targets (``aot warmup --target``): they
        replace the file's targets, the top-level ones and every function's own.
        Raises :class:`aot.DeviceTargetError` for an unknown target."""
        return dataclasses.replace(
            self, targets=canonical_targets(targets),
            functions=tuple(dataclasses.replace(f, targets=None) for f in self.functions),
        )

    @property
    def base_dir(self) -> str:
        return str(Path(self.path).resolve().parent)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "functions": [
                {"name": f.name, "function": f.function, "line": f.line, "buckets": f.buckets,
                 "x64": f.x64, "targets": list(f.targets) if f.targets is not None else None}
                for f in self.functions
            ],
            "targets": list(self.targets),
            "fleet": dict(self.fleet),
        }


#: The distributions a manifest's ``[fleet]`` table may pin, and the names each is
#: installed under (libtpu's nightly builds are another distribution): the compilers of
#: a TPU (libtpu) and of a GPU (JAX's CUDA plugin, whose release is jaxlib's).
FLEET_DISTRIBUTIONS = {
    "libtpu": ("libtpu", "libtpu-nightly"), "jax": ("jax",), "jaxlib": ("jaxlib",),
    "jax-cuda12-plugin": ("jax-cuda12-plugin",), "jax-cuda13-plugin": ("jax-cuda13-plugin",),
}


def installed_version(distribution: str) -> str | None:
    """The installed version of a :data:`FLEET_DISTRIBUTIONS` key, from the package
    metadata (never importing it: libtpu opens no device to say its version); None when
    not installed."""
    import importlib.metadata

    for name in FLEET_DISTRIBUTIONS.get(distribution, (distribution,)):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _fleet(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ManifestError(f"{path}: [fleet] must be a table of versions (libtpu = \"0.0.42.1\")")
    unknown = sorted(set(value) - set(FLEET_DISTRIBUTIONS))
    if unknown:
        raise ManifestError(
            f"{path}: [fleet] pins {', '.join(unknown)}, which it cannot pin; it pins "
            f"{', '.join(FLEET_DISTRIBUTIONS)} (libtpu = \"0.0.42.1\")"
        )
    bad = sorted(k for k, v in value.items() if not isinstance(v, str) or not v.strip())
    if bad:
        raise ManifestError(f"{path}: [fleet] {bad[0]} must be a version string (libtpu = \"0.0.42.1\")")
    return tuple((k, value[k].strip()) for k in FLEET_DISTRIBUTIONS if k in value)


# ---------------------------------------------------------------- parsing


def load_manifest(path: str | os.PathLike[str]) -> WarmupManifest:
    """Reads and validates a warmup manifest; raises :class:`aot.ManifestError`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such manifest file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read the manifest: {exc}") from None
    return parse_manifest(text, str(path))


def parse_manifest(text: str, path: str = "<manifest>") -> WarmupManifest:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = _TOML_LINE.search(message)
        where = f"{path}:{match.group(1)}" if match else path
        message = _TOML_LINE.sub("", message).strip()
        raise ManifestError(f"{where}: invalid TOML: {message}") from None
    except RecursionError:  # the TOML reader recurses once per level of nesting
        raise _too_deep(path) from None
    if _nesting_depth(data) > MAX_NESTING:
        raise _too_deep(path)
    unknown = sorted(set(data) - {"function", "target", "fleet"})
    if unknown:
        raise ManifestError(
            f"{path}: unknown top-level key(s) {unknown}{_did_you_mean(unknown, ('function', 'target', 'fleet'))}; "
            "a manifest holds [[function]] tables "
            "(and optionally a top-level target = \"tpu:v5e:2x2\" or a list of them, and a "
            "[fleet] table of pinned versions)"
        )
    fleet = _fleet(data.get("fleet"), path)
    try:
        targets = _device_targets(data.get("target"))
    except ManifestError as exc:
        raise ManifestError(f"{path}: the top-level target: {exc}") from None
    tables = data.get("function")
    if tables is None:
        raise ManifestError(f"{path}: no [[function]] tables; nothing to compile")
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ManifestError(f"{path}: 'function' must be an array of tables ([[function]])")
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if _FUNCTION_HEADER.match(line)]
    if len(lines) != len(tables):
        lines = []  # inline tables: no line numbers to give
    functions = []
    old_spelling: list[tuple[str, str]] = []  # (where, function) written as target = "m:f"
    for index, table in enumerate(tables):
        line = lines[index] if lines else None
        functions.append(_parse_function(table, index, line, path, old_spelling))
    warnings: tuple[str, ...] = ()
    if old_spelling:
        warnings = (_old_spelling_warning(path, old_spelling),)
        log.warning("%s", warnings[0])
    return WarmupManifest(path, tuple(functions), targets, warnings, fleet)


def _did_you_mean(unknown: Iterable[str], known: Iterable[str]) -> str:
    """`` (did you mean 'function'?)`` for the unknown keys close to a known one."""
    import difflib

    known = list(known)
    close = [match for key in unknown for match in difflib.get_close_matches(key, known, n=1)]
    return f" (did you mean {' or '.join(map(repr, dict.fromkeys(close)))}?)" if close else ""


def _old_spelling_warning(path: str, old: list[tuple[str, str]]) -> str:
    shown = ", ".join(f"{where} ({function})" for where, function in old[:5])
    more = f" and {len(old) - 5} more" if len(old) > 5 else ""
    first = old[0][1]
    return (
        f"{path}: {len(old)} [[function]] table{'s' if len(old) != 1 else ''} name the Python "
        f"function with target = \"MODULE:ATTRIBUTE\", the old spelling: {shown}{more}; write "
        f"function = \"{first}\" instead (target now names a device target such as "
        "\"tpu:v5e:2x2\"); the old spelling is still read"
    )


def canonical_targets(values: Iterable[str]) -> tuple[str, ...]:
    """Device target names (or ``"host"``) -> their canonical names, each once, in order:
    ``tpu:v5e:2x2`` and ``tpu:v5e:2x2@2x2`` are one target, compiled once. Raises
    :class:`aot.DeviceTargetError` for an unknown target."""
    from aot.targets import parse_target

    names: dict[str, None] = {}
    for value in values:
        name = HOST if value.strip().lower() == HOST else parse_target(value).name
        names.setdefault(name, None)
    return tuple(names)


def _device_targets(value: Any) -> tuple[str, ...]:
    """A ``target`` value: a device target string (or ``"host"``) or a list of them,
    checked here (no JAX, no libtpu): an unknown one names the known ones."""
    if value is None:
        return ()
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise ManifestError(
            "a device target string (\"tpu:v5e:2x2\", or \"host\" for this host's devices) "
            f"or a non-empty list of them is expected, got {value!r}"
        )
    try:
        return canonical_targets(values)
    except AotError as exc:
        raise ManifestError(str(exc)) from None


def _names_function(target: str) -> bool:
    """Whether a ``target`` string is the old spelling of ``function`` (MODULE:ATTRIBUTE),
    not a GPU target, which has the same shape (``cuda:h200``)."""
    return bool(_FUNCTION.match(target)) and not platforms.captured_target(target)


def _function_and_targets(
    table: dict[str, Any], fail: Callable[[str], ManifestError],
) -> tuple[str, tuple[str, ...] | None, bool]:
    """A table's Python function and own device targets (None: the top level's), and
    whether the function was given with the old spelling ``target = "module:attr"``."""
    function = table.get("function")
    target = table.get("target")
    old = False
    if function is None and isinstance(target, str) and _names_function(target):
        function, target, old = target, None, True  # before ``function`` existed
    if function is None:
        raise fail(
            "no 'function': name the Python function to compile as function = "
            "\"MODULE:ATTRIBUTE\" (e.g. 'fixtures.models:tiny')"
            + (f"; target = {target!r} is not MODULE:ATTRIBUTE (and 'target' names device "
               "targets now)" if target is not None else "")
        )
    if not isinstance(function, str) or not _FUNCTION.match(function):
        raise fail(
            f"'function' must be 'MODULE:ATTRIBUTE' (e.g. 'fixtures.models:tiny'), got {function!r}"
        )
    if isinstance(target, str) and _names_function(target):
        raise fail(
            f"target = {target!r} looks like a Python function, but 'function' already names "
            f"{function!r}; target is a device target (\"tpu:v5e:2x2\", a list, or \"host\")"
        )
    if target is None:
        return function, None, old
    try:
        return function, _device_targets(target), old
    except ManifestError as exc:
        raise fail(f"'target': {exc}") from None


def _parse_function(
    table: dict[str, Any], index: int, line: int | None, path: str,
    old_spelling: list[tuple[str, str]] | None = None,
) -> FunctionEntry:
    label = table.get("name") if isinstance(table.get("name"), str) else None
    where = f"{path}:{line}" if line is not None else path
    entry_desc = f"[[function]] #{index + 1}" + (f" ({label!r})" if label else "")

    def fail(problem: str) -> ManifestError:
        return ManifestError(f"{where}: {entry_desc}: {problem}")

    unknown = sorted(set(table) - set(_FUNCTION_KEYS))
    if unknown:
        raise fail(f"unknown key(s) {unknown}{_did_you_mean(unknown, _FUNCTION_KEYS)}; expected some of {list(_FUNCTION_KEYS)}")
    function, targets, old = _function_and_targets(table, fail)
    if old and old_spelling is not None:
        old_spelling.append((where, function))
    name = table.get("name", function.replace(":", "."))
    if not isinstance(name, str) or not name:
        raise fail(f"'name' must be a non-empty string, got {name!r}")
    args = table.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise fail(f"'args' must be a list of spec strings, got {args!r}")
    args_from = table.get("args_from")
    if args_from is not None and (not isinstance(args_from, str) or not _FUNCTION.match(args_from.lstrip("@"))):
        raise fail(f"'args_from' must be 'MODULE:CALLABLE', got {args_from!r}")
    kwargs = table.get("kwargs", {})
    if not isinstance(kwargs, dict) or not all(isinstance(v, str) for v in kwargs.values()):
        raise fail(f"'kwargs' must be a table of spec strings, got {kwargs!r}")
    static = table.get("static", {})
    if not isinstance(static, dict):
        raise fail(f"'static' must be a table of values, got {static!r}")
    vary = table.get("vary", {})
    if not isinstance(vary, dict):
        raise fail(f"'vary' must be a table of lists, e.g. {{ batch = [1, 8] }}, got {vary!r}")
    vary_items: list[tuple[str, tuple[Any, ...]]] = []
    for key, values in vary.items():
        if not isinstance(values, list) or not values:
            raise fail(f"vary.{key} must be a non-empty list, got {values!r}")
        if not all(isinstance(v, (str, int, float, bool)) for v in values):
            raise fail(f"vary.{key} values must be strings or numbers, got {values!r}")
        vary_items.append((key, tuple(values)))
    pmap = table.get("pmap")
    if pmap is not None and (not isinstance(pmap, str) or not pmap):
        raise fail(f"'pmap' must be the axis name (a string), got {pmap!r}")
    mesh = None
    if "mesh" in table:
        try:
            mesh = parse_mesh(table["mesh"])
        except SpecError as exc:
            raise fail(str(exc)) from None
    in_shardings = table.get("in_shardings")
    if in_shardings is not None:
        if not isinstance(in_shardings, list) or not all(isinstance(s, str) for s in in_shardings):
            raise fail(f"'in_shardings' must be a list of strings like 'data,None', got {in_shardings!r}")
        in_shardings = tuple(in_shardings)
    out_shardings = table.get("out_shardings")
    if out_shardings is not None:
        if isinstance(out_shardings, list) and all(isinstance(s, str) for s in out_shardings):
            out_shardings = tuple(out_shardings)
        elif not isinstance(out_shardings, str):
            raise fail(f"'out_shardings' must be a string or a list of strings, got {out_shardings!r}")
    donate = table.get("donate", [])
    if isinstance(donate, int) and not isinstance(donate, bool):
        donate = [donate]
    if not isinstance(donate, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in donate
    ):
        raise fail(f"'donate' must be a list of argument indices, got {donate!r}")
    x64 = table.get("x64", False)
    if not isinstance(x64, bool):
        raise fail(f"'x64' must be true or false, got {x64!r}")
    # Every placeholder must be a vary key, and every vary key must be used.
    texts = [name, *args, *kwargs.values(), json.dumps(static)]
    used = {m for t in texts for m in _PLACEHOLDER.findall(t)}
    undefined = sorted(used - set(vary))
    if undefined:
        raise fail(
            f"placeholder(s) {['{' + u + '}' for u in undefined]} have no values in 'vary'"
        )
    unused = sorted(set(vary) - used)
    if unused:
        raise fail(f"vary key(s) {unused} are not used as '{{key}}' in args, kwargs or static")
    entry = FunctionEntry(
        index=index, line=line, name=name, function=function, args=tuple(args), args_from=args_from,
        kwargs=tuple(sorted(kwargs.items())), static=tuple(sorted(static.items())),
        vary=tuple(vary_items), pmap=pmap, mesh=mesh, in_shardings=in_shardings,
        out_shardings=out_shardings, donate=tuple(donate), x64=x64, targets=targets,
    )
    try:  # check the combination once, with the first bucket
        next(_expand_function(entry, None, path))
    except ManifestError as exc:
        raise fail(getattr(exc, "problem", str(exc))) from None
    return entry


def parse_mesh(value: Any) -> tuple[tuple[str, int], ...]:
    """``"data=4,model=2"`` (or a table ``{data = 4, model = 2}``) -> axis sizes."""
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, str):
        pairs = []
        for part in value.split(","):
            match = _MESH_AXIS.match(part)
            if match is None:
                raise SpecError(
                    f"malformed mesh {value!r}: {part.strip()!r} is not AXIS=SIZE; expected "
                    "e.g. 'data=4,model=2'"
                )
            pairs.append((match.group(1), int(match.group(2))))
    else:
        raise SpecError(f"malformed mesh {value!r}; expected a string like 'data=4,model=2'")
    names = [n for n, _ in pairs]
    if not pairs or len(set(names)) != len(names):
        raise SpecError(f"malformed mesh {value!r}: axis names must be present and distinct")
    for axis, size in pairs:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise SpecError(f"malformed mesh {value!r}: axis {axis!r} needs a size >= 1")
    return tuple((str(n), int(s)) for n, s in pairs)


# ---------------------------------------------------------------- expansion


def _substitute(value: Any, bucket: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        whole = _PLACEHOLDER.fullmatch(value)
        if whole is not None and whole.group(1) in bucket:
            return bucket[whole.group(1)]
        return _PLACEHOLDER.sub(lambda m: str(bucket.get(m.group(1), m.group(0))), value)
    if isinstance(value, list):
        return [_substitute(v, bucket) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, bucket) for k, v in value.items()}
    return value


def _expand_function(
    entry: FunctionEntry, base_dir: str | None, path: str
) -> Iterator[WarmupItem]:
    keys = [k for k, _ in entry.vary]
    source = f"{path}:{entry.line}" if entry.line is not None else path
    for values in itertools.product(*(v for _, v in entry.vary)):
        bucket = dict(zip(keys, values))
        yield WarmupItem(
            name=str(_substitute(entry.name, bucket)),
            function=entry.function,
            args=tuple(str(_substitute(a, bucket)) for a in entry.args),
            args_from=entry.args_from,
            kwargs=tuple((k, str(_substitute(v, bucket))) for k, v in entry.kwargs),
            static=tuple((k, _substitute(v, bucket)) for k, v in entry.static),
            pmap=entry.pmap,
            mesh=entry.mesh,
            in_shardings=entry.in_shardings,
            out_shardings=entry.out_shardings,
            donate=entry.donate,
            x64=entry.x64,
            bucket=tuple(bucket.items()),
            base_dir=base_dir,
            source=source,
        )


def expand(manifest: WarmupManifest) -> list[WarmupItem]:
    """Every (function x ``vary`` bucket x device target) of a manifest.

    A function's own ``target`` replaces the top-level one for it (``"host"``: this
    host's devices, ``device_target`` None). Items come target by target, in the order
    the targets are first named, each in file order: the file's order when every
    function has the top level's targets."""
    by_target: dict[str | None, list[WarmupItem]] = {}
    for entry in manifest.functions:
        targets = entry.targets if entry.targets is not None else (manifest.targets or (HOST,))
        items = list(_expand_function(entry, manifest.base_dir, manifest.path))
        for target in targets:
            device_target = None if target == HOST else target
            by_target.setdefault(device_target, []).extend(
                dataclasses.replace(item, device_target=device_target) if device_target else item
                for item in items
            )
    return [item for items in by_target.values() for item in items]


def items_named(items: Iterable[WarmupItem], name: str, path: str = "<manifest>") -> list[WarmupItem]:
    """The items of ``name`` (every bucket and target), or of the one label ``name``
    (``mlp.forward[batch=8]``, ``train.step@tpu:v5e:2x2``), in manifest order. Raises
    :class:`aot.ManifestError` naming the close names when none matches."""
    import difflib

    items = list(items)
    named = [item for item in items if name in (item.name, item.label)]
    if named:
        return named
    names = list(dict.fromkeys(n for item in items for n in (item.name, item.label)))
    close = difflib.get_close_matches(name, names, n=3)
    hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    shown = list(dict.fromkeys(item.name for item in items))
    raise ManifestError(f"{path}: no entry named {name!r}{hint}; its names: {', '.join(shown)}")
