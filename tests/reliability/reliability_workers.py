"""Child processes of the reliability tests (run as a script: ``python THIS COMMAND ...``).

Commands:
  concurrent LOCATION WORKER OPS SEED SYNC_DIR
      one of N concurrent writers: compile / put OPS times into one cache, keys overlap.
  zygote LOCATION BLOB_LOCATION|- ARTIFACT_DIR
      a fork server for the crash tests: imports JAX and the cache once, then for each
      ``go SEED CRASH_AT`` line on stdin forks a writer that puts the saved artifacts
      (in a seeded order, forever) until the parent SIGKILLs it.
  nopickle WORKDIR
      builds one artifact of every kind, then loads them all (aot.load, Cache.get,
      the recompile ladder, Cache.import_bundle) under an audit hook that fails on
      any unpickling.

The module is also imported by the tests (``scaled`` must be the same function in
the parent and in the children, so that keys agree).
"""

from __future__ import annotations

import collections
import gc
import json
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

CONCURRENT_NAME = "rel.concurrent"
CONCURRENT_SIZES = tuple(range(1, 11))  # 10 distinct keys


#: A module-level namedtuple (the dispatcher matches pytrees by class, so the class
#: must be importable where the artifact is loaded).
Pair = collections.namedtuple("Pair", ["a", "b"])


def scaled(x):  # noqa: ANN001, ANN201 - the tiny program every writer compiles
    return x * 2.0 + 1.0


def expected_scaled(n: int):  # noqa: ANN201
    import numpy as np

    return np.arange(n, dtype=np.float32) * 2.0 + 1.0


# ---------------------------------------------------------------- concurrent writers


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout}s")
        time.sleep(0.005)


def concurrent(location: str, worker: int, ops: int, seed: int, sync_dir: str) -> int:
    import jax.numpy as jnp
    import numpy as np

    import aot
    from aot.cache.cache import Cache

    sync = Path(sync_dir)
    (sync / f"ready.{worker}").touch()
    _wait_for(sync / "go", 120)  # every writer starts at once
    rng = random.Random(seed * 1000 + worker)
    hits = misses = 0
    cache = Cache(location)
    try:
        for i in range(ops):
            n = rng.choice(CONCURRENT_SIZES)
            spec = aot.spec(f"f32[{n}]")
            if i % 5 == 4:  # some plain puts, not only compile()
                entry = cache.put(aot.lower(scaled, spec, name=CONCURRENT_NAME))
                exe = cache.get(entry.key)
            else:
                result = cache.compile_entry(scaled, spec, name=CONCURRENT_NAME)
                exe = result.executable
                hits += result.hit
                misses += not result.hit
            out = np.asarray(exe(jnp.arange(n, dtype=jnp.float32)).block_until_ready())
            np.testing.assert_allclose(out, expected_scaled(n))
    finally:
        cache.close()
    # one write(2) of less than PIPE_BUF bytes: atomic, even with 8 writers on one pipe
    sys.stdout.flush()
    os.write(1, (json.dumps({"worker": worker, "hits": hits, "misses": misses}) + "\n").encode())
    return 0


def concurrent_forked(location: str, writers: int, ops: int, seed: int, sync_dir: str) -> int:
    """``writers`` concurrent writers forked from this process after the imports.

    JAX is imported here once but its backend is not initialised, so every forked
    writer starts its own XLA client: they are as independent as spawned processes,
    without paying the ~1.5 s import eight times on a 2-core machine.
    """
    import aot  # noqa: F401
    import aot.cache.cache  # noqa: F401
    import jax

    assert not jax._src.xla_bridge._backends, "the backend must not exist before fork"
    pids = []
    for worker in range(writers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = concurrent(location, worker, ops, seed, sync_dir)
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += status != 0
    return 1 if failed else 0


# ---------------------------------------------------------------- crash-test fork server

#: Where a forked writer kills itself (CRASH_AT), besides being killed at random:
#: these, and every ``put.*`` point of :mod:`aot.cache.pauses` (the lease protocol).
CRASH_POINTS = (
    "none",  # only the parent's random SIGKILL
    "before_replace",  # inside FolderObjectStore.write: temp file written, not renamed
    "after_blobs",  # every blob durable, index transaction not begun
    "before_commit",  # inside an index write transaction (lease or row), before COMMIT
)


def _say(line: str) -> None:
    """One line in one write(2): the zygote and its writers share a pipe, and print()
    may write a line and its newline separately (PYTHONUNBUFFERED), interleaving them."""
    os.write(1, (line + "\n").encode())


def _suicide() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)  # never reached


