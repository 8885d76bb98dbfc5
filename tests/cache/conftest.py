"""Fixtures of the cache tests: index and blob-store backends, PostgreSQL databases.

PostgreSQL comes from ``AOT_TEST_POSTGRES_URL`` (``.ci/postgres.sh`` starts a
server and prints it). Every PostgreSQL test gets a fresh database
``aot_test_<random>``, dropped afterwards; without the variable those
parametrizations are skipped with a visible reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aot.cache.storage.folder import FolderObjectStore, MemoryObjectStore
from aot.cache.storage.content import ContentStore
from aot.cache.storage.database import SqlObjectStore
from aot.cache.index.sql import Index


_postgres = pytest.mark.postgres


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'index.sqlite'}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=_postgres)])
def index_url(request: pytest.FixtureRequest) -> str:
    """URL of a fresh, empty index database of each backend."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return str(request.getfixturevalue("sqlite_url"))


@pytest.fixture
def index(index_url: str) -> Iterator[Index]:
    idx = Index(index_url)
    try:
        yield idx
    finally:
        idx.close()


@pytest.fixture(
    params=[
        "folder",
        "memory",
        "database-sqlite",
        pytest.param("database-postgresql", marks=_postgres),
    ]
)
def blob_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ContentStore]:
    """An empty ContentStore over each kind of object store."""
    kind = request.param
    if kind == "folder":
        yield ContentStore(FolderObjectStore(tmp_path / "blobs"))
    elif kind == "memory":
        yield ContentStore(MemoryObjectStore())
    else:
        url = request.getfixturevalue("sqlite_url" if kind == "database-sqlite" else "postgres_url")
        idx = Index(url)
        try:
            yield ContentStore(SqlObjectStore(idx.engine))
        finally:
            idx.close()


# ---------------------------------------------------------------- raw-byte access


def read_stored(store: ContentStore, digest: str) -> bytes | None:
    """The compressed bytes as stored (bypassing verification)."""
    return store.store.read(digest)


def write_stored(store: ContentStore, digest: str, stored: bytes) -> None:
    """Overwrite the stored bytes of a blob, as disk rot or a bad copy would."""
    store.store.write(digest, stored)


def read_only_twin(store: ContentStore) -> ContentStore:
    """The same storage opened read-only."""
    raw = store.store
    if isinstance(raw, FolderObjectStore):
        return ContentStore(FolderObjectStore(raw.root, read_only=True))
    if isinstance(raw, MemoryObjectStore):
        return ContentStore(MemoryObjectStore(read_only=True, shares=raw))
    if isinstance(raw, SqlObjectStore):
        return ContentStore(SqlObjectStore(raw.engine, read_only=True))
    raise TypeError(raw)


def age_blob(store: ContentStore, digest: str, seconds: float) -> None:
    """Make a stored blob ``seconds`` old on its store's clock (mtime / created_at)."""
    import datetime as dt
    import os

    from aot.cache.index.schema import BLOBS_DATA

    raw = store.store
    when = raw.now() - dt.timedelta(seconds=seconds)
    if isinstance(raw, FolderObjectStore):
        os.utime(raw.path_for(digest), (when.timestamp(), when.timestamp()))
    elif isinstance(raw, MemoryObjectStore):
        raw._data[digest] = (raw._data[digest][0], when)
    elif isinstance(raw, SqlObjectStore):
        t = BLOBS_DATA
        with raw.engine.begin() as conn:
            conn.execute(sa.update(t).where(t.c.digest == digest).values(created_at=when))
    else:
        raise TypeError(raw)


@pytest.fixture
def set_blob_age() -> Callable[[ContentStore, str, float], None]:
    return age_blob


# Test modules cannot import from conftest.py unambiguously (tests/conftest.py has
# the same module name), so the helpers are handed out as fixtures.


@pytest.fixture
def read_raw() -> Callable[[ContentStore, str], bytes | None]:
    return read_stored


@pytest.fixture
def write_raw() -> Callable[[ContentStore, str, bytes], None]:
    return write_stored


@pytest.fixture
def reopen_read_only() -> Callable[[ContentStore], ContentStore]:
    return read_only_twin


