"""Warm-up records: skip lowering an entry whose inputs provably did not change.

A fully cached ``aot warmup`` used to trace and lower every entry only to find its key
in the cache: on the 12-layer transformer that is most of the run, and JAX's own
persistent cache does the same. A *record* remembers, per entry, which artifact key
its last lowering produced and everything that lowering depended on. When all of it
is unchanged, the entry is looked up by that key and loaded (which checks the stored
executable) without lowering.

A record is found by its **id**, the sha256 over:

- the entry as the manifest gives it (name, target, args, kwargs, static values, pmap,
  mesh, shardings, donation, x64, the manifest's folder) and ``sys.path``;
- the resolved specs: each argument's pytree structure, shapes, dtypes, weak types
  and shardings, and the mesh (the ``@module:callable`` specs are called, as the
  lowering would);
- every JAX configuration value (``jax.config.values``, in the entry's x64 mode);
- this process's environment fingerprint (jaxlib, platform, devices and topology, CPU
  ISA, XLA flags, x64): the one the artifact key contains;
- the Python, jax, jaxlib and artifact-format versions, and this module's
  ``RECORD_FORMAT``.

The record itself holds the key, and the code the lowering ran:

- every *project* module loaded when the entry was done (a module whose file is not
  in a ``site-packages`` / ``dist-packages`` folder or the standard library): its
  name, its file and the sha256 of the file's content. Taken after lowering, so a
  module that the function imports while it is traced is in it;
- the installed distributions (names and versions of every ``*.dist-info`` /
  ``*.egg-info`` on ``sys.path``): a package is identified by its version.

The record holds only when every listed module still resolves to the same file with
the same content and the installed distributions are the same. Then the key is looked
up; it must name an intact entry (``ok``) whose executable loads. Anything else --
no record, an unreadable or malformed record, a value that cannot be described
exactly (an object whose ``repr`` shows a memory address), a module missing or
changed, a key not stored, an executable that does not load -- lowers the entry
as before, which also rewrites the record. A record never makes a different program
count as cached: it can only make an unchanged one skip its lowering.

What a record cannot see, and the assumption it rests on: tracing is assumed to be a
function of the code, the specs, the installed packages and JAX's configuration --
the assumption ``jax.jit``'s own in-process cache makes (it does not even look at the
code). A function whose trace depends on environment variables other than JAX's and
XLA's, on files it reads, on the clock or on randomness outside JAX is outside it: warm such
entries with ``aot warmup --relower`` (``run_warmup(..., records=False)``), which
lowers everything.

Records live in the cache folder (``warmup-records/ab/<id>.json``, written to a temporary
file and renamed): a database cache keeps none, and its warm-ups lower every entry. They are hints,
never trusted for anything but skipping the lowering: deleting the folder only costs
the next warm-up its lowerings.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.warmup.targets import Prepared
    from aot.cache.warmup.manifest import WarmupItem

log = logging.getLogger(__name__)

__all__ = ["RECORD_FORMAT", "RECORDS_FOLDER", "Record", "RecordStore", "record_id"]

#: Bumped when what a record covers changes (old records then never match).
RECORD_FORMAT = 1
RECORDS_FOLDER = "warmup-records"

_INSTALLED_PARTS = frozenset({"site-packages", "dist-packages"})


class _Doubt(Exception):
    """Something cannot be described exactly: no record (the entry is lowered)."""


# ---------------------------------------------------------------- the id


def record_id(item: WarmupItem, prepared: Prepared, environment_digest: str) -> str | None:
    """The id of ``item``'s record, or None when an input cannot be described exactly.

    Call it in the item's x64 mode (:func:`aot.cache.warmup.targets.x64_mode`), as the
    lowering runs."""
    import jax
    import jaxlib

    from aot.artifact import FORMAT_VERSION

    try:
        _named_modules_have_files(item)
        parts = {
            "format": RECORD_FORMAT,
            "item": {
                "name": item.name, "target": item.target, "args": list(item.args),
                "args_from": item.args_from, "kwargs": [list(kv) for kv in item.kwargs],
                "static": _plain([list(kv) for kv in item.static]), "pmap": item.pmap,
                "mesh": [list(m) for m in item.mesh] if item.mesh is not None else None,
                "in_shardings": list(item.in_shardings) if item.in_shardings is not None else None,
                "out_shardings": _plain(item.out_shardings), "donate": list(item.donate),
                "x64": item.x64, "base_dir": item.base_dir,
            },
            "sys_path": list(sys.path),
            "specs": _describe(prepared.args),
            "options": {k: _describe(v) for k, v in sorted(prepared.options.items())},
            "jax_config": {k: _value(v) for k, v in sorted(jax.config.values.items())},
            "environment": environment_digest,
            "versions": [sys.version, jax.__version__, jaxlib.__version__, FORMAT_VERSION],
        }
    except _Doubt as doubt:
        log.debug("warmup record: %s: %s; lowering it", item.label, doubt)
        return None
    return sha256_hex(canonical_json(parts))


def _named_modules_have_files(item: WarmupItem) -> None:
    """The modules the entry names (its target, ``args_from``, ``@`` specs) are hashed
    by their files: one without a file (defined in ``__main__`` of ``python -c``, built
    at run time) could change unseen."""
    named = [item.target, *(a[1:] for a in (*item.args, *(v for _, v in item.kwargs)) if a.startswith("@"))]
    if item.args_from:
        named.append(item.args_from.lstrip("@"))
    for target in named:
        module = sys.modules.get(target.partition(":")[0])
        if module is None or _module_file(module) is None:
            raise _Doubt(f"module of {target!r} has no source file")


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def canonical_json(value: Any) -> str:
    """As :func:`aot.fingerprint.canonical_json` (not imported: it imports JAX)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _plain(value: Any) -> Any:
    """A JSON value as it is (manifest values are TOML: JSON-able but for dates)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise _Doubt(f"{value!r} is not plain data") from None
    return value


def _value(value: Any) -> str:
    text = repr(value)
    if " at 0x" in text:
        raise _Doubt(f"{text} has no stable description")
    return f"{type(value).__qualname__}:{text}"


def _describe(tree: Any) -> Any:
    """An exact, stable description of a pytree of specs, meshes, shardings, values."""
    import jax
    from jax.sharding import Mesh, PartitionSpec, Sharding

    def leaf(x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct):
            sharding = x.sharding
            if not all(isinstance(d, int) for d in x.shape):
                raise _Doubt(f"symbolic shape {x.shape}")  # constraints live in its scope
            return {
                "shape": list(x.shape), "dtype": str(x.dtype),
                "weak_type": bool(getattr(x, "weak_type", False)),
                "sharding": _sharding(sharding, len(x.shape)) if sharding is not None else None,
            }
        if isinstance(x, Mesh):
            return _mesh(x)
        if isinstance(x, Sharding):
            return _sharding(x, None)
        if isinstance(x, PartitionSpec):
            return f"PartitionSpec:{x!r}"
        return _value(x)  # anything else: only when its repr is stable

    leaves, treedef = jax.tree_util.tree_flatten(
        tree, is_leaf=lambda x: x is None or isinstance(x, (jax.ShapeDtypeStruct, Mesh, Sharding, PartitionSpec)),
    )
    return {"tree": _value(treedef), "leaves": [leaf(x) for x in leaves]}


def _mesh(mesh: Any) -> Any:
    return {
        "axes": list(mesh.axis_names), "shape": [int(s) for s in mesh.devices.shape],
        "devices": [int(d.id) for d in mesh.devices.flat],
        "types": _value(getattr(mesh, "axis_types", None)),
    }


def _sharding(sharding: Any, ndim: int | None) -> Any:
    from jax.sharding import NamedSharding, SingleDeviceSharding

    if isinstance(sharding, NamedSharding):
        return {"named": _mesh(sharding.mesh), "spec": repr(sharding.spec),
                "memory_kind": sharding.memory_kind}
    if isinstance(sharding, SingleDeviceSharding):
        (device,) = sharding.device_set
        return {"single": int(device.id), "memory_kind": sharding.memory_kind}
    if ndim is not None:
        from aot.shardings import sharding_to_json

        try:
            return sharding_to_json(sharding, ndim)
        except Exception as exc:  # noqa: BLE001 - cannot describe it: lower
            raise _Doubt(f"sharding {sharding!r}: {exc}") from None
    raise _Doubt(f"sharding {sharding!r} without a rank")


# ---------------------------------------------------------------- the code


@dataclass(frozen=True, slots=True)
class Record:
    """What one entry's last lowering produced and depended on."""

    key: str
    modules: tuple[tuple[str, str, str], ...]  # (module name, file, sha256 of its content)
    packages: str  # sha256 of the installed distributions

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT, "key": self.key, "packages": self.packages,
            "modules": [list(m) for m in self.modules],
        }

    @classmethod
    def from_dict(cls, data: Any) -> Record:
        if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
            raise ValueError("not a record of this format")
        key, packages, modules = data["key"], data["packages"], data["modules"]
        if not (isinstance(key, str) and len(key) == 64 and isinstance(packages, str)):
            raise ValueError("malformed key or packages")
        if not isinstance(modules, list) or not all(
            isinstance(m, list) and len(m) == 3 and all(isinstance(p, str) for p in m) for m in modules
        ):
            raise ValueError("malformed modules")
        return cls(key, tuple((m[0], m[1], m[2]) for m in modules), packages)


