"""Warmup manifests: what CI compiles into a cache, and running it (in parallel).

A manifest is TOML with one ``[[function]]`` table per function::

    [[function]]
    name   = "mlp.forward"                      # the name aot.load() serves it under
    target = "fixtures.models:mlp_forward"      # module:attribute of the function
    args   = ["@fixtures.models:mlp_param_specs", "f32[{batch},784]"]
    vary   = { batch = [1, 8, 32] }             # one entry per value (cartesian product)

Optional keys: ``args_from = "module:callable"`` (its result comes before ``args``: a
tuple is several positional arguments, anything else one), ``kwargs`` (a table of
spec strings), ``static`` (a table of JSON-able
values passed as static keyword arguments), ``pmap = "AXIS"`` (lower with
:func:`aot.lower_pmap`), ``mesh = "data=4,model=2"`` with ``in_shardings`` (one
partition-spec string per positional argument, ``"auto"`` for unspecified) and
``out_shardings`` (a string or a list), ``donate`` (argument indices).

A spec string is ``DTYPE[DIMS][@SHARDING]`` (see :mod:`aot.specs`); ``"@module:callable"``
stands for the pytree of specs that the callable returns (for example
``jax.eval_shape(init, ...)``). ``"{key}"`` placeholders in args, kwargs, static values
and the name are replaced by each value of ``vary[key]``; the name usually stays the
same, because buckets are signatures of one name.

:func:`load_manifest` parses and validates a file (raising :class:`aot.ManifestError`
with the file, the TOML line and the entry), :func:`expand` turns it into
:class:`WarmupItem` s, :func:`run_warmup` compiles them into a cache (``jobs > 1``:
worker processes started with "spawn", never fork, since JAX is imported), and
:func:`coverage` lists the items a cache is missing for this environment.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import logging
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aot.errors import AotError, ManifestError, SpecError, TargetError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

if TYPE_CHECKING:
    from aot.cache.cache import Cache, CompileResult

log = logging.getLogger(__name__)

__all__ = [
    "FunctionEntry",
    "ItemResult",
    "TargetError",
    "WarmupItem",
    "WarmupManifest",
    "WarmupReport",
    "compile_item",
    "coverage",
    "expand",
    "item_signature",
    "load_manifest",
    "parse_manifest",
    "parse_mesh",
    "prepare",
    "resolve_args",
    "resolve_target",
    "run_warmup",
]


# Keyword arguments of aot.lower(): a function's own kwargs cannot use these names.
RESERVED_KWARGS = frozenset({
    "fn", "name", "pmap", "static_argnums", "static_argnames", "donate_argnums", "mesh",
    "in_shardings", "out_shardings", "compiler_options",
})

_FUNCTION_KEYS = (
    "name", "target", "args", "args_from", "kwargs", "static", "vary", "pmap", "mesh",
    "in_shardings", "out_shardings", "donate",
)
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_TOML_LINE = re.compile(r"\(at line (\d+), column (\d+)\)")
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
    target: str
    args: tuple[str, ...] = ()
    kwargs: tuple[tuple[str, str], ...] = ()
    args_from: str | None = None
    static: tuple[tuple[str, Any], ...] = ()
    pmap: str | None = None
    mesh: tuple[tuple[str, int], ...] | None = None
    in_shardings: tuple[str, ...] | None = None
    out_shardings: str | tuple[str, ...] | None = None
    donate: tuple[int, ...] = ()
    bucket: tuple[tuple[str, Any], ...] = ()
    base_dir: str | None = None
    source: str | None = None  # "file.toml:LINE" of the [[function]] it came from

    def __post_init__(self) -> None:
        problem = _item_problem(self)
        if problem is not None:
            error = ManifestError(f"{self.label}: {problem}")
            error.problem = problem  # type: ignore[attr-defined]
            raise error

    @property
    def label(self) -> str:
        """``name[batch=8]``: the name and the bucket this item compiles."""
        if not self.bucket:
            return self.name
        return f"{self.name}[{','.join(f'{k}={v}' for k, v in self.bucket)}]"

    def describe_args(self) -> str:
        parts = ([f"*@{self.args_from}"] if self.args_from else []) + list(self.args) + [f"{k}={v}" for k, v in self.kwargs]
        parts += [f"{k}={json.dumps(v)}" for k, v in self.static]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "target": self.target,
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
            "source": self.source,
        }


def _item_problem(item: WarmupItem) -> str | None:
    if not item.name:
        return "the name is empty"
    if not _TARGET.match(item.target):
        return f"target {item.target!r} is not MODULE:ATTRIBUTE (e.g. 'fixtures.models:tiny')"
    if item.args_from is not None and not _TARGET.match(item.args_from.lstrip("@")):
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
    target: str
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

    @property
    def base_dir(self) -> str:
        return str(Path(self.path).resolve().parent)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "functions": [
                {"name": f.name, "target": f.target, "line": f.line, "buckets": f.buckets}
                for f in self.functions
            ],
        }


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
    unknown = sorted(set(data) - {"function"})
    if unknown:
        raise ManifestError(
            f"{path}: unknown top-level key(s) {unknown}; a manifest holds [[function]] tables"
        )
    tables = data.get("function")
    if tables is None:
        raise ManifestError(f"{path}: no [[function]] tables; nothing to compile")
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ManifestError(f"{path}: 'function' must be an array of tables ([[function]])")
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if _FUNCTION_HEADER.match(line)]
    if len(lines) != len(tables):
        lines = []  # inline tables: no line numbers to give
    functions = []
    for index, table in enumerate(tables):
        line = lines[index] if lines else None
        functions.append(_parse_function(table, index, line, path))
    return WarmupManifest(path, tuple(functions))


def _parse_function(table: dict[str, Any], index: int, line: int | None, path: str) -> FunctionEntry:
    label = table.get("name") if isinstance(table.get("name"), str) else None
    where = f"{path}:{line}" if line is not None else path
    entry_desc = f"[[function]] #{index + 1}" + (f" ({label!r})" if label else "")

    def fail(problem: str) -> ManifestError:
        return ManifestError(f"{where}: {entry_desc}: {problem}")

    unknown = sorted(set(table) - set(_FUNCTION_KEYS))
    if unknown:
        raise fail(f"unknown key(s) {unknown}; expected some of {list(_FUNCTION_KEYS)}")
    target = table.get("target")
    if not isinstance(target, str) or not _TARGET.match(target):
        raise fail(
            f"'target' must be 'MODULE:ATTRIBUTE' (e.g. 'fixtures.models:tiny'), got {target!r}"
        )
    name = table.get("name", target.replace(":", "."))
    if not isinstance(name, str) or not name:
        raise fail(f"'name' must be a non-empty string, got {name!r}")
    args = table.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise fail(f"'args' must be a list of spec strings, got {args!r}")
    args_from = table.get("args_from")
    if args_from is not None and (not isinstance(args_from, str) or not _TARGET.match(args_from.lstrip("@"))):
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
        index=index, line=line, name=name, target=target, args=tuple(args), args_from=args_from,
        kwargs=tuple(sorted(kwargs.items())), static=tuple(sorted(static.items())),
        vary=tuple(vary_items), pmap=pmap, mesh=mesh, in_shardings=in_shardings,
        out_shardings=out_shardings, donate=tuple(donate),
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
            target=entry.target,
            args=tuple(str(_substitute(a, bucket)) for a in entry.args),
            args_from=entry.args_from,
            kwargs=tuple((k, str(_substitute(v, bucket))) for k, v in entry.kwargs),
            static=tuple((k, _substitute(v, bucket)) for k, v in entry.static),
            pmap=entry.pmap,
            mesh=entry.mesh,
            in_shardings=entry.in_shardings,
            out_shardings=entry.out_shardings,
            donate=entry.donate,
            bucket=tuple(bucket.items()),
            base_dir=base_dir,
            source=source,
        )


def expand(manifest: WarmupManifest) -> list[WarmupItem]:
    """Every (function x ``vary`` bucket) of a manifest, in file order."""
    items: list[WarmupItem] = []
    for entry in manifest.functions:
        items.extend(_expand_function(entry, manifest.base_dir, manifest.path))
    return items


# ---------------------------------------------------------------- resolving


@contextlib.contextmanager
def search_path(*folders: str | None) -> Iterator[None]:
    """Puts ``folders`` (and the working directory) first on ``sys.path`` for a while."""
    added = []
    for folder in (*folders, os.getcwd()):
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)
            added.append(folder)
    try:
        yield
    finally:
        for folder in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)


def resolve_target(target: str, *, base_dir: str | None = None) -> Any:
    """``"package.module:attr.sub"`` -> the object; raises :class:`TargetError`."""
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise TargetError(
            f"target {target!r} is not MODULE:ATTRIBUTE (e.g. 'fixtures.models:mlp_forward')"
        )
    with search_path(base_dir):
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or module_name
            hint = (
                "run from the folder that contains it, or install it"
                if missing == module_name.split(".")[0] or missing == module_name
                else "it is imported by that module; install it"
            )
            raise TargetError(
                f"cannot import {module_name!r} for {target!r}: no module named {missing!r}; {hint}"
            ) from None
        except AotError:
            raise
        except Exception as exc:  # noqa: BLE001 - the module's own import failed
            raise TargetError(
                f"importing {module_name!r} for {target!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(
                f"{target!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from None
    return obj


def _resolve_spec(value: str, base_dir: str | None, mesh: Any) -> Any:
    from aot.specs import spec

    if value.startswith("@"):
        target = value[1:]
        fn = resolve_target(target, base_dir=base_dir)
        if not callable(fn):
            raise TargetError(f"{value!r} is not callable; '@' names a function returning specs")
        try:
            tree = fn()
        except AotError:
            raise
        except Exception as exc:  # noqa: BLE001 - user code
            raise TargetError(f"calling {target!r} failed: {type(exc).__name__}: {exc}") from exc
        return spec(tree, mesh=mesh)
    return spec(value, mesh=mesh)


def resolve_args(
    args: Sequence[str] = (),
    kwargs: Iterable[tuple[str, str]] = (),
    args_from: str | None = None,
    *,
    base_dir: str | None = None,
    mesh: Any = None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Spec strings / ``@callable`` s -> ``(args, kwargs)`` of ``jax.ShapeDtypeStruct`` trees.

    ``args_from`` names a callable whose result comes first: a tuple is several
    positional arguments, anything else is one.
    """
    positional: list[Any] = []
    if args_from is not None:
        tree = _resolve_spec("@" + args_from.lstrip("@"), base_dir, mesh)
        positional.extend(tree if isinstance(tree, tuple) else (tree,))
    positional.extend(_resolve_spec(a, base_dir, mesh) for a in args)
    return tuple(positional), {k: _resolve_spec(v, base_dir, mesh) for k, v in kwargs}


