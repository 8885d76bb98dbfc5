"""The index's captured GPUs (``captured_targets``, schema 9), as a part of
:class:`~aot.cache.index.sql.Index`.

``aot target capture NAME`` on a GPU host records the GPU's target config, the CUDA
versions beside it and, when given, XLA's autotune results measured there; from then
``--target cuda:NAME`` compiles for exactly that GPU in every process that opens the
cache (:meth:`aot.Cache.use_targets` writes them, :mod:`aot.platforms.cuda` compiles with them). A capture
under a name already recorded replaces it (the fleet's GPUs changed): the entries
compiled for the old config keep their keys and stop matching the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from aot.platforms import cuda
from aot.cache.index.entry import as_utc, utcnow
from aot.cache.index.journal import TARGET, IndexJournal
from aot.cache.index.schema import CAPTURED_TARGETS

__all__ = ["CapturedTarget", "IndexTargets", "targets_folder", "write_targets"]


@dataclass(frozen=True, slots=True)
class CapturedTarget:
    """A GPU captured from a host of the fleet."""

    name: str
    platform: str
    config: str
    config_digest: str
    versions: str  # JSON object: runtime, driver, cudnn, cublas, nccl, plugin, jaxlib...
    device_kind: str
    host: str
    user: str
    autotune: str | None = None
    autotune_digest: str | None = None
    captured_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        object.__setattr__(self, "captured_at", as_utc(self.captured_at, "captured_at"))

    @property
    def version_map(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in json.loads(self.versions).items()}

    def to_dict(self, *, with_texts: bool = False) -> dict[str, Any]:
        """What ``aot target ls --json`` prints (the config and results themselves only
        when asked: ``aot target show``)."""
        data: dict[str, Any] = {
            "name": self.name, "target": f"{self.platform}:{self.name}", "device_kind": self.device_kind,
            "config_digest": self.config_digest, "versions": self.version_map,
            "autotune": "tuned" if self.autotune else "none", "autotune_digest": self.autotune_digest,
            "captured_at": self.captured_at.isoformat(), "host": self.host, "user": self.user,
        }
        if with_texts:
            data["config"] = self.config
            data["autotune_results"] = self.autotune
        return data


class IndexTargets(IndexJournal):
    """Reads and writes of ``captured_targets``."""

    def captured_targets(self) -> list[CapturedTarget]:
        with self._read("list captured targets") as conn:
            rows = conn.execute(sa.select(CAPTURED_TARGETS).order_by(CAPTURED_TARGETS.c.name)).all()
        return [CapturedTarget(**row._mapping) for row in rows]

    def captured_target(self, name: str) -> CapturedTarget | None:
        with self._read(f"look up captured target {name}") as conn:
            row = conn.execute(sa.select(CAPTURED_TARGETS).where(CAPTURED_TARGETS.c.name == name)).first()
        return CapturedTarget(**row._mapping) if row is not None else None

    def put_captured_target(self, target: CapturedTarget) -> None:
        """Records ``target``, replacing a capture of the same name."""
        row = {f: getattr(target, f) for f in CapturedTarget.__slots__}
        with self._write(f"record captured target {target.name}") as conn:
            conn.execute(sa.delete(CAPTURED_TARGETS).where(CAPTURED_TARGETS.c.name == target.name))
            conn.execute(sa.insert(CAPTURED_TARGETS).values(**row))
            self.forget_journal(conn, TARGET, [target.name])  # journaled anew (aot.cache.index.journal)
        self.journal_pending()


def targets_folder(location: object) -> Path:
    """The local folder of the captured GPUs of the cache at ``location`` (one per cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "jax-aot" / "targets" / hashlib.sha256(str(location).encode()).hexdigest()[:16]


def write_targets(index: IndexTargets, location: object) -> tuple[list[CapturedTarget], cuda.CapturedConfigs]:
    """Writes the captured GPUs of ``index`` to :func:`targets_folder`; returns them and
    the :class:`aot.platforms.cuda.CapturedConfigs` that compiles for exactly them (the
    cache hands it to the compiles and the warm-up workers; nothing here puts it in use)."""
    captured = index.captured_targets()
    folder = targets_folder(location)
    folder.mkdir(parents=True, exist_ok=True)
    wanted = set()
    for target in captured:
        path = cuda.captured_file(folder, target.name)
        wanted.add(path.name)
        body = json.dumps({"config": target.config, "versions": target.version_map, "autotune": target.autotune},
                          sort_keys=True)
        try:
            if path.read_text(encoding="utf-8") == body:
                continue
        except OSError:
            pass
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".target-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
        os.replace(tmp, path)
    for stale in folder.glob("*.json"):
        if stale.name not in wanted:
            stale.unlink(missing_ok=True)
    return captured, cuda.CapturedConfigs(folder)