def _writer(location: str, blob_location: str | None, artifacts: list, seed: int, crash_at: str) -> None:
    from sqlalchemy import event

    from aot.cache.storage import folder as blobs_module
    from aot.cache.cache import Cache

    rng = random.Random(seed)
    order = list(artifacts)
    rng.shuffle(order)
    cache = Cache(location, blob_location=blob_location)
    # Stored, intact entries are not written again: a chosen crash point is counted
    # among the writes this writer will really do.
    pending = sum(1 for a in order if not getattr(cache.index.get(a.manifest.key), "ok", False))
    pending = max(pending, 1)
    if crash_at == "before_replace":
        real_replace = os.replace
        countdown = [rng.randrange(1, 2 * pending + 1)]

        class _Os:
            def __getattr__(self, name):  # noqa: ANN001, ANN204
                return getattr(os, name)

            @staticmethod
            def replace(src, dst):  # noqa: ANN001, ANN205
                countdown[0] -= 1
                if countdown[0] <= 0:
                    _suicide()
                return real_replace(src, dst)

        blobs_module.os = _Os()
    if crash_at == "before_commit":
        commits = [rng.randrange(1, pending + 1)]

        @event.listens_for(cache.index.engine, "commit")
        def _before_commit(conn):  # noqa: ANN001, ANN202
            if conn.get_execution_options().get("aot_write"):
                commits[0] -= 1
                if commits[0] <= 0:
                    _suicide()

    if crash_at.startswith("put."):
        from aot.cache import pauses

        assert crash_at in pauses.POINTS, crash_at
        arrivals = [rng.randrange(1, pending + 1)]

        def hook(point: str) -> None:
            if point == crash_at:
                arrivals[0] -= 1
                if arrivals[0] <= 0:
                    _suicide()

        pauses.set_hook(hook)
    if crash_at == "after_blobs":
        real_add = cache.index.add
        adds = [rng.randrange(1, pending + 1)]

        def add(entry, **kwargs):  # noqa: ANN001, ANN202
            adds[0] -= 1
            if adds[0] <= 0:
                _suicide()
            return real_add(entry, **kwargs)

        cache.index.add = add
    _say(f"writing {os.getpid()}")
    rounds = 0
    while True:  # until killed
        for i, artifact in enumerate(order):
            cache.put_artifact(artifact)
            if rounds == 0:
                _say(f"put {i}")  # progress: the parent kills relative to it
        rounds += 1
        if crash_at != "none":
            break
    _say(f"done {os.getpid()}")


def _collector(location: str, blob_location: str | None, crash_at: str) -> None:
    """A gc that evicts every entry and kills itself at ``crash_at`` (a ``gc.*`` point)."""
    from aot.cache import pauses
    from aot.cache.admin import maintenance
    from aot.cache.cache import Cache

    assert crash_at in pauses.POINTS and crash_at.startswith("gc."), crash_at

    def hook(point: str) -> None:
        if point == crash_at:
            _suicide()

    pauses.set_hook(hook)
    maintenance.ORPHAN_GRACE_SECONDS = 0.0
    maintenance.GC_BATCH = 1  # a kill between batches leaves some blobs deleted, some not
    cache = Cache(location, blob_location=blob_location)
    _say(f"collecting {os.getpid()}")
    cache.gc(max_size=0)
    _say(f"done {os.getpid()}")


