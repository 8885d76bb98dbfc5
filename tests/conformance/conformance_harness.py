"""The two processes of the conformance suite, and what they record.

``python conformance_harness.py compile CACHE RECORDS NAME...``
    imports the programs, compiles each into the cache (``Cache.compile_entry``,
    before anything runs the function), then runs it under ``jax.jit`` (or
    ``jax.pmap``) on the same inputs and records the reference outputs: per leaf its
    path, dtype, shape, weak type, sharding and a sha256 of its bytes. Programs that
    must be refused record the error ``aot.lower`` raised.

``python conformance_harness.py serve CACHE PLAN RECORDS NAME...``
    installs a ``sys.meta_path`` blocker that raises on any import of
    ``conformance_programs`` (the model code), then for each program ``aot.load``s it
    and calls it on the inputs its plan names (built by ``conformance_data``, the
    client side), recording the same description of the outputs and which donated
    inputs were deleted.

Both append one JSON line per program (``{"start": name}`` first, so that a process
that dies on a program is seen to have died on it) and flush after each.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import inspect
import json
import re
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

BLOCKED = "conformance_programs"


class _NoModelCode(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == BLOCKED or name.startswith(BLOCKED + "."):
            raise ImportError(f"the serving process must not import {name} (the model code)")
        return None


def block_model_code() -> None:
    sys.meta_path.insert(0, _NoModelCode())
    try:
        importlib.import_module(BLOCKED)
    except ImportError:
        return
    raise SystemExit("the import blocker does not work")


# ---------------------------------------------------------------- describing outputs


def _hex_preview(raw: Any) -> str:
    flat = raw.reshape(-1)[:4]
    try:
        return repr(flat.tolist())[:120]
    except Exception:  # noqa: BLE001 - exotic dtypes
        return flat.tobytes().hex()[:64]


def describe_sharding(leaf: Any) -> dict[str, Any] | None:
    import jax

    sharding = getattr(leaf, "sharding", None)
    if sharding is None:
        return None
    indices = sorted(
        (int(d.id), str(index)) for d, index in sharding.devices_indices_map(tuple(leaf.shape)).items()
    )
    spec = None
    if isinstance(sharding, jax.sharding.NamedSharding):
        entries = list(sharding.spec)
        while entries and entries[-1] is None:  # P('data') is P('data', None)
            entries.pop()
        spec = repr(tuple(entries))
    return {
        "type": type(sharding).__name__,
        "spec": spec,
        "indices": indices,
        "memory_kind": getattr(sharding, "memory_kind", None),
    }


def describe_outputs(out: Any) -> dict[str, Any]:
    import jax
    import numpy as np

    out = jax.block_until_ready(out)
    flat, treedef = jax.tree_util.tree_flatten_with_path(out)
    leaves = []
    for path, leaf in flat:
        record: dict[str, Any] = {"path": jax.tree_util.keystr(path), "python_type": type(leaf).__name__}
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            raw = np.asarray(jax.random.key_data(leaf))
        else:
            raw = np.asarray(leaf)
        record["dtype"] = str(dtype) if dtype is not None else f"python:{raw.dtype}"
        record["shape"] = list(np.shape(leaf))
        record["weak_type"] = bool(getattr(leaf, "weak_type", False))
        record["sharding"] = describe_sharding(leaf) if isinstance(leaf, jax.Array) else None
        record["sha256"] = hashlib.sha256(raw.tobytes()).hexdigest()
        record["preview"] = _hex_preview(raw)
        leaves.append(record)
    return {"treedef": re.sub(r" at 0x[0-9a-f]+", "", str(treedef)), "leaves": leaves}


def deleted_flags(args: tuple[Any, ...], donated: list[int]) -> dict[str, bool]:
    import jax

    flags = {}
    for i in donated:
        if i < len(args):
            leaves = [x for x in jax.tree_util.tree_leaves(args[i]) if isinstance(x, jax.Array)]
            flags[str(i)] = bool(leaves) and all(x.is_deleted() for x in leaves)
    return flags


def on_device(args: tuple[Any, ...], donated: list[int]) -> tuple[Any, ...]:
    """Donated arguments as device arrays (a host array cannot be donated)."""
    import jax

    return tuple(jax.device_put(a) if i in donated else a for i, a in enumerate(args))


def describe_error(exc: BaseException) -> dict[str, str]:
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:4000],
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:],
    }


class Caches:
    """One ``aot.Cache`` per x64 mode: a cache computes this environment's fingerprint
    (which has the x64 mode) once, as a serving process that sets x64 at start-up."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._caches: dict[bool, Any] = {}

    def current(self) -> Any:
        import aot
        import jax

        mode = bool(jax.config.jax_enable_x64)
        if mode not in self._caches:
            self._caches[mode] = aot.Cache(self.location)
        return self._caches[mode]