def make_mesh(axes: Sequence[tuple[str, int]]) -> Any:
    """A ``jax.sharding.Mesh`` over the first ``prod(sizes)`` devices."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    sizes = [s for _, s in axes]
    count = int(np.prod(sizes))
    devices = jax.devices()
    if count > len(devices):
        raise SpecError(
            f"mesh {','.join(f'{n}={s}' for n, s in axes)} needs {count} devices; "
            f"this host has {len(devices)} ({devices[0].platform})"
        )
    grid = np.asarray(devices[:count], dtype=object).reshape(sizes)
    return Mesh(grid, tuple(n for n, _ in axes))


def _sharding_value(text: str) -> Any:
    from aot.specs import parse_partition_spec

    return None if text.strip().lower() == AUTO_SHARDING else parse_partition_spec(text)


@dataclass(frozen=True)
class Prepared:
    """An item resolved into what :meth:`aot.Cache.compile_entry` takes."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    options: dict[str, Any] = field(default_factory=dict)


def prepare(item: WarmupItem) -> Prepared:
    """Imports the target, resolves ``@callable`` specs, builds the mesh and shardings."""
    fn = resolve_target(item.target, base_dir=item.base_dir)
    if not callable(fn):
        raise TargetError(f"target {item.target!r} is a {type(fn).__name__}, not a function")
    mesh = make_mesh(item.mesh) if item.mesh is not None else None
    args, kwargs = resolve_args(item.args, item.kwargs, item.args_from, base_dir=item.base_dir, mesh=mesh)
    options: dict[str, Any] = {"name": item.name}
    if item.donate:
        options["donate_argnums"] = item.donate
    if item.pmap is not None:
        options["pmap"] = True
        options["axis_name"] = item.pmap
        return Prepared(fn, args, options)
    options.update(kwargs)
    if item.static:
        options.update(dict(item.static))
        options["static_argnames"] = tuple(k for k, _ in item.static)
    if mesh is not None:
        options["mesh"] = mesh
    if item.in_shardings is not None:
        options["in_shardings"] = tuple(_sharding_value(s) for s in item.in_shardings)
    if item.out_shardings is not None:
        out = item.out_shardings
        options["out_shardings"] = (
            tuple(_sharding_value(s) for s in out) if isinstance(out, tuple) else _sharding_value(out)
        )
    return Prepared(fn, args, options)