# ======================================================================= Cache facade
#
# Fixtures of the facade and serving tests (test_cache, test_loader, test_maintenance,
# test_bundle, test_explain): caches of every backend, and artifacts compiled once
# per session (compiling is the slow part; storing an artifact is cheap).


CACHE_KINDS = [
    "folder",  # aot.Cache(folder): SQLite index + folder blobs
    "sqlite-db",  # aot.Cache("sqlite:///..."): SQLite index, blobs in the database
    pytest.param("postgresql", marks=_postgres),  # aot.Cache(pg_url): blobs in the database
    pytest.param("postgresql-folder", marks=_postgres),  # aot.Cache(pg_url, blob_location=folder)
]


class CacheFactory:
    """Opens ``aot.Cache`` objects on one location (like separate processes would)."""

    def __init__(self, kind: str, location: str, blob_location: str | None) -> None:
        self.kind = kind
        self.location = location
        self.blob_location = blob_location
        self._opened: list[Any] = []

    @property
    def folder_blobs(self) -> bool:
        return self.kind in ("folder", "postgresql-folder")

    def __call__(self, **kwargs: Any) -> Any:
        from aot.cache.cache import Cache

        if self.blob_location is not None:
            kwargs.setdefault("blob_location", self.blob_location)
        cache = Cache(self.location, **kwargs)
        self._opened.append(cache)
        return cache

    def close_all(self) -> None:
        for cache in self._opened:
            cache.close()


def _cache_factory(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CacheFactory]:
    folder = tmp_path / "cache"
    if kind == "folder":
        factory = CacheFactory(kind, str(folder), None)
    elif kind == "sqlite-db":
        factory = CacheFactory(kind, f"sqlite:///{tmp_path / 'cache.sqlite'}", None)
    elif kind == "postgresql":
        factory = CacheFactory(kind, str(request.getfixturevalue("postgres_url")), None)
    elif kind == "postgresql-folder":
        factory = CacheFactory(kind, str(request.getfixturevalue("postgres_url")), str(tmp_path / "blobs"))
    else:
        raise ValueError(kind)
    try:
        yield factory
    finally:
        factory.close_all()


@pytest.fixture(params=CACHE_KINDS)
def open_cache(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CacheFactory]:
    """Opens caches on one fresh location of each backend: ``open_cache(read_only=True)``."""
    yield from _cache_factory(request.param, request, tmp_path)


@pytest.fixture
def open_folder_cache(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CacheFactory]:
    """Like ``open_cache``, for the default backend only (SQLite + folder)."""
    yield from _cache_factory("folder", request, tmp_path / "folder-cache")


@pytest.fixture
def cache(open_cache: CacheFactory) -> Any:
    """A fresh, empty ``aot.Cache`` of each backend."""
    return open_cache()


REPO_ROOT = Path(__file__).resolve().parents[2]


def import_fixture_models() -> Any:
    """``fixtures.models`` (importable: pytest puts the repository root on ``sys.path``)."""
    from fixtures import models

    return models


class Compiled:
    """Artifacts compiled once per session, with inputs and ``jax.jit`` reference outputs."""

    MLP_NAME = "mlp.forward"
    TINY_NAME = "tiny"
    MLP_BATCHES = (1, 2, 4)

    def __init__(self) -> None:
        import jax
        import numpy as np

        import aot
        from aot.build import build_artifact

        models = import_fixture_models()

        self.models = models

        def artifact(fn: Any, *specs: Any, name: str) -> Any:
            computation = aot.lower(fn, *specs, name=name)
            executable = computation.compile()
            return build_artifact(executable, computation.portable_hlo(executable))

        # Parameters of mlp_init's structure from numpy: mlp_init runs a dozen eager
        # jax.random ops, each compiled, which takes seconds on a loaded 2-core box.
        rng = np.random.default_rng(0)
        sizes = models.MLP_SIZES
        self.params = jax.device_put([
            {
                "b": (0.1 * rng.standard_normal(n_out)).astype(np.float32),
                "w": (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32),
            }
            for n_in, n_out in zip(sizes[:-1], sizes[1:])
        ])
        self.param_specs = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), self.params
        )
        assert jax.tree_util.tree_structure(self.param_specs) == jax.tree_util.tree_structure(
            models.mlp_param_specs()
        )
        self.mlp: dict[int, Any] = {}
        self.inputs: dict[int, Any] = {}
        self.expected: dict[int, np.ndarray] = {}
        reference = jax.jit(models.mlp_forward)
        for batch in self.MLP_BATCHES:
            self.mlp[batch] = artifact(
                models.mlp_forward, self.param_specs, models.mlp_input_spec(batch), name=self.MLP_NAME
            )
            self.inputs[batch] = models.mlp_input(batch, seed=batch)
            self.expected[batch] = np.asarray(reference(self.params, self.inputs[batch]))
        self.tiny = artifact(models.tiny, *models.tiny_specs(), name=self.TINY_NAME)
        self.tiny_inputs = models.tiny_inputs()
        self.tiny_expected = np.asarray(jax.jit(models.tiny)(*self.tiny_inputs))

    def all(self) -> list[Any]:
        return [*self.mlp.values(), self.tiny]


