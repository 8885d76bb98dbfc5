"""Every use of private JAX and jaxlib API in jax-aot, and nothing else.

Serving a stored executable without tracing needs what JAX keeps private: rebuilding
``pxla.UnloadedMeshExecutable`` and ``stages.Compiled`` from data, JAX's C++ dispatch
function, XLA's HLO shardings, shape polymorphism's solver, the pytree serialization
registry of ``jax.export``. Each module here wraps one job and says which internals it
uses; the rest of the code base imports these functions and never ``jax._src``
(tests/aot/test_jax_private.py enforces it).

:data:`PRIVATE_SYMBOLS` names each private module attribute the modules here import or
construct; tests/aot/jaxcompat/test_canary.py resolves every one and checks the
signatures we rely on, so a JAX upgrade fails with one list of what moved;
:data:`PRIVATE_ATTRIBUTES` names the private attributes of JAX objects read here
(``compiled._executable``, ...), which the canary finds on live objects and which
tests/aot/test_jax_private.py forbids elsewhere. Importing this package imports no
JAX: each module imports what it wraps.

Modules:
  build        compiling without JAX's in-memory cache; reading a ``Compiled``
  deserialize  XLA bytes -> ``UnloadedMeshExecutable`` -> ``Compiled``; custom calls
  dispatch     the C++ ``PjitFunction`` fast path and flat calls
  checks       what a deserialized executable takes and returns (HLO text, shapes)
  shardings    GSPMD shardings and HLO shardings
  shape_poly   solving and evaluating symbolic dimensions
  dtypes       extended dtypes and PRNG key types
  pytrees      ``jax.export``'s pytree serialization registry, jaxlib tracebacks
  lowering     tracing configuration used while lowering; a jitted function's settings
  export       the portable export of the lowering a compile used (no second trace)
  mlir         StableHLO modules in an MLIR context
  runtime      the state of JAX's distributed runtime and whether a backend started
  callbacks    the Python functions a lowered program calls back; loading with them
  persistent_cache  plugging a backend into JAX's persistent compilation cache
  distributed  the key-value store of a multi-process job (``jax.distributed``)
  gpu          a CUDA GPU's target config and the CUDA library versions it loads
  export_header  the fields of a serialized jax.export that date it (its flatbuffer's header)
  releases     what the rest asks of the running release: same_release(), the export
               calling-convention window, config options, JAX's monitoring event names
"""

from __future__ import annotations