_INSTALLED: dict[str, bool] = {}  # file -> part of an installed package or the stdlib


def _installed(path: str) -> bool:
    known = _INSTALLED.get(path)
    if known is None:
        known = _INSTALLED[path] = (
            not _INSTALLED_PARTS.isdisjoint(Path(path).parts) or _in_stdlib(path)
        )
    return known


def _stdlib_roots() -> tuple[str, ...]:
    import sysconfig

    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    roots |= {os.path.join(p, "lib") for p in {sys.base_prefix, sys.base_exec_prefix}}
    both = {os.path.abspath(r) for r in roots} | {os.path.realpath(r) for r in roots}
    return tuple(sorted(r.rstrip(os.sep) + os.sep for r in both))


_STDLIB: tuple[str, ...] | None = None


def _in_stdlib(path: str) -> bool:
    global _STDLIB
    if _STDLIB is None:
        _STDLIB = _stdlib_roots()
    return path.startswith(_STDLIB) or os.path.realpath(path).startswith(_STDLIB)


def _module_file(module: Any) -> str | None:
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path:
        return None
    return os.path.abspath(path)


#: name -> (the module object, its file if it is a project module, else None). A warm-up
#: remembers after every item, and most of the many loaded modules are the same
#: objects as last time: only new or replaced ones are looked at again.
_SEEN: dict[str, tuple[Any, str | None]] = {}


