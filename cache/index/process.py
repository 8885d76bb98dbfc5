"""A new folder cache's SQL index, opened in a helper process: the first ``aot warmup``
into a folder stores its entries without importing SQLAlchemy.

A new cache needs its index at once (the schema is created when the cache opens), and
importing SQLAlchemy, mapping the tables and creating the schema cost 0.3-0.4 s of one
core (benchmarks/README.md), on the warm-up's main thread, its critical path: that
thread imports JAX, lowers each entry, exports and stores it while XLA compiles in a
thread. So ``aot warmup`` into a folder without an index starts this helper first,
before it imports JAX itself (one core, for more than a second): the helper creates
the index on the other core meanwhile, then runs the cache's index writes (``lease``,
``add``, ``release``) one at a time, as they come. It is the same
:class:`~aot.cache.index.sql.Index`, with the same transactions and the same gc protocol,
in another process; the cache still writes the blobs before the row that names them,
and reads the index through the standard library (:mod:`aot.cache.index.reader`).

An existing cache does not start one: its reads need no SQLAlchemy, and a fully cached
warm-up writes nothing (the helper would only cost a process). Its first write loads
SQLAlchemy in the warm-up's own process, as any write does.

Should the helper fail to start, or die, the cache opens the index in its own process
and goes on. A call that was running when the helper died is made again there; each
call is one transaction, so it committed or it did not, and a retried ``add`` finds its
lease gone, so the writer starts over (:class:`~aot.cache.index.leases.LeaseLostError`) and
finds the row already stored.

Nothing here imports SQLAlchemy or JAX in the parent. Calls and results cross the pipe
pickled, between two processes of one warm-up (nothing stored is read this way).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aot.cache.index.entry import INDEX_FILE
from aot.errors import CacheError

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

log = logging.getLogger(__name__)

__all__ = ["IndexProcess"]

_READY_SECONDS = 60.0  # a helper that has not opened the index by then is given up
_CLOSE_SECONDS = 5.0
#: Test hook: the helper exits (as if killed) when this many calls have come in.
_EXIT_AFTER_ENV = "AOT_TEST_INDEX_PROCESS_EXIT_AFTER"


class IndexProcess:
    """The parent's handle on the helper, and the cache's index while attached: any
    method of :class:`~aot.cache.index.sql.Index` is called in the helper."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        """Starts the helper for the index of the cache folder ``folder`` (created if
        missing); it says when the index is open."""
        self._folder = Path(folder)
        self._lock = threading.Lock()  # one call at a time on the pipe
        self._local: Any = None  # the index opened here once the helper is gone
        self._ready: bool | None = None  # None: not heard from yet
        import multiprocessing  # only now: an existing cache starts no helper

        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        level = logging.getLogger("aot").getEffectiveLevel()
        self._process = context.Process(
            target=_helper_main, args=(child_conn, str(self._folder), level, os.getpid()),
            name="aot-index", daemon=True,
        )
        self._process.start()
        child_conn.close()

    @classmethod
    def for_new_cache(cls, folder: str | os.PathLike[str]) -> IndexProcess | None:
        """A helper for the cache folder ``folder`` when it has no index yet, else None."""
        path = Path(folder).expanduser()
        if (path / INDEX_FILE).exists():
            return None
        return cls(path)

    def wait_ready(self, timeout: float = _READY_SECONDS) -> bool:
        """True once the helper has the index open; False (and the helper is stopped)
        when it could not open it: the cache then opens it here and reports why."""
        if self._ready is None:
            try:
                if not self._conn.poll(timeout):
                    raise EOFError("no answer")
                kind, value = self._conn.recv()
            except (EOFError, OSError) as exc:
                kind, value = "failed", f"{type(exc).__name__}: {exc}"
            self._ready = kind == "ready"
            if not self._ready:
                log.debug("index helper did not start (%s); opening the index here", value)
                self._stop()
        return self._ready

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, args, kwargs)

        return call

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._lock:
            if self._local is None and self.wait_ready():
                try:
                    self._conn.send((name, args, kwargs))
                    kind, value = self._conn.recv()
                except (EOFError, OSError):
                    self._stop()
                    log.warning(
                        "the cache index's helper process %s ended (exit code %s) during %s; "
                        "opening the index in this process and going on",
                        self._process.pid, self._process.exitcode, name,
                    )
                else:
                    if kind == "error":
                        raise value
                    return value
            if self._local is None:
                self._local = self._open_here()
            local = self._local
        return getattr(local, name)(*args, **kwargs)

    def _open_here(self) -> Any:
        from aot.cache.index.sql import Index

        return Index.for_folder(self._folder)

    def close(self) -> None:
        """Closes the index (committed work stays) and ends the helper."""
        with self._lock:
            if self._local is not None:
                self._local.close()
            elif self._process.is_alive():
                try:
                    self._conn.send(None)
                    self._conn.recv()  # the index is closed
                except (EOFError, OSError):
                    pass
            self._stop()

    def _stop(self) -> None:
        self._process.join(timeout=_CLOSE_SECONDS)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=_CLOSE_SECONDS)
        if not self._conn.closed:
            self._conn.close()

    def __repr__(self) -> str:
        where = "here" if self._local is not None else f"in process {self._process.pid}"
        return f"IndexProcess({str(self._folder)!r}, {where})"


# ---------------------------------------------------------------- in the helper


def _helper_main(conn: Connection, folder: str, log_level: int, parent_pid: int) -> None:
    from aot.cache.warmup.workers import exit_with_parent

    exit_with_parent(parent_pid)
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        from aot.cache.index.sql import Index

        Path(folder).mkdir(parents=True, exist_ok=True)
        index = Index.for_folder(folder)
    except BaseException as exc:  # noqa: BLE001 - the parent opens it and reports
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    exit_after = int(os.environ.get(_EXIT_AFTER_ENV, "0") or 0)
    calls = 0
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            index.close()
            os._exit(0)  # the parent is gone
        if message is None:
            index.close()
            conn.send(("closed", None))
            # Everything is committed and closed: the interpreter's teardown (about
            # 0.1 s with SQLAlchemy loaded) would only keep the parent waiting.
            logging.shutdown()
            os._exit(0)
        calls += 1
        if calls == exit_after:
            os._exit(1)
        name, args, kwargs = message
        try:
            reply: tuple[str, Any] = ("ok", getattr(index, name)(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - raised again in the parent
            reply = ("error", exc)
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - a result or error that does not pickle
            conn.send(("error", CacheError(f"the cache index's {name} failed: {exc!r}")))