@contextlib.contextmanager
def x64(enabled: bool) -> Iterator[None]:
    import jax

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", bool(enabled))
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)


# ---------------------------------------------------------------- compiling


def _static_layout(program: Any, call_args: tuple[Any, ...]) -> tuple[list[int], list[str]]:
    """Positions and keywords of the static arguments, as a serving call drops them."""
    positions = set(program.static_argnums)
    names = set(program.static_argnames)
    try:
        params = list(inspect.signature(program.fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    for i, param in enumerate(params[: len(call_args)]):
        if param.name in names:
            positions.add(i)
    return sorted(positions), sorted(names)


def _reference(program: Any, builder: str) -> dict[str, Any]:
    import jax

    import conformance_data as data

    args, kwargs = data.INPUTS[builder]()
    donated = list(program.donate_argnums)
    args = on_device(args, donated)
    mesh = data.mesh_4x2() if program.mesh else None
    if program.pmap_axis is not None:
        fn = jax.pmap(program.fn, axis_name=program.pmap_axis, donate_argnums=program.donate_argnums)
    else:
        shardings = {}
        if mesh is not None and program.in_shardings is not None:
            shardings["in_shardings"] = jax.tree_util.tree_map(
                lambda s: jax.sharding.NamedSharding(mesh, s), program.in_shardings,
                is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec),
            )
        if mesh is not None and program.out_shardings is not None:
            shardings["out_shardings"] = jax.tree_util.tree_map(
                lambda s: jax.sharding.NamedSharding(mesh, s), program.out_shardings,
                is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec),
            )
        fn = jax.jit(
            program.fn, static_argnums=program.static_argnums,
            static_argnames=program.static_argnames, donate_argnums=program.donate_argnums,
            **shardings,
        )
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        out = fn(*args, **kwargs)
    record = describe_outputs(out)
    record["deleted"] = deleted_flags(args, donated)
    return record


def compile_one(cache: Any, program: Any) -> dict[str, Any]:
    import aot
    import jax

    import conformance_data as data

    args, kwargs = data.INPUTS[program.inputs]()
    spec_args, spec_kwargs = program.specs() if program.specs is not None else (args, kwargs)
    options: dict[str, Any] = {}
    for option in ("static_argnums", "static_argnames", "donate_argnums"):
        if getattr(program, option):
            options[option] = getattr(program, option)
    if program.refuse is not None:
        try:
            aot.lower(program.fn, *spec_args, name=program.name, **options, **spec_kwargs)
        except aot.AotError as exc:
            return {"refused": describe_error(exc)}
        return {"refused": None}
    if program.run_first:  # the user ran it with jax.jit before storing it
        jax.block_until_ready(
            jax.jit(program.fn, static_argnums=program.static_argnums,
                    static_argnames=program.static_argnames)(*args, **kwargs)
        )
        args, kwargs = data.INPUTS[program.inputs]()
        spec_args, spec_kwargs = args, kwargs
    if program.pmap_axis is not None:
        result = cache.compile_entry(
            program.fn, *spec_args, name=program.name, pmap=True, axis_name=program.pmap_axis,
            **{k: v for k, v in options.items() if k == "donate_argnums"},
        )
    else:
        if program.mesh:
            options["mesh"] = data.mesh_4x2()
            if program.in_shardings is not None:
                options["in_shardings"] = program.in_shardings
            if program.out_shardings is not None:
                options["out_shardings"] = program.out_shardings
        result = cache.compile_entry(program.fn, *spec_args, name=program.name, **options, **spec_kwargs)
    drop_args, drop_kwargs = _static_layout(program, args)
    return {
        "key": result.entry.key,
        "signature": result.entry.signature,
        "symbolic": result.executable is None,
        "drop_args": drop_args,
        "drop_kwargs": drop_kwargs,
        "donated": list(program.donate_argnums),
    }