def zygote(location: str, blob_location: str, artifact_dir: str) -> int:
    from aot.artifact import Artifact
    import aot.cache.cache  # noqa: F401 - imported before forking, once
    import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401
    import sqlalchemy.dialects.sqlite.pysqlite  # noqa: F401

    artifacts = [Artifact.open(p) for p in sorted(Path(artifact_dir).iterdir()) if p.is_dir()]
    # Warm up once here what every writer would otherwise do on its first put (~1 s of
    # lazy imports and SQLAlchemy statement compilation), on a throw-away cache whose
    # engine is closed before any fork; and keep the writers' garbage collector off the
    # inherited heap (copy-on-write).
    import tempfile

    from aot.cache.cache import Cache

    with tempfile.TemporaryDirectory() as scratch:
        warm = Cache(scratch)
        warm.put_artifact(artifacts[0])
        warm.put_artifact(artifacts[0])
        warm.close()
    gc.freeze()
    _say(f"ready {len(artifacts)}")
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "quit":
            break
        command, seed, crash_at = parts[0], int(parts[1]), parts[2]
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # the writer, or a gc
            code = 0
            try:
                blobs_at = None if blob_location == "-" else blob_location
                if command == "gc":
                    _collector(location, blobs_at, crash_at)
                else:
                    _writer(location, blobs_at, artifacts, seed, crash_at)
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                sys.stdout.flush()
                code = 3
            sys.stdout.flush()
            os._exit(code)
        _say(f"pid {pid}")
        _, status = os.waitpid(pid, 0)
        _say(f"exit {pid} {status}")
    return 0


# ---------------------------------------------------------------- no pickle on load paths


def _install_no_pickle_guard(events: list[str]) -> None:
    """Fail on unpickling of any kind, and on marshal.loads outside the import system."""
    import pickle

    def hook(event: str, args: tuple) -> None:
        if event == "pickle.find_class":
            events.append(f"{event}{args}")
            raise RuntimeError(f"unpickling on a load path: {event}{args}")
        if event == "marshal.loads":
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith("<frozen importlib"):
                return  # importing a module's .pyc: code loading, not data
            events.append(f"{event} from {caller}")
            raise RuntimeError(f"marshal.loads outside the import system: {events[-1]}")

    sys.addaudithook(hook)

    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        events.append("pickle.loads/load/Unpickler")
        raise RuntimeError("pickle used on a load path")

    pickle.loads = refuse  # pure-data pickles never reach find_class: catch them too
    pickle.load = refuse
    pickle.Unpickler = refuse  # type: ignore[misc]


