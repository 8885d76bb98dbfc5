"""A fleet's own GPUs in a cache: ``aot target capture`` and the configs compiles use.

:func:`capture_target` records a GPU (its target config, the CUDA versions beside it,
XLA's autotune results measured on it) in the index (:mod:`aot.cache.index.targets`).
:func:`aot.cache.index.targets.use_targets` hands them to the compiles.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from aot.platforms import cuda
from aot.cache.index.refs import current_user
from aot.cache.index.targets import CapturedTarget
from aot.errors import TargetCaptureError

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = ["capture_target"]


def _read(path: str | os.PathLike[str], what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TargetCaptureError(f"cannot read the {what} {path}: {exc}") from None


def capture_target(
    store: ArtifactStore, name: str, *, config_file: str | os.PathLike[str] | None = None,
    versions_file: str | os.PathLike[str] | None = None, autotune_file: str | os.PathLike[str] | None = None,
) -> CapturedTarget:
    """Records this host's GPU as ``name`` (``cuda:NAME``), or the config of
    ``config_file`` (written on a GPU host: ``--from-file``) with the versions of
    ``versions_file`` (JSON); ``autotune_file``: XLA's autotune results measured on it."""
    if not cuda.NAME_PATTERN.match(name):
        raise TargetCaptureError(f"a GPU's name is lower-case letters, digits, '-' and '_' (h200, fleet-a), got {name!r}")
    store.check_writable(f"record the captured target {name}")
    if config_file is not None:
        config = cuda.check_config(_read(config_file, "target config"), str(config_file))
        versions: dict[str, str] = {}
        if versions_file is not None:
            try:
                loaded = json.loads(_read(versions_file, "versions file"))
            except ValueError as exc:
                raise TargetCaptureError(f"the versions file {versions_file} is not JSON: {exc}") from None
            if not isinstance(loaded, dict):
                raise TargetCaptureError(f"the versions file {versions_file} is not a JSON object")
            versions = {str(k): str(v) for k, v in loaded.items()}
    else:
        from aot.device import accelerator_runtime, default_devices

        config, versions = cuda.capture_here(accelerator_runtime(), default_devices)
    autotune = None
    if autotune_file is not None:
        autotune = cuda.check_autotune(_read(autotune_file, "autotune results"), str(autotune_file))
    gpu = cuda.GpuConfig(name, config, "captured", tuple(sorted(versions.items())), autotune)
    record = CapturedTarget(
        name=name, platform=cuda.PLATFORM, config=config, config_digest=gpu.digest,
        versions=json.dumps(dict(sorted(versions.items()))), device_kind=gpu.device_kind() or "unknown",
        host=socket.gethostname(), user=current_user(), autotune=autotune, autotune_digest=gpu.autotune_digest,
    )
    store.index.put_captured_target(record)
    log.info("captured cuda:%s (%s, config %s)", name, record.device_kind, record.config_digest[:19])
    return record