def run_compile(cache_dir: str, records: str, names: list[str]) -> None:
    import conformance_programs as programs

    caches = Caches(cache_dir)
    with open(records, "a", encoding="utf-8") as out:
        for name in names:
            program = programs.REGISTRY[name]
            out.write(json.dumps({"start": name}) + "\n")
            out.flush()
            start = time.perf_counter()
            record: dict[str, Any] = {
                "name": name, "group": program.group, "x64": program.x64,
                "serve": list(program.serve_inputs), "expected": {},
            }
            with x64(program.x64):
                try:
                    record.update(compile_one(caches.current(), program))
                except Exception as exc:  # noqa: BLE001 - recorded, reported by its test
                    record["compile_error"] = describe_error(exc)
                if program.refuse is None:
                    for builder in program.serve_inputs:
                        try:
                            record["expected"][builder] = _reference(program, builder)
                        except Exception as exc:  # noqa: BLE001
                            record["expected"][builder] = {"error": describe_error(exc)}
            record["seconds"] = round(time.perf_counter() - start, 3)
            out.write(json.dumps(record) + "\n")
            out.flush()


# ---------------------------------------------------------------- serving


def serve_one(cache: Any, plan: dict[str, Any]) -> dict[str, Any]:
    import aot

    import conformance_data as data

    fn = aot.load(plan["name"], cache=cache)
    calls = {}
    for builder in plan["serve"]:
        args, kwargs = data.INPUTS[builder]()
        args = on_device(args, plan["donated"])
        call_args = tuple(a for i, a in enumerate(args) if i not in plan["drop_args"])
        call_kwargs = {k: v for k, v in kwargs.items() if k not in plan["drop_kwargs"]}
        try:
            record = describe_outputs(fn(*call_args, **call_kwargs))
            record["deleted"] = deleted_flags(args, plan["donated"])
        except Exception as exc:  # noqa: BLE001 - recorded, reported by its test
            record = {"error": describe_error(exc)}
        calls[builder] = record
    return {"calls": calls, "signatures": fn.signatures}


def run_serve(cache_dir: str, plan_file: str, records: str, names: list[str]) -> None:
    block_model_code()
    plans = {}
    with open(plan_file, encoding="utf-8") as f:
        for line in f:
            item = json.loads(line)
            if "name" in item:
                plans[item["name"]] = item
    caches = Caches(cache_dir)
    with open(records, "a", encoding="utf-8") as out:
        for name in names:
            out.write(json.dumps({"start": name}) + "\n")
            out.flush()
            start = time.perf_counter()
            plan = plans[name]
            with x64(plan["x64"]):
                try:
                    record = {"name": name, **serve_one(caches.current(), plan)}
                except Exception as exc:  # noqa: BLE001
                    record = {"name": name, "error": describe_error(exc)}
            record["model_imported"] = BLOCKED in sys.modules
            record["seconds"] = round(time.perf_counter() - start, 3)
            out.write(json.dumps(record) + "\n")
            out.flush()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "compile":
        run_compile(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif mode == "serve":
        run_serve(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