#: Every private attribute of JAX or jaxlib the modules of this package use, as
#: ``"module:attribute"`` (the attribute may be dotted). A test checks that each
#: ``from jax._src... import name`` here is listed, and the canary resolves each one.
#: ``"A | B"``: a release difference (:data:`RELEASE_DIFFERENCES`), where one of the
#: alternatives (newest release's first) must resolve.
PRIVATE_SYMBOLS: tuple[str, ...] = (
    # build
    "jax._src.stages:Compiled",
    "jax._src.stages:Lowered",
    "jax._src.interpreters.pxla:UnloadedMeshExecutable.from_hlo",
    "jax._src.interpreters.pxla:MeshComputation.stablehlo",
    # deserialize
    "jax._src.interpreters.pxla:UnloadedMeshExecutable",
    "jax._src.interpreters.pxla:UnloadedMeshExecutable.load",
    "jax._src.stages:ArgInfo",
    "jax._src.lib:xla_client.DeviceList",
    "jax._src.lib:lapack.registrations",
    "jax._src.lax:linalg.initialize_lapack | jax._src.lib:lapack._lapack.initialize",
    "jax._src.lib:gpu_solver.initialize_hybrid_kernels",
    # callbacks (closures and fields read from the lowering's host callbacks)
    "jax._src.callback:emit_python_callback",
    "jax._src.callback:pure_callback_lowering",
    "jax._src.callback:_FlatCallback",
    # dispatch
    "jax._src.lib:_jax.pjit",
    "jax._src.interpreters.pxla:JitGlobalCppCacheKeys",
    "jax._src.interpreters.pxla:cc_shard_arg",
    "jax._src.interpreters.pxla:MeshExecutable.create_cpp_call",
    "jax._src.tree_util:dispatch_registry",
    "jax._src.array:ArrayImpl",
    # checks
    "jax._src.core:physical_aval",
    "jax._src.lib:xla_client.Shape.array_shape",
    "jax._src.lib:xla_client.HloSharding.from_proto",
    "jax._src.lib:hlo.HloPrintOptions | jax._src.lib:_jax.HloPrintOptions",
    "jax._src:op_shardings.are_hlo_shardings_equal",
    # shardings
    "jax._src.sharding_impls:GSPMDSharding",
    "jax._src.lib:xla_client.HloSharding.from_string",
    # shape_poly
    "jax._src.export.shape_poly:is_symbolic_dim",
    "jax._src.export.shape_poly:solve_dim_vars",
    "jax._src.export.shape_poly:all_dim_vars",
    "jax._src.export.shape_poly:ShapeEvaluator",
    "jax._src.core:InconclusiveDimensionOperation",
    # dtypes
    "jax._src.dtypes:ExtendedDType",
    "jax._src.random:prng.prngs",
    "jax._src.random:prng.KeyTy",
    # pytrees
    "jax._src.export:_export.serialization_registry",
    "jax._src.export:_export.deserialization_registry",
    "jax._src.lib:xla_client.Traceback.get_traceback",
    # lowering
    "jax._src.config:traceback_in_locations_limit",
    # mlir
    "jax._src.interpreters.mlir:make_ir_context",
    "jax._src.interpreters.mlir:module_to_bytecode",
    "jax._src.lib.mlir:ir.Module.parse",
    # runtime
    "jax._src.distributed:global_state",
    "jax._src.xla_bridge:backends_are_initialized",
    # distributed (the key-value store of a multi-process job)
    "jax._src.distributed:global_state.client",
    "jax._src.distributed:global_state.process_id",
    "jax._src.distributed:global_state.service",
    "jax._src.distributed:global_state.num_processes",
    "jax._src.distributed:global_state.coordinator_address",
    "jax._src.lib:_jax.DistributedRuntimeClient.key_value_set",
    "jax._src.lib:_jax.DistributedRuntimeClient.blocking_key_value_get",
    # persistent_cache
    "jax._src.compilation_cache_interface:CacheInterface",
    "jax._src:compilation_cache._cache",
    "jax._src:compilation_cache._cache_initialized",
    "jax._src:compilation_cache._cache_checked",
    "jax._src:compilation_cache._cache_used",
    "jax._src:compilation_cache._cache_initialized_mutex",
    "jax._src:compilation_cache.extract_executable_and_time",
    "jax._src:cache_key._hash_accelerator_config",
    # export
    "jax._src.export:_export._export_lowered",
    "jax._src.interpreters.pxla:MeshComputation",
    "jax._src.lib.mlir:passmanager.PassManager.parse",
    "jax._src.lib.mlir:ir.SymbolTable",
    "jax._src.lib.mlir:ir.DictAttr.get",
    "jax._src.lib.mlir:ir.ArrayAttr.get",
    # export_header (the generated reader of jax.export's flatbuffer; the accessors
    # read are checked by tests/aot/jaxcompat/test_export_header.py)
    "jax._src.export:serialization_generated.Exported.GetRootAsExported",
    "jax._src.export:serialization_generated.Exported.SerializationVersion",
    "jax._src.export:serialization_generated.Exported.CallingConventionVersion",
    "jax._src.export:serialization_generated.Exported.NrDevices",
    "jax._src.export:serialization_generated.Exported.NrDevicesShort",
    "jax._src.export:serialization_generated.Exported.UniqueAvalsLength"
    " | jax._src.export:serialization_generated.Exported.InShardingsLength",
    "jax._src.export:serialization_generated.Exported.JaxVersion"
    " | jax._src.export:serialization_generated.Exported.SerializationVersion",
    "jax._src.export:serialization_generated.Sharding.HloShardingProtoIsNone",
    # gpu (cuda_versions is None without the CUDA plugin: the canary checks the name)
    "jax._src.lib:xla_client.get_topology_for_devices",
    "jax._src.lib:cuda_versions",
    "jax._src.cudnn.fused_attention_stablehlo:check_cudnn_version",
)

