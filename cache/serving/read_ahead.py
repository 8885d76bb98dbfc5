"""``aot.load``'s read-ahead: XLA starts on the executables of a folder cache while
``aot.load`` imports what serving needs and opens the cache.

A fresh serving process spends about 25 ms importing aot's serving modules, and a few
more opening the cache and filing its rows, before it reaches XLA's deserialization,
which for a real program is the longest step and runs without the GIL. So an eager
``aot.load(name, "/folder")`` first guesses, with :mod:`sqlite3` alone, the executables
the load will deserialize: for each signature of ``name`` stored for this process's
environment fingerprint (computed as the load computes it), the key its ref names, else
its newest intact row. It reads each executable with the same verifying inflation as
the load's :class:`ContentStore` (:func:`aot.cache.storage.frames.inflate`), then hands
bytes whose sha256 matched to XLA in one thread (:mod:`aot.ahead`), and returns to the
load, which imports and checks meanwhile.

Only a guess: the load still selects, reads and verifies every row, checks its manifest,
signatures and environment, and only then takes an executable deserialized ahead from
the digest it verified itself, onto the same devices (:func:`aot.ahead.take`). A wrong
guess costs a deserialization that is dropped when ``aot.load`` returns; any failure
here is logged at debug level and leaves the load to do everything itself.

An open folder :class:`Cache` is read ahead too (the imports are done, but dispatching,
filing and reading still are). Not read ahead: a lazy or background load (they return
before deserializing), a release (its members are not the refs), a database, a cache
with a local tier or with its blobs elsewhere, a signed cache (a signing key given or in
``AOT_SIGNING_KEY``: the guess does not check signatures, and bytes whose signature was
not checked never reach XLA), a name with more than :data:`MAX_AHEAD` signatures here
(loaded in parallel anyway), executables with host callbacks (bound at load time).
``AOT_READ_AHEAD=0`` turns it off.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aot import ahead
from aot.environment import environment_digest, environment_parts
from aot.jaxcompat.deserialize import ensure_custom_call_targets
from aot.libtpu_log import deserialize_quietly
from aot.shardings import device_list, live_devices

from aot.cache.index.read_only import served_manifests
from aot.cache.storage.frames import blob_path, inflate

log = logging.getLogger(__name__)

#: ``0``/``off``/``false``/``no``: ``aot.load`` never reads ahead.
READ_AHEAD_ENV = "AOT_READ_AHEAD"
#: Executables read ahead by one load; a name with more signatures is not read ahead.
MAX_AHEAD = 8

# Not imported: this runs first, and those modules are slow to import (tests check them).
INDEX_FILE = "index.sqlite"  # aot.cache.index.entry.INDEX_FILE
BLOB_FOLDER = "blobs"  # aot.cache.cache: a folder cache's blobs
SIGNING_KEY_ENV = "AOT_SIGNING_KEY"  # aot.signing.SIGNING_KEY_ENV


class ReadAhead:
    """The thread of one ``aot.load``; :meth:`close` drops what the load did not take."""

    def __init__(self, name: str, devices: dict[int, Any], jobs: dict[ahead.Job, bytes]) -> None:
        self.name = name
        self._devices = devices
        self._jobs = jobs  # the jobs this reader planned -> their verified bytes
        self._closed = False
        # Not a daemon: an interpreter exiting right after a wrong guess waits for XLA to finish it.
        self._thread = threading.Thread(target=self._run, name=f"aot-read-ahead {name}", daemon=False)

    def close(self) -> None:
        """Drops every executable the load did not take (a running one when it ends)."""
        self._closed = True
        ahead.forget(list(self._jobs))

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        # Nothing but XLA here: the bytes were read and verified by the caller, so this
        # thread needs the interpreter only briefly while the load imports at full speed.
        for j, data in self._jobs.items():
            if self._closed or not ahead.begin(j):
                continue
            result = None
            try:
                ids = j[1]
                device = self._devices[ids[0]]
                ensure_custom_call_targets(device.platform, data)
                result = deserialize_quietly(device.client, data, device_list(ids, self._devices))
            except Exception as exc:  # noqa: BLE001 - the load meets it again and says why
                log.debug("aot.load(%r): %s not deserialized ahead: %s", self.name, j[0][:12], exc)
            finally:
                ahead.finish(j, result)


@contextmanager
def reading_ahead(name: str, location: Any, *, lazy: bool, background: bool, release: str | None) -> Iterator[None]:
    """Reads ahead (:func:`start`) while the body runs; drops what it did not take."""
    reader = start(name, location, lazy=lazy, background=background, release=release)
    try:
        yield
    finally:
        if reader is not None:
            reader.close()


def start(name: str, location: Any, *, lazy: bool, background: bool, release: str | None) -> ReadAhead | None:
    """Starts reading ahead for an eager ``aot.load(name, location)`` of a folder cache
    (see the module docstring); None when it does not apply or anything fails."""
    if lazy or background or release is not None:
        return None
    if os.environ.get(READ_AHEAD_ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return None
    if os.environ.get(SIGNING_KEY_ENV):
        return None  # the guess cannot check signatures: unsigned bytes never reach XLA
    if location is None:
        location = os.environ.get("AOT_CACHE") or None  # the default folder needs platformdirs
    elif not isinstance(location, (str, os.PathLike)):
        location = _open_folder(location)
    if not isinstance(location, (str, os.PathLike)):
        return None
    text = os.fspath(location)
    if not isinstance(text, str) or "://" in text:
        return None
    folder = Path(text).expanduser()
    try:
        return _start(name, folder)
    except Exception as exc:  # noqa: BLE001 - a guess: the load does it all itself
        log.debug("aot.load(%r): no read-ahead (%s: %s)", name, type(exc).__name__, exc)
        return None


def _open_folder(cache: Any) -> str | None:
    """The folder of an open folder :class:`Cache` whose blobs are in its own folder."""
    from aot.cache.store import ArtifactStore  # imported already by whoever opened ``cache``

    if not isinstance(cache, ArtifactStore) or cache.local is not None or cache.blob_location is not None or "://" in cache.location:
        return None
    if cache.signing_key is not None or cache.require_signatures:
        return None
    return cache.location


def _start(name: str, folder: Path) -> ReadAhead | None:
    index_file = folder / INDEX_FILE
    if not index_file.is_file():
        return None
    # The digest the load computes (aot.fingerprint.environment_fingerprint), without
    # its value objects or the per-host record it writes: both come with the load.
    executables = guess(index_file, name, environment_digest(environment_parts()))
    if not executables:
        return None
    devices = live_devices()
    if any(i not in devices for _, _, ids in executables for i in ids):
        return None
    backend = devices[executables[0][2][0]].client
    if any(devices[ids[0]].client is not backend for _, _, ids in executables):
        return None
    # Read and verified here: every blob matches its digest before XLA is asked.
    present = {}
    for digest, size, ids in executables:
        data = read_verified(folder / BLOB_FOLDER, digest, size)
        if data is not None:
            present[ahead.job(digest, ids)] = data
    owned = ahead.plan(list(present), backend)
    if not owned:
        return None
    reader = ReadAhead(name, devices, {j: present[j] for j in owned})
    reader.start()
    return reader


def read_verified(blobs: Path, digest: str, size: int) -> bytes | None:
    """The blob ``digest`` of a folder store, inflated and checked against its digest and
    ``size`` as :meth:`ContentStore.get` checks it; None when absent or not intact (the
    load meets it again and says why)."""
    try:
        with open(blobs / blob_path(digest), "rb") as stored:
            problem, data = inflate(digest, stored, size, keep=True)
    except FileNotFoundError:
        return None
    return data if problem is None else None


def guess(index_file: Path, name: str, env_fp: str) -> list[tuple[str, int, tuple[int, ...]]]:
    """``(digest, size, device ids)`` of the executables an eager load of ``name`` is
    expected to deserialize in environment ``env_fp``; [] when there are more than
    :data:`MAX_AHEAD` or any row is not as expected."""
    manifests = served_manifests(index_file, name, env_fp, most=MAX_AHEAD)
    return [found for text in manifests if (found := _executable(text, env_fp)) is not None]


def _executable(manifest_text: str, env_fp: str) -> tuple[str, int, tuple[int, ...]] | None:
    manifest = json.loads(manifest_text)
    if manifest.get("host_callbacks") or manifest["environment"]["digest"] != env_fp:
        return None
    blob = manifest["blobs"]["executable"]
    ids = tuple(int(i) for i in manifest["device_ids"])
    return (str(blob["digest"]), int(blob["size"]), ids) if ids else None