def compile_item(cache: Cache, item: WarmupItem) -> CompileResult:
    """Lowers ``item``; loads it on a hit, compiles and stores it on a miss."""
    prepared = prepare(item)
    return cache.compile_entry(prepared.fn, *prepared.args, **prepared.options)


def item_signature(item: WarmupItem) -> str:
    """The input signature ``item`` compiles to (``"f32[8,784], ..."``), without lowering."""
    import jax

    from aot.specs import format_aval

    mesh = make_mesh(item.mesh) if item.mesh is not None else None
    args, kwargs = resolve_args(item.args, item.kwargs, item.args_from, base_dir=item.base_dir, mesh=mesh)
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    return ", ".join(format_aval(leaf.shape, leaf.dtype) for leaf in leaves)


# ---------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class ItemResult:
    """What happened to one item: ``compiled``, ``hit`` or ``failed`` (with the error)."""

    index: int
    name: str
    label: str
    status: str
    seconds: float
    key: str | None = None
    signature: str | None = None
    compile_seconds: float | None = None
    raw_size: int | None = None
    stored_size: int | None = None
    error: str | None = None
    source: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def describe(self) -> str:
        if self.status == "failed":
            return f"{self.label}: {self.error}"
        return f"{self.label} ({self.signature}) {self.seconds:.2f}s"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "status": self.status,
            "key": self.key,
            "signature": self.signature,
            "seconds": round(self.seconds, 4),
            "compile_seconds": self.compile_seconds,
            "raw_size": self.raw_size,
            "stored_size": self.stored_size,
            "error": self.error,
            "source": self.source,
        }