#: Where the supported releases (:mod:`aot.jaxcompat.versions`) differ in the private
#: API used here. Each is decided by feature detection where it is used (a comment
#: ``Release difference "NAME"`` marks the place) and checked by the canary
#: (tests/aot/jaxcompat/test_canary.py), which CI runs on every supported release.
RELEASE_DIFFERENCES: dict[str, str] = {
    "HloPrintOptions": "jaxlib 0.10.1+ has it in jax._src.lib.hlo, 0.9.0-0.10.0 in jax._src.lib._jax (checks)",
    "initialize_lapack": (
        "JAX 0.10+ initialises jaxlib's LAPACK kernels with jax._src.lax.linalg.initialize_lapack; "
        "0.9.x only while lowering, through jaxlib's lapack._lapack.initialize (deserialize)"
    ),
    "UnloadedMeshExecutable.auto_spmd_lowering": (
        "a required field of pxla.UnloadedMeshExecutable in JAX 0.9.x, gone in 0.10 (deserialize)"
    ),
    "Exported.JaxVersion": (
        "the generated reader of jax.export's flatbuffer has Exported.JaxVersion (serialization "
        "version 12, the serializer's JAX release) from JAX 0.11.1; older readers do not (export_header)"
    ),
    "Exported.UniqueAvalsLength": (
        "the generated reader of jax.export's flatbuffer reads the unique avals and shardings "
        "tables of serialization version 10 from JAX 0.10.0; 0.9.x's reads the per-argument "
        "vectors only (export_header)"
    ),
    "InconclusiveDimensionOperation": (
        "public as jax.errors.InconclusiveDimensionOperation from JAX 0.10; 0.9.x has only "
        "jax._src.core's, and shape_poly raises a subclass of it (shape_poly)"
    ),
    "ClosedJaxpr": (
        "JAX 0.9-0.10 wrap a sub-jaxpr in a ClosedJaxpr (equations on .jaxpr); 0.11 merged "
        "ClosedJaxpr into Jaxpr (.jaxpr is a legacy accessor to itself) (lowering)"
    ),
    "SingleDeviceSharding": (
        "JAX 0.12.1 deprecates jax.sharding.SingleDeviceSharding for jax.sharding."
        "make_single_device_sharding / is_single_device_sharding, which 0.9-0.12.0 lack (shardings)"
    ),
    "Lowered._in_types": (
        "JAX 0.12.1+'s _export._export_lowered reads Lowered._in_types/_out_types, (treedef, "
        "avals) with unreduced 'high' types; 0.9-0.12.0 never read them (export)"
    ),
}

#: Private attributes of JAX objects the modules of this package read (on a
#: ``Lowered``, a ``Compiled``, its executables, a ``Sharding``, a ``PjitFunction``).
PRIVATE_ATTRIBUTES: frozenset[str] = frozenset({
    "_executable",  # Compiled -> pxla.MeshExecutable
    "_unloaded_executable",  # pxla.MeshExecutable -> pxla.UnloadedMeshExecutable
    "_params",  # Compiled -> its CompiledCallParams (const_args)
    "_lowering",  # Lowered -> pxla.MeshComputation
    "_name",  # pxla.MeshComputation
    "_device_list",  # pxla.MeshComputation
    "_compiler_options_kvs",  # pxla.MeshComputation
    "_no_kwargs",  # Lowered
    "_in_types",  # Lowered
    "_out_types",  # Lowered
    "_to_xla_hlo_sharding",  # Sharding
    "_device_assignment",  # Sharding
    "_cache_miss",  # the C++ call of a Compiled
    "_jit_info",  # a jax.jit function -> its static and donated arguments
    "_donated_invars",  # pxla.MeshComputation
    "_platforms",  # pxla.MeshComputation
})