def project_modules() -> dict[str, str]:
    """Loaded modules whose code is not an installed package's: name -> file.

    ``__mp_main__`` is left out: in a process started with "spawn" it is the parent's
    main module again, also listed as ``__main__`` (a record written by a warm-up
    worker must hold in the process that runs the next warm-up)."""
    found = {}
    for name, module in list(sys.modules.items()):
        if name == "__mp_main__":
            continue
        seen = _SEEN.get(name)
        if seen is not None and seen[0] is module:
            path = seen[1]
        else:
            path = _module_file(module)
            if path is not None and _installed(path):
                path = None
            _SEEN[name] = (module, path)
        if path is not None:
            found[name] = path
    return found


class _Digests:
    """sha256 of file contents, re-read only when a file's size or mtime changes."""

    def __init__(self) -> None:
        self._memo: dict[str, tuple[int, int, str]] = {}

    def of(self, path: str) -> str | None:
        try:
            stat = os.stat(path)
        except OSError:
            return None
        memo = self._memo.get(path)
        if memo is not None and memo[0] == stat.st_mtime_ns and memo[1] == stat.st_size:
            return memo[2]
        try:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            return None
        self._memo[path] = (stat.st_mtime_ns, stat.st_size, digest)
        return digest


def installed_packages() -> str:
    """sha256 over the names of the distributions installed on ``sys.path``."""
    names: set[str] = set()
    for entry in sys.path:
        if not entry or _INSTALLED_PARTS.isdisjoint(Path(entry).parts):
            continue
        try:
            listing = os.listdir(entry)
        except OSError:
            continue
        names.update(n for n in listing if n.endswith((".dist-info", ".egg-info")))
    return sha256_hex("\n".join(sorted(names)))


