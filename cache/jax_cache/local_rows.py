"""The local tier's own rows of JAX-keyed entries (``<local>/jit-rows/``).

A warm start from the local tier reads these instead of the remote index, so it needs
neither SQLAlchemy, nor a database connection, nor the object store's client. A row
only says which blob to read: the blob is served after its digest (and size) was
checked, and under the cache's signing key only when the row's HMAC is valid. JAX's
key is derived from the program (its HLO, the compile options, the backend and JAX's
versions), so a row whose verified blob is found is a compile of that same program,
whatever the remote index holds now.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from aot.cache.index.jit_records import JitEntry

log = logging.getLogger(__name__)

__all__ = ["ROWS", "LocalRows"]

#: The folder of rows inside the local tier (blobs live in ``ab/<digest>.zst`` beside it).
ROWS = "jit-rows"
_FIELDS = ("key", "name", "digest", "size", "stored_size", "compile_seconds", "platform", "signature")


class LocalRows:
    """One small JSON file per JAX key; written atomically, read without any index."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser() / ROWS

    def _path(self, key: str) -> Path:
        return self.root / (hashlib.sha256(key.encode()).hexdigest() + ".json")

    def get(self, key: str) -> JitEntry | None:
        """The row of ``key`` (None: none, or unreadable: then the remote is asked)."""
        try:
            data = json.loads(self._path(key).read_bytes())
            if not isinstance(data, dict) or data.get("key") != key:
                return None
            return JitEntry(**{f: data[f] for f in _FIELDS})
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as e:
            log.debug("jax-aot cache: local row of %s is unreadable (%s); asking the remote", key, e)
            return None

    def put(self, entry: JitEntry) -> None:
        """Keeps ``entry``'s row (its blob must be in the local tier already)."""
        data = {f: getattr(entry, f) for f in _FIELDS}
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".row-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self._path(entry.key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def drop(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
