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
    db_connect_timeout = 5             # the network bounds (aot.cache.timeouts), in
    db_statement_timeout = 30          # seconds; each key is its environment variable
    blob_connect_timeout = 5           # lowercased without AOT_ (AOT_BLOB_READ_TIMEOUT
    blob_read_timeout = 10             # beats blob_read_timeout)
    blob_retries = 3                   # attempts of one S3 request
    stats_exit_timeout = 5             # the last statistics flush
    worker_stopped_timeout = 10        # a stopped warm-up worker is killed

Relative paths in the file are relative to the file's folder. Unknown keys are errors
(a typo must not silently fall back to a default), and so is a bound that is not a
number of seconds (or, for ``blob_retries``, a whole count). The library itself
(``aot.Cache()``, ``aot.load()``) reads only the environment (or its ``timeouts=``
argument): the file configures the command line, which opens its caches with
:meth:`Settings.timeouts`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aot.cache import timeouts as bounds
from aot.cache.timeouts import Timeouts  # annotations: `bounds` is also a field name below
from aot.cache.storage.locations import is_url
from aot.errors import CacheError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "CONFIG_FILE",
    "ENVIRONMENT",
    "TIMEOUT_KEYS",
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
#: The :class:`~aot.cache.timeouts.Timeouts` field of each bound's key (its environment
#: variable's name, lowercased, without ``AOT_``: ``blob_read_timeout``).
TIMEOUT_KEYS = {
    variable.removeprefix("AOT_").lower(): field for field, variable in bounds.ENVIRONMENT.items()
}


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
        if is_url(self.value):
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
    #: The network bounds, one per key of :data:`TIMEOUT_KEYS` (values as given).
    bounds: tuple[Setting, ...] = ()

    def all(self) -> tuple[Setting, ...]:
        return (self.cache, self.blobs, self.local, self.signing_key_file, self.manifest)

    def timeouts(self) -> Timeouts:
        """The bounds the command line opens its caches with; a malformed environment
        variable is a :class:`CacheError` naming it (the file's were checked when read)."""
        values: dict[str, Any] = {}
        for setting in self.bounds:
            field = TIMEOUT_KEYS[setting.name]
            variable = bounds.ENVIRONMENT[field]
            values[field] = bounds.check_bound(
                field, setting.value, f"{variable}={setting.value!r}",
                f"{variable}={bounds.DEFAULTS_TEXT[field]}",
            )
        return bounds.Timeouts(**values)

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
            "timeouts": {s.name: {"value": _number(s.value), "source": s.source} for s in self.bounds},
        }


def _number(value: str | None) -> float | int | str | None:
    """A bound's value for JSON: a number when it is one (a malformed one as given)."""
    try:
        number = float(value) if value is not None else None
    except ValueError:
        return value
    return int(number) if number is not None and number.is_integer() else number


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


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``[tool.aot]`` table of ``path``: known keys, paths made absolute, bounds
    checked (numbers)."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))["tool"]["aot"]
    except tomllib.TOMLDecodeError as exc:
        raise CacheError(f"{path}: invalid TOML: {exc}") from None
    if not isinstance(table, dict):
        raise CacheError(f"{path}: [tool.aot] must be a table")
    known = set(_PATH_KEYS) | set(TIMEOUT_KEYS)
    unknown = sorted(set(table) - known)
    if unknown:
        raise CacheError(
            f"{path}: unknown key(s) {unknown} in [tool.aot]; expected some of {sorted(known)}"
        )
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key in TIMEOUT_KEYS:
            field = TIMEOUT_KEYS[key]
            bounds.check_bound(  # "10" is a string in TOML, not a number
                field, None if isinstance(value, str) else value, f"{path}: [tool.aot] {key} = {_toml(value)}",
                f"{key} = {bounds.DEFAULTS_TEXT[field]}",
            )
            out[key] = value  # as written (5, not 5.0), for display
            continue
        if not isinstance(value, str) or not value:
            raise CacheError(f"{path}: [tool.aot] {key} must be a non-empty string, got {value!r}")
        if not is_url(value):
            value = str((path.parent / Path(value).expanduser()).resolve())
        out[key] = value
    return out


def _toml(value: Any) -> str:
    """A value as TOML shows it (``"10s"``, ``true``, ``5``)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


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
        bounds=tuple(_bound(key, environ, config, where) for key in TIMEOUT_KEYS),
    )


def _bound(key: str, environ: Mapping[str, str], config: Mapping[str, Any], where: str) -> Setting:
    """One network bound: its environment variable, else the file, else the default."""
    field = TIMEOUT_KEYS[key]
    variable = bounds.ENVIRONMENT[field]
    if environ.get(variable, "").strip():
        return Setting(key, environ[variable].strip(), f"environment {variable}")
    if key in config:
        return Setting(key, str(config[key]), where)
    return Setting(key, bounds.DEFAULTS_TEXT[field], "default")