@dataclass(frozen=True, slots=True)
class WarmupReport:
    location: str
    jobs: int
    results: tuple[ItemResult, ...]
    seconds: float

    def _count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def compiled(self) -> int:
        return self._count("compiled")

    @property
    def hit(self) -> int:
        return self._count("hit")

    @property
    def failed(self) -> int:
        return self._count("failed")

    @property
    def ok(self) -> bool:
        return self.failed == 0

    @property
    def failures(self) -> tuple[ItemResult, ...]:
        return tuple(r for r in self.results if r.status == "failed")

    def summary(self) -> str:
        return (
            f"{len(self.results)} entries: {self.compiled} compiled, {self.hit} hit, "
            f"{self.failed} failed in {self.seconds:.1f}s"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "cache": self.location,
            "jobs": self.jobs,
            "total": len(self.results),
            "compiled": self.compiled,
            "hit": self.hit,
            "failed": self.failed,
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "results": [r.to_dict() for r in self.results],
        }


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, AotError):
        return str(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _run_one(cache: Cache, index: int, item: WarmupItem) -> ItemResult:
    start = time.perf_counter()
    try:
        result = compile_item(cache, item)
    except Exception as exc:  # noqa: BLE001 - every item is tried; failures are recorded
        log.debug("warmup: %s failed", item.label, exc_info=True)
        return ItemResult(
            index, item.name, item.label, "failed", time.perf_counter() - start,
            error=_error_text(exc), source=item.source,
        )
    entry = result.entry
    return ItemResult(
        index, item.name, item.label, "hit" if result.hit else "compiled",
        time.perf_counter() - start, key=entry.key, signature=entry.signature,
        compile_seconds=entry.compile_seconds, raw_size=entry.raw_size,
        stored_size=entry.stored_size, source=item.source,
    )


# ---------------------------------------------------------------- worker processes

_WORKER: dict[str, Any] = {}


def _cache_options(cache: Cache) -> dict[str, Any]:
    """How a worker process opens the same cache (signing key included)."""
    from aot.cache.blobs import FolderBlobStore

    root = getattr(cache.blobs, "root", None)
    return {
        "location": cache.location,
        "signing_key": cache.signing_key,
        "require_signatures": cache.require_signatures,
        "blob_location": str(root) if isinstance(cache.blobs, FolderBlobStore) and root else None,
    }


def _worker_init(env: dict[str, str], x64: bool, log_level: int, cache_options: dict[str, Any]) -> None:
    os.environ.update(env)
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    import jax

    jax.config.update("jax_enable_x64", x64)
    _WORKER["options"] = cache_options


def _worker_run(index: int, item: WarmupItem) -> ItemResult:
    from aot.cache.cache import Cache

    cache = _WORKER.get("cache")
    if cache is None:
        options = dict(_WORKER["options"])
        try:
            cache = _WORKER["cache"] = Cache(options.pop("location"), **options)
        except Exception as exc:  # noqa: BLE001
            return ItemResult(index, item.name, item.label, "failed", 0.0,
                              error=_error_text(exc), source=item.source)
    return _run_one(cache, index, item)


_INHERITED_ENV = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_ENABLE_X64", "TF_CPP_MIN_LOG_LEVEL")


def _probe(cache: Cache, index: int, item: WarmupItem) -> ItemResult | None:
    """Lowers ``item`` here and loads it if the cache has it: a hit (or a failure to
    prepare or lower it) needs no worker process. ``None``: it must be compiled."""
    from aot.lowering import lower, lower_pmap

    start = time.perf_counter()
    try:
        prepared = prepare(item)
        options = dict(prepared.options)
        pmap = options.pop("pmap", False)
        computation = (lower_pmap if pmap else lower)(prepared.fn, *prepared.args, **options)
        entry = cache.index.get(computation.fingerprint)
    except Exception as exc:  # noqa: BLE001 - recorded like a worker's failure
        log.debug("warmup: %s failed", item.label, exc_info=True)
        return ItemResult(index, item.name, item.label, "failed", time.perf_counter() - start,
                          error=_error_text(exc), source=item.source)
    if entry is None or not entry.ok:
        return None
    try:
        cache.load(entry)
    except AotError:
        return None  # the worker's compile_entry quarantines it and compiles again
    return ItemResult(
        index, item.name, item.label, "hit", time.perf_counter() - start, key=entry.key,
        signature=entry.signature, compile_seconds=entry.compile_seconds,
        raw_size=entry.raw_size, stored_size=entry.stored_size, source=item.source,
    )


def _maybe_stored(cache: Cache, item: WarmupItem, stored: dict[str, set[str]]) -> bool:
    """False when no intact entry of this name and signature exists for this environment."""
    if item.name not in stored:
        stored[item.name] = {
            e.signature
            for e in cache.index.by_name(item.name, env_fp=cache.environment.digest, state="ok")
        }
    if not stored[item.name]:
        return False
    try:
        return item_signature(item) in stored[item.name]
    except Exception:  # noqa: BLE001 - the probe reports the error with the item
        return True


def _collect(
    futures: dict[Any, tuple[int, WarmupItem]], emit: Callable[[ItemResult], None],
    broken: list[tuple[int, WarmupItem]], *, block: bool,
) -> None:
    """Emits the results of finished futures; with ``block``, waits for all of them."""
    if not block:
        for future in [f for f in futures if f.done()]:
            _emit_future(future, futures.pop(future), emit, broken)
        return
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            _emit_future(future, futures.pop(future), emit, broken)


def _emit_future(
    future: Any, pair: tuple[int, WarmupItem], emit: Callable[[ItemResult], None],
    broken: list[tuple[int, WarmupItem]],
) -> None:
    index, item = pair
    try:
        result = future.result()
    except BrokenProcessPool:
        broken.append(pair)
        return
    except Exception as exc:  # noqa: BLE001 - e.g. a result that did not pickle
        result = ItemResult(index, item.name, item.label, "failed", 0.0,
                            error=_error_text(exc), source=item.source)
    emit(result)


def _run_parallel(
    cache: Cache, items: list[WarmupItem], jobs: int, emit: Callable[[ItemResult], None]
) -> None:
    """Finds the hits here; sends the misses to ``jobs`` spawned workers.

    The pool starts a worker only when one is needed, so a fully cached run starts
    none. A worker that dies (crash, out of memory) breaks the pool: the unfinished
    items are retried in a fresh single-worker pool, in order, so the item that
    kills it is identified and every other item is still tried.
    """
    import jax

    env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
    initargs = (
        env, bool(jax.config.jax_enable_x64), logging.getLogger("aot").getEffectiveLevel(),
        _cache_options(cache),
    )
    context = multiprocessing.get_context("spawn")

    def pool(workers: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_worker_init, initargs=initargs
        )

    broken: list[tuple[int, WarmupItem]] = []
    futures: dict[Any, tuple[int, WarmupItem]] = {}
    stored: dict[str, set[str]] = {}
    with pool(jobs) as executor:
        # An item with no entry of its name and input signature for this environment
        # is certainly a miss: it goes straight to a worker and is lowered only there.
        # The others are probably hits: they are lowered and looked up here (exactly,
        # by key) while the workers start.
        probable_hits = []
        for index, item in enumerate(items):
            if _maybe_stored(cache, item, stored):
                probable_hits.append((index, item))
            else:
                futures[executor.submit(_worker_run, index, item)] = (index, item)
        for index, item in probable_hits:
            result = _probe(cache, index, item)
            if result is not None:
                emit(result)
            else:
                futures[executor.submit(_worker_run, index, item)] = (index, item)
            _collect(futures, emit, broken, block=False)
        _collect(futures, emit, broken, block=True)
    while broken:
        broken.sort(key=lambda pair: pair[0])
        log.warning("warmup: a worker process died; retrying %d entries one at a time", len(broken))
        pending, broken = broken, []
        with pool(1) as executor:
            futures = {
                executor.submit(_worker_run, i, item): (i, item) for i, item in pending
            }
            _collect(futures, emit, broken, block=True)
        if broken:
            # One worker runs items in order: the first unfinished one killed it.
            broken.sort(key=lambda pair: pair[0])
            index, item = broken.pop(0)
            emit(ItemResult(
                index, item.name, item.label, "failed", 0.0, source=item.source,
                error="the worker process died while compiling it (crash or out of memory)",
            ))


def run_warmup(
    location: str | os.PathLike[str] | Cache | None,
    items: Iterable[WarmupItem],
    jobs: int = 1,
    on_result: Callable[[ItemResult], None] | None = None,
) -> WarmupReport:
    """Compiles every item into the cache at ``location`` (hits cost no compile).

    ``jobs > 1`` compiles in that many worker processes (started with "spawn"; they
    inherit ``XLA_FLAGS`` and the x64 mode). Every item is tried; a failure is recorded
    in the report with the item and the error. ``on_result`` is called with each
    :class:`ItemResult` as it completes (in completion order); the report lists them
    in item order.
    """
    from aot.cache.cache import Cache

    items = list(items)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    start = time.perf_counter()
    cache = location if isinstance(location, Cache) else Cache(location)  # fail early
    if cache.read_only:
        from aot.errors import ReadOnlyCacheError

        raise ReadOnlyCacheError(
            f"cannot warm up the cache at {cache.display_location}: it is opened read-only; "
            "warm up a writable cache (in CI) and ship it or a bundle"
        )
    results: dict[int, ItemResult] = {}

    def emit(result: ItemResult) -> None:
        results[result.index] = result
        log.info("warmup: %s %s", result.status, result.describe())
        if on_result is not None:
            on_result(result)

    try:
        if jobs == 1 or len(items) <= 1:
            for index, item in enumerate(items):
                emit(_run_one(cache, index, item))
        else:
            _run_parallel(cache, items, jobs, emit)
    finally:
        if not isinstance(location, Cache):
            cache.close()
    ordered = tuple(results[i] for i in sorted(results))
    return WarmupReport(cache.display_location, jobs, ordered, time.perf_counter() - start)


# ---------------------------------------------------------------- coverage


def coverage(cache: Cache, items: Iterable[WarmupItem]) -> list[WarmupItem]:
    """The items with no intact entry (same name and signature) for this environment."""
    env = cache.environment.digest
    stored: dict[str, set[str]] = {}
    missing: list[WarmupItem] = []
    for item in items:
        if item.name not in stored:
            stored[item.name] = {
                e.signature for e in cache.index.by_name(item.name, env_fp=env, state="ok")
            }
        try:
            signature = item_signature(item)
        except AotError as exc:
            raise ManifestError(f"{item.source or item.name}: {item.label}: {exc}") from None
        if signature not in stored[item.name]:
            missing.append(item)
    return missing
