"""Command-line settings and where each came from: flags > environment > config > defaults.

The configuration file is the nearest ``pyproject.toml`` with a ``[tool.aot]`` table,
found from the working directory upwards::

    [tool.aot]
    cache = "./aot-cache"              # folder or SQLAlchemy URL (AOT_CACHE, --cache)
    blobs = "s3://bucket/aot"          # blob location (AOT_BLOBS, --blobs)
    local = "/var/cache/aot"           # a local read-through tier (AOT_LOCAL, --local)
    signing_key_file = "secrets/aot.key"   # HMAC key file (AOT_SIGNING_KEY_FILE;
                                       # AOT_SIGNING_KEY holds a key itself)
    manifest = "warmup.toml"           # default manifest of `aot warmup` (AOT_MANIFEST)

Relative paths in the file are relative to the file's folder. Unknown keys are errors
(a typo must not silently fall back to a default). The library itself
(``aot.Cache()``, ``aot.load()``) reads only the environment: the file configures the
command line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aot.errors import CacheError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "CONFIG_FILE",
    "ENVIRONMENT",
    "Setting",
    "Settings",
    "find_config",
    "read_config",
    "resolve_settings",
]

CONFIG_FILE = "pyproject.toml"
#: The environment variable of each setting.
ENVIRONMENT = {
    "cache": "AOT_CACHE",
    "blobs": "AOT_BLOBS",
    "local": "AOT_LOCAL",
    "signing_key_file": "AOT_SIGNING_KEY_FILE",
    "manifest": "AOT_MANIFEST",
}
SIGNING_KEY_ENV = "AOT_SIGNING_KEY"
#: The flag of each setting (signing_key_file and manifest have none: a manifest is
#: an argument of the commands that take one).
FLAGS = {"cache": "--cache", "blobs": "--blobs", "local": "--local"}
_PATH_KEYS = ("cache", "blobs", "local", "signing_key_file", "manifest")


def _is_url(value: str) -> bool:
    return "://" in value


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting's value (``None``: unset) and where it came from: ``flag --cache``,
    ``environment AOT_CACHE``, ``/repo/pyproject.toml [tool.aot]`` or ``default``."""

    name: str
    value: str | None
    source: str

    def shown(self) -> str:
        """The value for display (a signing key given in the environment is not shown)."""
        if self.value is None:
            return "-"
        if self.name == "signing_key_file" and self.source == f"environment {SIGNING_KEY_ENV}":
            return "(a key, not a file)"
        if _is_url(self.value):
            from aot.cache.index.advice import mask_url

            return mask_url(self.value)
        return self.value

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.shown() if self.value is not None else None, "source": self.source}


@dataclass(frozen=True, slots=True)
class Settings:
    cache: Setting
    blobs: Setting
    signing_key_file: Setting
    manifest: Setting
    config_file: str | None = None
    local: Setting = Setting("local", None, "default")

    def all(self) -> tuple[Setting, ...]:
        return (self.cache, self.blobs, self.local, self.signing_key_file, self.manifest)

    def signing_key(self) -> bytes | None:
        """The HMAC key: ``$AOT_SIGNING_KEY`` itself, or the bytes of the key file
        (one trailing newline stripped); ``None`` without either."""
        setting = self.signing_key_file
        if setting.value is None:
            return None
        if setting.source == f"environment {SIGNING_KEY_ENV}":
            return setting.value.encode()
        path = Path(setting.value).expanduser()
        try:
            key = path.read_bytes()
        except OSError as exc:
            raise CacheError(
                f"cannot read the signing key file {path} (from {setting.source}): "
                f"{exc.strerror or exc}"
            ) from None
        key = key[:-1] if key.endswith(b"\n") else key
        if not key:
            raise CacheError(f"the signing key file {path} (from {setting.source}) is empty")
        return key

    def to_dict(self) -> dict[str, Any]:
        return {
            "config_file": self.config_file,
            **{s.name: s.to_dict() for s in self.all()},
        }


def find_config(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The nearest ``pyproject.toml`` with a ``[tool.aot]`` table, from ``start`` (the
    working directory) upwards."""
    folder = Path(start or os.getcwd()).resolve()
    for candidate in (folder, *folder.parents):
        path = candidate / CONFIG_FILE
        if path.is_file():
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                continue  # not ours to judge; a project's own pyproject.toml
            if isinstance(data.get("tool"), dict) and "aot" in data["tool"]:
                return path
    return None


def read_config(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``[tool.aot]`` table of ``path``: known keys, paths made absolute."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))["tool"]["aot"]
    except tomllib.TOMLDecodeError as exc:
        raise CacheError(f"{path}: invalid TOML: {exc}") from None
    if not isinstance(table, dict):
        raise CacheError(f"{path}: [tool.aot] must be a table")
    known = set(_PATH_KEYS)
    unknown = sorted(set(table) - known)
    if unknown:
        raise CacheError(
            f"{path}: unknown key(s) {unknown} in [tool.aot]; expected some of {sorted(known)}"
        )
    out = {}
    for key, value in table.items():
        if not isinstance(value, str) or not value:
            raise CacheError(f"{path}: [tool.aot] {key} must be a non-empty string, got {value!r}")
        if not _is_url(value):
            value = str((path.parent / Path(value).expanduser()).resolve())
        out[key] = value
    return out


def resolve_settings(
    flags: Mapping[str, str | None] | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Settings:
    """Each setting from the first of: its flag, its environment variable, the config
    file, the default (the user cache folder for ``cache``; nothing for the others)."""
    flags = flags or {}
    environ = os.environ if environ is None else environ
    config_path = find_config(cwd)
    config = read_config(config_path) if config_path is not None else {}
    where = f"{config_path} [tool.aot]" if config_path is not None else ""

    def pick(name: str, default: str | None) -> Setting:
        value = flags.get(name)
        if value is not None:
            return Setting(name, value, f"flag {FLAGS.get(name, name)}")
        if name == "signing_key_file" and environ.get(SIGNING_KEY_ENV):
            return Setting(name, environ[SIGNING_KEY_ENV], f"environment {SIGNING_KEY_ENV}")
        if environ.get(ENVIRONMENT[name]):
            return Setting(name, environ[ENVIRONMENT[name]], f"environment {ENVIRONMENT[name]}")
        if name in config:
            return Setting(name, config[name], where)
        return Setting(name, default, "default")

    import platformdirs

    default_cache = platformdirs.user_cache_dir("jax-aot", appauthor=False)
    return Settings(
        cache=pick("cache", default_cache),
        blobs=pick("blobs", None),
        signing_key_file=pick("signing_key_file", None),
        manifest=pick("manifest", None),
        config_file=str(config_path) if config_path is not None else None,
        local=pick("local", None),
    )