def nopickle(workdir: str) -> int:
    from dataclasses import replace

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import aot
    from aot.artifact import Artifact
    from aot.cache.cache import Cache
    from aot.fingerprint import Fingerprint, combined_key

    work = Path(workdir)
    src = Cache(work / "src")
    def jit_fn(x):
        return jnp.sin(x) * 2

    def pytree_fn(p, scale):
        return Pair(a=p.a * scale, b={"sum": p.b + p.a})

    def mesh_fn(w, x):
        return x @ w

    def pmap_fn(x):
        return jax.lax.psum(x, "i")

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    x8 = jnp.arange(8, dtype=jnp.float32)
    pair = Pair(a=jnp.ones((3,), jnp.float32), b=jnp.full((3,), 2.0, jnp.float32))
    w = jax.device_put(jnp.ones((16, 8), jnp.float32), NamedSharding(mesh, P(None, "model")))
    xm = jax.device_put(jnp.ones((8, 16), jnp.float32), NamedSharding(mesh, P("data", None)))
    xp = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)

    src.put(aot.lower(jit_fn, "f32[8]", name="np.jit"))
    src.put(aot.lower(pytree_fn, Pair(a="f32[3]", b="f32[3]"), "f32[]", name="np.pytree"))
    src.put(
        aot.lower(
            mesh_fn, aot.spec("f32[16,8]@(None,'model')", mesh=mesh),
            aot.spec("f32[8,16]@('data',None)", mesh=mesh), mesh=mesh, name="np.mesh",
        )
    )
    src.put(aot.lower_pmap(pmap_fn, "f32[8,4]", axis_name="i", name="np.pmap"))
    # An entry "from another environment": the loader must recompile it from its HLO.
    (jit_entry,) = src.entries("np.jit")
    artifact = src.artifact(jit_entry)
    env = Fingerprint.of(
        artifact.manifest.environment.kind, {**artifact.manifest.environment.as_dict(), "jaxlib": "0.0.0"}
    )
    foreign = replace(
        artifact.manifest, name="np.foreign", environment=env,
        key=combined_key(artifact.manifest.program, env),
    )
    src.put_artifact(Artifact(foreign, dict(artifact.blobs)))
    src.export_bundle(work / "all.bundle")
    src.close()

    events: list[str] = []
    _install_no_pickle_guard(events)
    checks = 0

    cache = Cache(work / "src")
    calls = {
        "np.jit": ((x8,), lambda out: np.testing.assert_allclose(out, np.sin(np.arange(8)) * 2, rtol=1e-6)),
        "np.foreign": ((x8,), lambda out: np.testing.assert_allclose(out, np.sin(np.arange(8)) * 2, rtol=1e-6)),
        "np.pytree": (
            (pair, jnp.float32(3.0)),
            lambda out: (
                np.testing.assert_allclose(out.a, [3.0] * 3),
                np.testing.assert_allclose(out.b["sum"], [3.0] * 3),
                type(out).__name__ == "Pair" or (_ for _ in ()).throw(AssertionError(type(out))),
            ),
        ),
        "np.mesh": ((w, xm), lambda out: np.testing.assert_allclose(out, np.full((8, 8), 16.0))),
        "np.pmap": ((xp,), lambda out: np.testing.assert_allclose(out, np.tile(xp.sum(0), (8, 1)))),
    }
    for name, (args, check) in calls.items():
        fn = aot.load(name, cache)
        out = jax.block_until_ready(fn(*args))
        check(out)
        checks += 1
    for entry in cache.entries():
        if entry.name != "np.foreign":
            cache.get(entry.key)
            checks += 1
    dst = Cache(work / "dst")
    report = dst.import_bundle(work / "all.bundle")
    for name, (args, check) in calls.items():
        check(jax.block_until_ready(aot.load(name, dst)(*args)))
        checks += 1
    print(json.dumps({"events": events, "checks": checks, "imported": len(report.imported)}))
    return 0 if not events else 1


def guardcheck() -> int:
    """The guard itself must catch each way of unpickling (else the test proves nothing)."""
    import _pickle
    import marshal
    import pickle

    data = pickle.dumps(collections.OrderedDict(a=1))
    plain = pickle.dumps([1, 2])
    code = marshal.dumps(compile("1", "<x>", "eval"))
    events: list[str] = []
    _install_no_pickle_guard(events)
    caught = []
    for name, attempt in (
        ("pickle.loads", lambda: pickle.loads(plain)),
        ("_pickle.loads", lambda: _pickle.loads(data)),
        ("marshal.loads", lambda: marshal.loads(code)),
    ):
        try:
            attempt()
        except RuntimeError:
            caught.append(name)
    import email.mime.text  # noqa: F401 - imports (.pyc via marshal) stay allowed

    print(json.dumps({"caught": caught, "events": events}))
    return 0


def main(argv: list[str]) -> int:
    command, *args = argv
    if command == "concurrent":
        location, worker, ops, seed, sync_dir = args
        return concurrent(location, int(worker), int(ops), int(seed), sync_dir)
    if command == "concurrent-forked":
        location, writers, ops, seed, sync_dir = args
        return concurrent_forked(location, int(writers), int(ops), int(seed), sync_dir)
    if command == "zygote":
        return zygote(*args)
    if command == "nopickle":
        return nopickle(*args)
    if command == "guardcheck":
        return guardcheck()
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