@pytest.fixture(scope="session")
def compiled() -> Compiled:
    return Compiled()


@pytest.fixture
def served(open_folder_cache, compiled):  # noqa: ANN001, ANN201
    """A folder cache holding the three MLP buckets."""
    cache = open_folder_cache()
    for artifact in compiled.mlp.values():
        cache.put(artifact)
    return cache


def with_environment(artifact: Any, **parts: str) -> Any:
    """``artifact`` as if compiled in another environment: parts replaced, key recomputed.

    The blobs are unchanged (so the executable still runs here, but the loader must
    not trust it: its environment fingerprint differs).
    """
    from dataclasses import replace

    from aot.artifact import Artifact
    from aot.fingerprint import Fingerprint, combined_key

    manifest = artifact.manifest
    environment = Fingerprint.of(
        manifest.environment.kind, {**manifest.environment.as_dict(), **parts}
    )
    changed = replace(
        manifest,
        environment=environment,
        key=combined_key(manifest.program, environment),
        hmac=None,
        # the version fields must agree with the environment they describe
        jax_version=parts.get("jax", manifest.jax_version),
        jaxlib_version=parts.get("jaxlib", manifest.jaxlib_version),
    )
    return Artifact(changed, dict(artifact.blobs))


@pytest.fixture
def foreign() -> Callable[..., Any]:
    """``foreign(artifact, jaxlib="0.0.1")``: see :func:`with_environment`."""
    return with_environment


def set_manifest(cache: Any, key: str, manifest_json: str) -> None:
    """Overwrite the manifest text of an index row (tampering, for signature tests)."""
    from aot.cache.index.schema import ARTIFACTS

    t = ARTIFACTS
    with cache.index.engine.begin() as conn:
        conn.execute(sa.update(t).where(t.c.key == key).values(manifest=manifest_json))


@pytest.fixture
def tamper_manifest() -> Callable[[Any, str, str], None]:
    return set_manifest


@pytest.fixture(autouse=True)
def _no_cache_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's AOT_SIGNING_KEY / AOT_CACHE must not change what the tests see."""
    monkeypatch.delenv("AOT_SIGNING_KEY", raising=False)
    monkeypatch.delenv("AOT_CACHE", raising=False)


@pytest.fixture
def cache_of_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], CacheFactory]:
    """``cache_of_kind("postgresql")``: a CacheFactory for a test parametrized by hand."""

    def make(kind: str) -> CacheFactory:
        gen = _cache_factory(kind, request, tmp_path / kind)
        factory = next(gen)
        request.addfinalizer(lambda: next(gen, None))
        return factory

    return make


JAX_WORK_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


class JaxWork:
    """Records JAX's own tracing / lowering / XLA-compile events while active."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def _listener(self, event: str, duration: float, **kwargs: Any) -> None:
        if event in JAX_WORK_EVENTS:
            self.events.append(event)

    def __enter__(self) -> JaxWork:
        import jax.monitoring

        self.events.clear()
        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc: object) -> None:
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self._listener)


@pytest.fixture
def jax_work() -> JaxWork:
    """``with jax_work as w: ...; assert w.events == []`` (no trace, lower or compile)."""
    return JaxWork()