def _resolves_to(name: str, path: str) -> bool:
    """Whether module ``name`` is (or would be imported) from ``path``."""
    module = sys.modules.get(name)
    if module is not None:
        return _module_file(module) == path
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except Exception:  # noqa: BLE001 - any doubt: it does not
        return False
    origin = getattr(spec, "origin", None) if spec is not None else None
    return isinstance(origin, str) and os.path.abspath(origin) == path


# ---------------------------------------------------------------- the store


class RecordStore:
    """The records of one folder cache (``None`` folder: records are off)."""

    def __init__(self, folder: str | os.PathLike[str] | None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self._digests = _Digests()
        self._packages: tuple[tuple[str, ...], str] | None = None

    @classmethod
    def for_cache(cls, cache: ArtifactStore, *, enabled: bool = True) -> RecordStore:
        """The records of ``cache`` (off for a database cache, or when not ``enabled``)."""
        from aot.cache.storage.locations import FOLDER, classify_location

        where = classify_location(cache.location)
        if not enabled or where.kind != FOLDER:
            return cls(None)
        return cls(Path(where.target) / RECORDS_FOLDER)

    @property
    def enabled(self) -> bool:
        return self.folder is not None

    def _path(self, rid: str) -> Path:
        assert self.folder is not None
        return self.folder / rid[:2] / f"{rid}.json"

    def packages(self) -> str:
        path = tuple(sys.path)
        if self._packages is None or self._packages[0] != path:
            self._packages = (path, installed_packages())
        return self._packages[1]

    def lookup(self, rid: str | None) -> str | None:
        """The artifact key of a record that still holds, else None."""
        if self.folder is None or rid is None:
            return None
        try:
            record = Record.from_dict(json.loads(self._path(rid).read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.debug("warmup record %s unreadable (%s); lowering", rid[:12], exc)
            return None
        if record.packages != self.packages():
            log.debug("warmup record %s: installed packages changed", rid[:12])
            return None
        for module in record.modules:
            if not self._holds(module):
                log.debug("warmup record %s: module %s changed", rid[:12], module[0])
                return None
        return record.key

    def _holds(self, module: tuple[str, str, str]) -> bool:
        name, path, digest = module
        return _resolves_to(name, path) and self._digests.of(path) == digest

    def remember(self, rid: str | None, key: str) -> None:
        """Writes the record of an entry just lowered (and found or stored) as ``key``."""
        if self.folder is None or rid is None:
            return
        modules = []
        for name, path in sorted(project_modules().items()):
            digest = self._digests.of(path)
            if digest is None:
                return  # a module whose file cannot be read: no record
            modules.append((name, path, digest))
        record = Record(key, tuple(modules), self.packages())
        import tempfile

        target = self._path(rid)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=".record-", dir=target.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(canonical_json(record.to_dict()))
                os.replace(temp, target)
            except BaseException:
                with _suppress():
                    os.unlink(temp)
                raise
        except OSError as exc:  # a record is a hint: never fail the warm-up for it
            log.debug("cannot write warmup record %s: %s", target, exc)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, OSError)
