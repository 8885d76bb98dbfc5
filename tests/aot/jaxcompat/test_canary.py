"""The canary of a JAX upgrade: every private JAX symbol and attribute aot/jaxcompat
relies on still exists and still has the shape we use.

Each check collects what moved instead of stopping at the first, so a failing
upgrade reads as one list. The symbols are :data:`aot.jaxcompat.PRIVATE_SYMBOLS`; a
test below keeps that list complete (every ``from jax._src... import`` in
aot/jaxcompat is listed).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from aot.jaxcompat import PRIVATE_ATTRIBUTES, PRIVATE_SYMBOLS
from aot.jaxcompat.versions import release_tuple

# Runs on every supported JAX release (.ci/version-suite.sh).
pytestmark = pytest.mark.version_suite

JAXCOMPAT = Path(__file__).resolve().parents[3] / "aot" / "jaxcompat"


def resolve(symbol: str) -> Any:
    """``"module:attr.path"`` -> the object; raises what the lookup raises."""
    module_name, _, attributes = symbol.partition(":")
    value: Any = importlib.import_module(module_name)
    for name in attributes.split("."):
        try:
            value = getattr(value, name)
        except AttributeError:
            # A submodule not imported by its package yet (jax._src.lib.lapack).
            owner = getattr(value, "__name__", type(value).__name__)
            try:
                value = importlib.import_module(f"{owner}.{name}")
            except ImportError:
                raise AttributeError(f"{owner} has no attribute {name!r}") from None
    return value


def resolve_any(symbol: str) -> Any:
    """A :data:`PRIVATE_SYMBOLS` entry -> the object; ``"A | B"``: the first alternative
    this release has (a release difference), else what the last lookup raised."""
    alternatives = [s.strip() for s in symbol.split("|")]
    for alternative in alternatives[:-1]:
        try:
            return resolve(alternative)
        except (ImportError, AttributeError):
            continue
    return resolve(alternatives[-1])


def _moved(checks: dict[str, Any]) -> list[str]:
    """Runs each check (a callable returning a problem or None) and lists problems."""
    problems = []
    for what, check in checks.items():
        try:
            problem = check()
        except Exception as exc:  # noqa: BLE001 - what moved is the report
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            problems.append(f"{what}: {problem}")
    return problems


def test_every_private_symbol_resolves() -> None:
    missing = []
    for symbol in PRIVATE_SYMBOLS:
        try:
            resolve_any(symbol)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{symbol}: {type(exc).__name__}: {exc}")
    assert not missing, "private JAX symbols that moved:\n  " + "\n  ".join(missing)


def test_every_private_import_of_jaxcompat_is_listed() -> None:
    listed = {
        alternative.strip().replace(":", ".") for symbol in PRIVATE_SYMBOLS for alternative in symbol.split("|")
    }
    unlisted = []
    for path in sorted(JAXCOMPAT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jax._src"):
                for alias in node.names:
                    imported = f"{node.module}.{alias.name}"
                    if not any(s == imported or s.startswith(imported + ".") for s in listed):
                        unlisted.append(f"{path.name}:{node.lineno}: {imported}")
    assert not unlisted, "add to aot.jaxcompat.PRIVATE_SYMBOLS:\n  " + "\n  ".join(unlisted)


def _keywords_of_call(path: Path, callee: str) -> set[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == callee:
            return {k.arg for k in node.keywords if k.arg is not None}
    raise AssertionError(f"no call of {callee} in {path.name}")


def test_the_signatures_we_call_are_unchanged() -> None:
    from jax._src import stages
    from jax._src.export import shape_poly
    from jax._src.interpreters import pxla
    from jax._src.lib import _jax

    def unloaded_fields() -> str | None:
        fields = {f.name for f in dataclasses.fields(pxla.UnloadedMeshExecutable)}
        required = {
            f.name for f in dataclasses.fields(pxla.UnloadedMeshExecutable)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        from aot.jaxcompat.deserialize import RELEASE_FIELDS

        given = _keywords_of_call(JAXCOMPAT / "deserialize.py", "pxla.UnloadedMeshExecutable")
        # Release difference "UnloadedMeshExecutable.auto_spmd_lowering": passed where present.
        given |= set(RELEASE_FIELDS) & fields
        unknown, missing = given - fields, required - given
        if unknown or missing:
            return f"we pass unknown fields {sorted(unknown)}, miss required ones {sorted(missing)}"
        return None

    def compiled_init() -> str | None:
        names = list(inspect.signature(stages.Compiled.__init__).parameters)[1:]
        expected = ["executable", "const_args", "args_info", "out_tree", "no_kwargs", "in_types", "out_types"]
        return None if names[: len(expected)] == expected else f"parameters are {names}"

    def pjit_arity() -> str | None:
        # nanobind functions have no inspectable signature; their docstring has it.
        head = (_jax.pjit.__doc__ or "").split("->")[0]
        names = re.findall(r"(\w+)\s*:", head[head.index("(") + 1 :])
        expected = [
            "function_name", "fun", "cache_miss", "static_argnums", "static_argnames",
            "global_cache_key", "pytree_registry", "shard_arg_fallback",
        ]
        return None if names[: len(expected)] == expected else f"parameters are {names}"

    def from_hlo() -> str | None:
        parameters = inspect.signature(pxla.UnloadedMeshExecutable.from_hlo).parameters
        missing = {"name", "hlo", "compiler_options_kvs", "device_list"} - set(parameters)
        return f"no parameters {sorted(missing)}" if missing else None

    def shape_poly_functions() -> str | None:
        arities = {
            "solve_dim_vars": (shape_poly.solve_dim_vars, 2),
            "all_dim_vars": (shape_poly.all_dim_vars, 1),
            "is_symbolic_dim": (shape_poly.is_symbolic_dim, 1),
        }
        wrong = [
            name for name, (fn, n) in arities.items()
            if len([p for p in inspect.signature(fn).parameters.values() if p.default is p.empty]) != n
        ]
        if not hasattr(shape_poly.ShapeEvaluator({}), "evaluate"):
            wrong.append("ShapeEvaluator.evaluate")
        return f"changed: {wrong}" if wrong else None

    def export_lowered() -> str | None:
        from jax._src.export import _export

        names = list(inspect.signature(_export._export_lowered).parameters)
        computation = list(inspect.signature(pxla.MeshComputation.__init__).parameters)[1:]
        expected = ["name", "hlo", "const_args", "donated_invars", "platforms",
                    "compiler_options_kvs", "device_assignment"]
        if names[:3] != ["lowered", "jaxpr", "fun_name"]:
            return f"_export_lowered parameters are {names}"
        return None if computation[: len(expected)] == expected else f"MeshComputation parameters are {computation}"

    def distributed_client() -> str | None:
        # nanobind methods: the signature is the first line of the docstring.
        client = _jax.DistributedRuntimeClient
        wanted = {
            "key_value_set": "key_value_set(self, key: str, value: str, allow_overwrite: bool = False)",
            "blocking_key_value_get": "blocking_key_value_get(self, key: str, timeout_in_ms: int)",
        }
        moved = [
            name for name, head in wanted.items()
            if not (getattr(client, name).__doc__ or "").startswith(head)
        ]
        return f"changed: {moved}" if moved else None

    def accelerator_hash() -> str | None:
        from jax._src import cache_key

        fn = getattr(cache_key._hash_accelerator_config, "_aot_original", cache_key._hash_accelerator_config)
        names = list(inspect.signature(fn).parameters)
        return None if names == ["hash_obj", "accelerators"] else f"parameters are {names}"

    problems = _moved({
        "_jax.DistributedRuntimeClient key-value store": distributed_client,
        "cache_key._hash_accelerator_config": accelerator_hash,
        "_export._export_lowered and pxla.MeshComputation": export_lowered,
        "pxla.UnloadedMeshExecutable fields": unloaded_fields,
        "stages.Compiled.__init__": compiled_init,
        "_jax.pjit": pjit_arity,
        "pxla.UnloadedMeshExecutable.from_hlo": from_hlo,
        "shape_poly": shape_poly_functions,
    })
    assert not problems, "private JAX signatures that changed:\n  " + "\n  ".join(problems)


def _program() -> tuple[Any, Any, Any]:
    def f(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.sin(x) @ y

    args = (jax.ShapeDtypeStruct((4, 4), np.float32), jax.ShapeDtypeStruct((4, 2), np.float32))
    lowered = jax.jit(f).trace(*args).lower()
    return f, lowered, lowered.compile()


def test_private_attributes_are_on_live_objects() -> None:
    _, lowered, compiled = _program()
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    sharding = NamedSharding(mesh, PartitionSpec("x"))
    from aot.jaxcompat.dispatch import flat_call
    from aot.executable import ArgAval

    args = [ArgAval("x", (4, 4), np.dtype(np.float32), False, True), ArgAval("y", (4, 2), np.dtype(np.float32), False, True)]
    cpp_call = flat_call(compiled, args, compiled.out_tree)
    owners = {
        "_executable": compiled,
        "_unloaded_executable": compiled._executable,
        "_params": compiled,
        "_lowering": lowered,
        "_name": lowered._lowering,
        "_device_list": lowered._lowering,
        "_compiler_options_kvs": lowered._lowering,
        "_donated_invars": lowered._lowering,
        "_platforms": lowered._lowering,
        "_no_kwargs": lowered,
        "_in_types": lowered,
        "_out_types": lowered,
        "_to_xla_hlo_sharding": sharding,
        "_device_assignment": sharding,
        "_cache_miss": cpp_call,
        "_jit_info": jax.jit(lambda x: x, donate_argnums=0),
    }
    assert set(owners) == PRIVATE_ATTRIBUTES, "probe each attribute of PRIVATE_ATTRIBUTES here"
    missing = [f"{type(owner).__name__}.{name}" for name, owner in owners.items() if not hasattr(owner, name)]
    unloaded = compiled._executable._unloaded_executable
    for name in ("input_avals", "output_avals", "input_shardings", "output_shardings", "kept_var_idx",
                 "device_list", "committed", "name", "host_callbacks", "xla_executable"):
        if not hasattr(unloaded, name):
            missing.append(f"UnloadedMeshExecutable.{name}")
    from aot.jaxcompat.lowering import jit_settings

    settings = jit_settings(jax.jit(lambda x, n: x, static_argnums=1, donate_argnums=0))
    if settings is None or settings[1]["donate_argnums"] != (0,) or settings[1]["static_argnums"] != (1,):
        missing.append(f"PjitFunction._jit_info (static/donate settings): {settings}")
    if not hasattr(compiled._params, "const_args"):
        missing.append("Compiled._params.const_args")
    for key in ("global_in_avals", "global_out_avals", "in_shardings", "out_shardings", "kept_var_idx", "committed"):
        if key not in lowered._lowering.compile_args:
            missing.append(f"MeshComputation.compile_args[{key!r}]")
    assert not missing, "private JAX attributes that moved:\n  " + "\n  ".join(missing)


def test_an_executable_round_trips_through_the_wrappers() -> None:
    """Serialize, deserialize, rebuild a ``Compiled``, dispatch in C++: the path a
    serving process takes, through aot.jaxcompat only."""
    from aot.executable import ArgAval
    from aot.jaxcompat import build, checks, deserialize, dispatch, shardings

    f, lowered, compiled = _program()
    x, y = jnp.ones((4, 4), np.float32), jnp.ones((4, 2), np.float32)
    expected = np.asarray(f(x, y))
    unloaded = build.unloaded_executable(compiled)
    assert unloaded is not None and list(build.hoisted_constants(compiled)) == []
    assert build.compile_args(lowered)["global_in_avals"] and build.lowered_devices(lowered)
    data = build.serialize_compiled(compiled)
    device = jax.devices()[0]
    devices = shardings.xla_device_list([device])
    xla_executable = deserialize.deserialize_xla_executable(device.client, data, devices)
    header = checks.hlo_module_header(xla_executable)
    assert header is not None and "entry_computation_layout={" in header
    args = [ArgAval("x", (4, 4), np.dtype(np.float32), False, True), ArgAval("y", (4, 2), np.dtype(np.float32), False, True)]
    loaded = deserialize.load_compiled(
        xla_executable, devices=devices, backend=device.client,
        in_avals=unloaded.input_avals, in_shardings=unloaded.input_shardings,
        out_avals=unloaded.output_avals, out_shardings=unloaded.output_shardings,
        committed=unloaded.committed, name=unloaded.name, kept_var_idx={0, 1}, args=args,
        in_tree=jax.tree_util.tree_structure(((0, 0), {})), out_tree=compiled.out_tree,
    )
    np.testing.assert_allclose(np.asarray(loaded(x, y)), expected, rtol=1e-6)
    fn = dispatch.flat_call(loaded, args, compiled.out_tree)
    assert not isinstance(fn, jax.stages.Compiled), "no C++ call path (create_cpp_call)"
    calls = []

    def cache_miss(*leaves: Any) -> Any:
        calls.append(1)
        return dispatch.first_call(fn, leaves)

    cpp = dispatch.dispatch_function("canary", cache_miss)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(cpp(x, y)), expected, rtol=1e-6)
    assert calls == [1], "the C++ dispatch did not cache the signature after the first call"
    assert dispatch.ARRAY_TYPE is type(x)


def test_shardings_shapes_and_registries() -> None:
    from aot.jaxcompat import checks, dtypes, lowering, mlir, pytrees, runtime, shape_poly, shardings

    def gspmd_round_trip() -> str | None:
        mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
        named = NamedSharding(mesh, PartitionSpec("x"))
        hlo = shardings.hlo_sharding(named, 2)
        rebuilt = shardings.gspmd_sharding(shardings.device_assignment(named), str(hlo), None)
        same = shardings.hlo_shardings_equal(shardings.hlo_sharding(rebuilt, 2), hlo)
        return None if same else f"{rebuilt} is not {named}"

    def physical_shape() -> str | None:
        text = checks.physical_shape_text((2, 3), jnp.int4)
        key = checks.physical_shape_text((4,), jax.random.key(0).dtype)
        ok = text.startswith("s4[2,3]") and key.startswith("u32[4,2]")
        return None if ok else f"int4 -> {text}, key<fry> -> {key}"

    def print_options() -> str | None:
        options = checks.print_options()
        if options is None:
            return "no HloPrintOptions (release difference 'HloPrintOptions')"
        gone = [name for name in checks.UNPRINTED_OPTIONS if not hasattr(options, name)]
        return f"HloPrintOptions lost {gone}" if gone else None

    def key_dtypes() -> str | None:
        found = dtypes.prng_key_dtypes()
        key_dtype = jax.random.key(0).dtype
        ok = "key<fry>" in found and isinstance(key_dtype, dtypes.ExtendedDType)
        return None if ok else f"found {sorted(found)}"

    def serialization_registry() -> str | None:
        @dataclasses.dataclass(frozen=True)
        class CanaryNode:
            label: str

        jax.tree_util.register_pytree_node(CanaryNode, lambda n: ((), n.label), lambda label, _: CanaryNode(label))
        jax.export.register_pytree_node_serialization(
            CanaryNode, serialized_name="aot.canary.CanaryNode",
            serialize_auxdata=lambda label: label.encode(), deserialize_auxdata=lambda data: data.decode(),
        )
        name, serialize = pytrees.node_serializer(CanaryNode)
        cls, deserialize = pytrees.node_deserializer("aot.canary.CanaryNode")
        ok = name == "aot.canary.CanaryNode" and cls is CanaryNode and deserialize(serialize("a")) == "a"
        return None if ok else "the registries answer otherwise"

    def traceback() -> str | None:
        tb = type(pytrees.current_traceback())
        # aot.treedef recognises a checkify traceback by this name and module.
        ok = tb.__name__ == "Traceback" and tb.__module__.startswith("jaxlib")
        return None if ok else f"{tb.__module__}.{tb.__name__}"

    def symbolic() -> str | None:
        (b,) = jax.export.symbolic_shape("b")
        avals = (jax.core.ShapedArray((b, 2), np.float32),)
        tree = jax.tree_util.tree_structure(((0,), {}))
        solution, constraints, synthetic = shape_poly.solve_dim_vars(avals, tree)
        evaluator = shape_poly.shape_evaluator({name: 5 for name, *_ in synthetic})
        constraints.check_statically(evaluator)
        ok = shape_poly.is_symbolic_dim(b) and shape_poly.all_dim_vars(avals) == ("b",)
        ok = ok and int(evaluator.evaluate(solution["b"])) == 5
        return None if ok else "solving b from a shape gave another answer"

    def module_text() -> str | None:
        _, lowered, _ = _program()
        text = mlir.text_without_locations(lowered.as_text(debug_info=True))
        copy = mlir.copy_module(lowered.compiler_ir())
        return None if "loc(" not in text and copy is not None else "locations stayed"

    def tracing() -> str | None:
        with lowering.no_traceback_locations():
            pass
        return None

    def distributed() -> str | None:
        import jax._src.distributed as state

        ok = hasattr(state.global_state, "client") and not runtime.distributed_client_active()
        return None if ok else "global_state has no client"

    def backends() -> str | None:
        import jax._src.xla_bridge as bridge

        jax.devices()  # the tests' backend is up: the answer must say so
        ok = callable(getattr(bridge, "backends_are_initialized", None)) and runtime.backend_started()
        return None if ok else "xla_bridge.backends_are_initialized moved"

    def lapack() -> str | None:
        from aot.jaxcompat.deserialize import lapack_targets

        from jax._src.lib import lapack as jaxlib_lapack

        # 0.9.x names every kernel lapack_*, 0.10+ one more (tridiagonal_solve_perturbed_ffi).
        registered = {name for targets in jaxlib_lapack.registrations().values() for name, *_ in targets}
        expected = {b"lapack_"} | {name.encode() for name in registered if not name.startswith("lapack_")}
        targets = set(lapack_targets())
        ok = bool(registered) and targets == expected
        return None if ok else f"{sorted(targets)}, not {sorted(expected)}: jaxlib's registrations were not read"

    problems = _moved({
        "GSPMDSharding / HloSharding": gspmd_round_trip,
        "physical shapes": physical_shape,
        "HloPrintOptions": print_options,
        "PRNG key dtypes": key_dtypes,
        "pytree serialization registry": serialization_registry,
        "jaxlib Traceback": traceback,
        "shape_poly": symbolic,
        "mlir": module_text,
        "traceback_in_locations_limit": tracing,
        "jax._src.distributed": distributed,
        "jax._src.xla_bridge.backends_are_initialized": backends,
        "LAPACK registrations": lapack,
    })
    assert not problems, "private JAX behaviour that changed:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("platform", ["cpu"])
def test_custom_call_targets_register(platform: str, caplog: pytest.LogCaptureFixture) -> None:
    from aot.jaxcompat import deserialize

    # Release difference "initialize_lapack": whichever initialiser this release has runs.
    deserialize._custom_calls_ready.discard(platform)
    with caplog.at_level("WARNING", logger="aot.jaxcompat.deserialize"):
        deserialize.ensure_custom_call_targets(platform)  # logs a warning, never raises, when they moved
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_closed_over_constants_are_seen_before_and_after_compiling() -> None:
    """Release difference "hoisted constants": JAX >= 0.11 passes a large array a
    function closes over as a leading argument of the executable (aot.constants), 0.10
    embeds it. What :func:`build.lowering_constants` sees before compiling (the key's
    ``constants`` part) must be what :func:`build.hoisted_constants` hands the call."""
    from aot.jaxcompat import build

    table = np.arange(100_000, dtype=np.float32).reshape(8, 12_500)
    lowered = jax.jit(lambda x: x @ table).lower(jax.ShapeDtypeStruct((8,), np.float32))
    before = build.lowering_constants(lowered)
    after = build.hoisted_constants(lowered.compile())
    assert len(before) == len(after) and all(a is b for a, b in zip(before, after))
    # 0.10 embeds it; 0.12.1 hoists it (the CI rehearsal of 2026-12-07: 0.11.0 through
    # 0.12.0.1 still embed a 400 KB one); either way what the key saw is what the call gets.
    release = release_tuple(jax.__version__)
    shapes = [np.asarray(c).shape for c in after]
    if release >= (0, 12, 1):
        assert shapes == [(8, 12_500)]
    elif release >= (0, 11):
        assert shapes in ([], [(8, 12_500)])
    else:
        assert shapes == []


def test_what_jax_0_11_changed_resolves_either_way() -> None:
    """Each difference JAX 0.11's source shows for what jax-aot uses (docs/jax-releases.md,
    "JAX 0.11"), checked so that it passes on 0.10.2 and on 0.11: either spelling
    resolves, and the code path that depends on it still runs."""
    import ast as _ast

    from jax._src import cache_key
    from jax._src import compilation_cache as cc

    from aot.jaxcompat import build
    from aot.jaxcompat.export import export_lowered

    def cache_key_get() -> str | None:
        # 0.11: ignore_callbacks (an IgnoreCallbacks enum) became ignore_custom_partitioning
        # (a bool); tests/jax_cache/test_slice_share.py passes the first four only.
        names = list(inspect.signature(cache_key.get).parameters)
        spellings = {"ignore_callbacks", "ignore_custom_partitioning"} & set(names)
        ok = names[:4] == ["module", "devices", "compile_options", "backend"] and len(spellings) == 1
        return None if ok else f"parameters are {names}"

    def executable_and_time() -> str | None:
        # 0.11: gained host_callbacks=() (JAX then stores programs with host callbacks too).
        parameters = inspect.signature(cc.get_executable_and_time).parameters
        names = list(parameters)
        extra = [n for n in names[4:] if parameters[n].default is inspect.Parameter.empty]
        ok = names[:4] == ["cache_key", "compile_options", "backend", "executable_devices"] and not extra
        return None if ok else f"parameters are {names}"

    def device_count() -> str | None:
        # 0.11: from_hlo refuses a device list whose length is not the lowering's
        # num_devices; compile_uncached passes both from the same lowering.
        mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
        spec = jax.ShapeDtypeStruct((4, 2), np.float32, sharding=NamedSharding(mesh, PartitionSpec("x")))
        lowered = jax.jit(lambda x: x * 2).lower(spec)
        count = build.compile_args(lowered)["num_devices"]
        if count != len(build.lowered_devices(lowered)):
            return f"num_devices {count} for {len(build.lowered_devices(lowered))} devices"
        compiled = build.compile_uncached(lowered, None)
        x = jax.device_put(np.arange(8, dtype=np.float32).reshape(4, 2), spec.sharding)
        same = np.array_equal(np.asarray(compiled(x)), np.asarray(x) * 2)
        return None if same else "compile_uncached gave another result"

    def no_public_pxla() -> str | None:
        # 0.11 removed jax.interpreters.pxla's public names (MeshExecutable,
        # global_result_handlers, ...): aot/jaxcompat uses jax._src only.
        found = []
        for path in sorted(JAXCOMPAT.glob("*.py")):
            for node in _ast.walk(_ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, _ast.Import) else []
                if isinstance(node, _ast.ImportFrom) and node.module:
                    names.append(node.module)
                if isinstance(node, _ast.Attribute):
                    names.append(_ast.unparse(node))
                found += [f"{path.name}:{node.lineno}: {n}" for n in names if n.startswith("jax.interpreters")]
        return f"uses {found}" if found else None

    def traced_jaxpr() -> str | None:
        # 0.11 merged ClosedJaxpr into Jaxpr (``.jaxpr`` is a legacy accessor to itself):
        # aot.lowering reads .jaxpr.eqns, .consts, .effects and the sub-jaxprs in params
        # (a cond's branches: a tuple of them).
        program = jax.jit(lambda x: jax.lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x) * 2)
        jaxpr = program.trace(jnp.ones(3, np.float32)).jaxpr
        subs = [
            item for eqn in jaxpr.jaxpr.eqns for value in eqn.params.values()
            for item in (value if isinstance(value, (tuple, list)) else (value,))
            if hasattr(getattr(item, "jaxpr", item), "eqns")
        ]
        ok = hasattr(jaxpr, "consts") and not jaxpr.effects and len(subs) == 2  # the branches
        return None if ok else f"{type(jaxpr).__name__}: sub-jaxprs {subs}"

    def portable_round_trip() -> str | None:
        # After 0.11.0 jax.export writes serialization version 12 (with the jax version)
        # and refuses expired artifacts on reading: a fresh one must read back.
        _, lowered, _ = _program()
        data = export_lowered(lowered).serialize()
        back = jax.export.deserialize(bytearray(data))
        return None if len(back.in_avals) == 2 and back.nr_devices == 1 else f"read back {back}"

    problems = _moved({
        "cache_key.get": cache_key_get,
        "compilation_cache.get_executable_and_time": executable_and_time,
        "UnloadedMeshExecutable.from_hlo device count": device_count,
        "jax.interpreters.pxla": no_public_pxla,
        "ClosedJaxpr / Jaxpr": traced_jaxpr,
        "jax.export serialization": portable_round_trip,
    })
    assert not problems, f"jax {jax.__version__}: a 0.11 difference unhandled:\n  " + "\n  ".join(problems)


def test_every_release_difference_is_named_where_it_is_decided() -> None:
    """Each entry of RELEASE_DIFFERENCES marks its feature detection in aot/jaxcompat
    (``Release difference "NAME"``), and each marked one is listed: the list is what a
    reviewer of the next JAX release reads first."""
    from aot.jaxcompat import RELEASE_DIFFERENCES

    marked = set()
    for path in sorted(JAXCOMPAT.glob("*.py")):
        marked |= set(re.findall(r"Release difference \"([^\"]+)\"", path.read_text())) - {"NAME"}
    assert marked == set(RELEASE_DIFFERENCES)


def test_each_release_difference_holds_either_way() -> None:
    """One check per entry of RELEASE_DIFFERENCES, run on every supported release
    (.ci/version-suite.sh): whichever side of the difference this release is on, the
    code that decides it takes a path that works here."""
    import warnings

    from aot.jaxcompat import RELEASE_DIFFERENCES, checks, deserialize, lowering, shape_poly, shardings
    from aot.jaxcompat import export as route

    def hlo_print_options() -> str | None:
        return None if checks.print_options() is not None else "no HloPrintOptions in _hlo nor in _jax"

    def initialize_lapack() -> str | None:
        resolve_any("jax._src.lax:linalg.initialize_lapack | jax._src.lib:lapack._lapack.initialize")
        return None

    def auto_spmd_lowering() -> str | None:
        from jax._src.interpreters import pxla

        fields = {f.name for f in dataclasses.fields(pxla.UnloadedMeshExecutable)}
        passed = deserialize._release_fields()
        return None if set(passed) == set(deserialize.RELEASE_FIELDS) & fields else f"passes {passed}"

    def inconclusive_dimension() -> str | None:
        (b,) = jax.export.symbolic_shape("b")
        try:
            bool(b >= 3)
        except shape_poly.INCONCLUSIVE_DIMENSION:
            return None
        return "comparing a symbolic dimension with 3 was decided"

    def closed_jaxpr() -> str | None:
        inner = jax.jit(lambda x: jnp.sin(x) + 1)
        program = jax.jit(lambda x: jax.lax.cond(x.sum() > 0, jnp.sin, jnp.cos, inner(x)))
        names = {eqn.primitive.name for eqn in lowering.all_equations(program.trace(jnp.ones(3)).jaxpr)}
        return None if {"sin", "cos", "cond"} <= names else f"found {sorted(names)}"

    def lowered_in_types() -> str | None:
        _, lowered, _ = _program()
        if route._high_types(lowered):
            return "a plain program is taken for one with unreduced types"
        exported = route.export_lowered(lowered)
        return None if len(exported.in_avals) == 2 and len(exported.out_avals) == 1 else f"exported {exported}"

    def single_device() -> str | None:
        device = jax.devices()[1]
        mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            placed = shardings.single_device_sharding(device)
            ok = shardings.is_single_device_sharding(placed) and placed.device_set == {device}
            ok = ok and not shardings.is_single_device_sharding(NamedSharding(mesh, PartitionSpec("x")))
        x = jax.device_put(np.ones(2, np.float32), placed)
        return None if ok and x.devices() == {device} else f"{placed} places on {x.devices()}"

    def export_header() -> tuple[Any, Any]:
        from aot.jaxcompat.export_header import read_export_header

        exported = jax.export.export(jax.jit(lambda x: x * 2))(jax.ShapeDtypeStruct((8,), jnp.float32))
        return exported, read_export_header(bytes(exported.serialize()))

    def jax_version_field() -> str | None:
        _, header = export_header()
        if header is None:
            return "the reader cannot walk this release's own export"
        recorded = header.serialization_field >= 12
        return None if header.jax_version == (jax.__version__ if recorded else None) else f"read {header}"

    def unique_avals() -> str | None:
        exported, header = export_header()
        ok = header is not None and header.nr_devices == exported.nr_devices
        return None if ok and header.calling_convention == exported.calling_convention_version else f"read {header}"

    checks_by_name = {
        "Exported.JaxVersion": jax_version_field,
        "Exported.UniqueAvalsLength": unique_avals,
        "HloPrintOptions": hlo_print_options,
        "initialize_lapack": initialize_lapack,
        "UnloadedMeshExecutable.auto_spmd_lowering": auto_spmd_lowering,
        "InconclusiveDimensionOperation": inconclusive_dimension,
        "ClosedJaxpr": closed_jaxpr,
        "Lowered._in_types": lowered_in_types,
        "SingleDeviceSharding": single_device,
    }
    assert set(checks_by_name) == set(RELEASE_DIFFERENCES), "check each release difference here"
    problems = _moved(checks_by_name)
    assert not problems, f"jax {jax.__version__}: release differences unhandled:\n  " + "\n  ".join(problems)
