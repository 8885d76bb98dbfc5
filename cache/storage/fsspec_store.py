"""An :class:`~aot.cache.storage.objectstore.ObjectStore` on fsspec: S3, GCS, Azure, memory, file.

``FsspecObjectStore("s3://bucket/prefix")`` keeps each payload as one object under
``prefix/`` laid out by :func:`~aot.cache.storage.objectstore.blob_path` (``ab/<digest>.zst``),
so ``file://DIR`` and a folder store on ``DIR`` see the same blobs.

* Schemes: ``s3://`` (s3fs, ``pip install 'jax-aot[s3]'``), ``gs://`` (gcsfs,
  ``[gcs]``), ``az://`` (adlfs, ``[azure]``), ``memory://`` and ``file://`` (fsspec
  alone). Credentials and endpoints come from each cloud's standard configuration
  (for S3: the ``AWS_*`` variables, ``~/.aws`` files, instance roles, and
  ``AWS_ENDPOINT_URL``); they are never part of the location, a message or the index.
* Writes are all or nothing: an object PUT is atomic, a streamed upload is a multipart
  upload completed only after the last byte (aborted otherwise), and ``file://``
  writes a temp file, fsyncs it and renames it into place.
* Ages: ``modified`` is the object's LastModified (the store's clock), and ``now()``
  reads that same clock by writing a small marker object and reading its
  LastModified back (cached for a minute). ``touch`` copies an S3 object onto
  itself with new metadata, which refreshes LastModified; other clouds re-PUT it.
* Every error is a :class:`aot.errors.CacheError` with advice, via
  :func:`translate_error`.
"""

from __future__ import annotations

import datetime as _dt
import errno
import io
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urlsplit

from aot.errors import CacheError, ReadOnlyCacheError
from aot.cache.storage.objectstore import BlobStat, blob_path, check_digest, digest_from_path
from aot.cache.timeouts import Timeouts, timeouts

__all__ = [
    "SCHEMES", "FsspecObjectStore", "UrlTarget", "open_fsspec_store", "open_url",
    "translate_error",
]

log = logging.getLogger(__name__)

# scheme -> (fsspec protocol, the package that implements it, the extra that installs it)
_BACKENDS: dict[str, tuple[str, str, str]] = {
    "s3": ("s3", "s3fs", "s3"),
    "gs": ("gcs", "gcsfs", "gcs"),
    "gcs": ("gcs", "gcsfs", "gcs"),
    "az": ("az", "adlfs", "azure"),
    "abfs": ("az", "adlfs", "azure"),
    "memory": ("memory", "fsspec", "s3"),
    "file": ("file", "fsspec", "s3"),
}
SCHEMES = frozenset(_BACKENDS)
_STREAMING = {"s3", "gcs"}  # their files support autocommit=False + commit()/discard()
_CHUNK = 8 * 1024 * 1024
_BATCH = 32  # concurrent requests in a batched call
_CLOCK_TTL = 60.0  # seconds a reading of the store's clock is reused
_CLOCK_MARKER = ".aot-clock"
_TMP_SUFFIX = ".tmp"


def _utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _public_url(url: str) -> str:
    """``url`` without user info, query or fragment (never a credential in a message)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


# ---------------------------------------------------------------- errors


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _error_code(exc: BaseException) -> str | None:
    """The cloud's error code (``NoSuchBucket``, ``AccessDenied``, ...) anywhere in the chain."""
    for e in _causes(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = (response.get("Error") or {}).get("Code")
            if code:
                return str(code)
    return None


def _endpoint() -> str:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(name):
            return f"{_public_url(os.environ[name])} (from {name})"
    return "the default endpoint"


_NO_CREDENTIALS = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with ~/.aws/credentials, "
          "or run where an instance role applies",
    "gcs": "set GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth application-default login`",
    "az": "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with a key or an "
          "Azure identity",
}


def translate_error(exc: BaseException, action: str, location: str, protocol: str = "") -> CacheError:
    """One translation of fsspec, botocore and OS errors into a CacheError with advice.

    ``action`` says what was being done ("read blob ab12..."), ``location`` where (no
    credentials). The message never quotes a credential: only error classes, cloud
    error codes and the endpoint's public URL.
    """
    if isinstance(exc, CacheError):
        return exc
    code = _error_code(exc)
    names = {type(e).__name__ for e in _causes(exc)}
    where = f"cannot {action} at {location}"
    if names & {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError",
                "ClientAuthenticationError", "CredentialUnavailableError"}:
        advice = _NO_CREDENTIALS.get(protocol, "configure the cloud's credentials")
        return CacheError(f"{where}: no credentials were found; {advice}")
    if code in {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                "AuthFailure", "AuthorizationHeaderMalformed"}:
        return CacheError(
            f"{where}: the credentials were refused ({code}); check AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY (or the profile in use) and that they belong to this endpoint"
        )
    if code == "403":  # a HEAD request's answer has no body, so no error code
        return CacheError(
            f"{where}: access denied (HTTP 403): the credentials in use are refused or lack "
            "permission; check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or the profile) and "
            "the permissions on the prefix, or open the cache read-only"
        )
    if code in {"AccessDenied", "AllAccessDisabled", "Forbidden", "AuthorizationFailure"} or (
        isinstance(exc, PermissionError) and protocol != "file"
    ):
        return CacheError(
            f"{where}: access denied{f' ({code})' if code else ''}; the credentials in use lack "
            "permission (read, write, list and delete on the prefix are needed), or open the "
            "cache read-only"
        )
    if code in {"NoSuchBucket", "ContainerNotFound", "NoSuchContainer"}:
        return CacheError(
            f"{where}: no such bucket{f' ({code})' if code else ''}; create it first, or fix "
            "the bucket name in the URL"
        )
    if names & {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                "ClientConnectorError", "ServerDisconnectedError", "ClientOSError",
                "ConnectionClosedError", "ServiceRequestError", "TimeoutError",
                "ConnectionRefusedError", "ConnectionResetError"} or isinstance(exc, ConnectionError):
        endpoint = _endpoint() if protocol == "s3" else "the service"
        return CacheError(
            f"{where}: the object store did not answer ({type(exc).__name__}) at {endpoint}; "
            "check the network, or the endpoint (AWS_ENDPOINT_URL for S3-compatible servers)"
        )
    if isinstance(exc, ModuleNotFoundError):
        return CacheError(f"{where}: {exc}")
    if isinstance(exc, OSError) and exc.errno is not None:
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            advice = "free space (e.g. `aot gc --max-size ...`) or move the blobs"
        elif exc.errno in (errno.EACCES, errno.EPERM):
            advice = "fix the permissions of the folder, or open the cache read-only"
        elif exc.errno == errno.EROFS:
            advice = "the file system is read-only: open the cache read-only"
        else:
            advice = "check the blob location"
        return CacheError(f"{where}: {reason} [errno {exc.errno}]; {advice}")
    detail = f" ({code})" if code else ""
    text = str(exc).strip().splitlines()
    return CacheError(
        f"{where}: {type(exc).__name__}{detail}: {text[0] if text else ''}; check the blob "
        "location and the object store's status"
    )


# ---------------------------------------------------------------- opening a URL


@dataclass(frozen=True, slots=True)
class UrlTarget:
    """An fsspec filesystem and the path a URL names in it (no credentials anywhere)."""

    fs: Any
    protocol: str  # fsspec's: s3, gcs, az, memory, file
    path: str  # the URL's bucket/key (or absolute folder) without the scheme
    location: str  # the URL for messages: scheme://bucket/key, no user info or query


def _default_options(protocol: str, given: Timeouts | None = None) -> dict[str, Any]:
    if protocol == "file":
        return {"auto_mkdir": True}
    options: dict[str, Any] = {"use_listings_cache": False}
    if protocol == "s3":
        # Bounded waits (botocore's own are 60 s each) and botocore's standard retry
        # mode, so a frozen or unreachable endpoint fails in seconds, not after the
        # legacy mode's long backoff.
        bounds = given if given is not None else timeouts()
        options["config_kwargs"] = {
            "connect_timeout": bounds.blob_connect_s,
            "read_timeout": bounds.blob_read_s,
            # total_max_attempts counts the first try (botocore's max_attempts does not).
            "retries": {"total_max_attempts": bounds.blob_retries, "mode": "standard"},
        }
    return options


def open_url(
    url: str, storage_options: Mapping[str, Any] | None = None, timeouts: Timeouts | None = None,
) -> UrlTarget:
    """The filesystem for an object-store URL (``s3://``, ``gs://``, ``az://``,
    ``memory://``, ``file://``); an unknown scheme is refused, never taken as a path.
    ``timeouts`` bound an S3 store's waits (None: the environment's)."""
    url = os.fspath(url)
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""  # never a drive letter
    if scheme not in _BACKENDS:
        raise CacheError(
            f"unsupported object-store URL {_public_url(url) if scheme else url!r}: expected "
            f"one of {', '.join(sorted(s + '://' for s in SCHEMES))}"
        )
    protocol, package, extra = _BACKENDS[scheme]
    location = _public_url(url).rstrip("/")
    try:
        import fsspec

        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        raise CacheError(
            f"cannot open {location}: {scheme}:// needs the {package} package; "
            f"install it with `pip install 'jax-aot[{extra}]'`"
        ) from exc
    options = _default_options(protocol, timeouts)
    options.update(storage_options or {})
    try:
        # Each caller owns its filesystem object: fsspec's instance cache would hand
        # back one built with other credentials or another endpoint.
        fs = cls(skip_instance_cache=True, **options)
    except Exception as exc:  # noqa: BLE001 - any library error becomes a CacheError
        raise translate_error(exc, "open the object store", location, protocol) from exc
    if protocol == "s3":
        # botocore retries (AOT_BLOB_RETRIES attempts); s3fs's own loop on top of it
        # would multiply the wait on a frozen endpoint: one request waits at most
        # AOT_BLOB_READ_TIMEOUT x AOT_BLOB_RETRIES plus botocore's backoff.
        fs.retries = 1
    path = cls._strip_protocol(url).rstrip("/")
    if protocol == "file":
        path = os.path.abspath(os.path.expanduser(path))
        location = "file://" + path
    if not path.strip("/"):
        raise CacheError(f"{url!r} names no bucket or folder; expected e.g. s3://bucket/prefix")
    return UrlTarget(fs, protocol, path, location)


# ---------------------------------------------------------------- the store


def _to_utc(value: Any) -> _dt.datetime | None:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.astimezone(_dt.timezone.utc)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _dt.datetime.fromtimestamp(float(value), _dt.timezone.utc)
    if isinstance(value, str):
        try:
            return _to_utc(_dt.datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


# The keys different fsspec implementations use for an object's last write time.
_MTIME_KEYS = ("LastModified", "last_modified", "mtime", "updated", "created", "timeCreated")


class FsspecObjectStore:
    """Raw payloads as objects under a URL's prefix; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        read_only: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        timeouts: Timeouts | None = None,
    ) -> None:
        self.read_only = read_only
        target = open_url(url, storage_options, timeouts)
        self._fs, self.protocol, self._root, self._location = (
            target.fs, target.protocol, target.path, target.location
        )
        self._clock: tuple[_dt.datetime, float] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"FsspecObjectStore({self._location!r}, read_only={self.read_only})"

    @property
    def location(self) -> str:
        return self._location

    # -- helpers ---------------------------------------------------------------------

    def _path(self, digest: str) -> str:
        return f"{self._root}/{blob_path(digest)}"

    def _fail(self, exc: BaseException, action: str) -> CacheError:
        return translate_error(exc, action, self._location, self.protocol)

    def _check_writable(self, action: str) -> None:
        if self.read_only:
            raise ReadOnlyCacheError(
                f"cannot {action} at {self._location}: the blob store is opened read-only"
            )

    def _batch(self, method: str, paths: list[str]) -> list[Any]:
        """``fs.method(path)`` for each path, concurrently on async filesystems; each
        result is the value or the exception raised."""
        if not paths:
            return []
        if getattr(self._fs, "async_impl", False):
            from fsspec.asyn import _run_coros_in_chunks, sync

            coros = [getattr(self._fs, "_" + method)(p) for p in paths]
            return sync(
                self._fs.loop, _run_coros_in_chunks, coros, batch_size=_BATCH, return_exceptions=True
            )
        results: list[Any] = []
        for path in paths:
            try:
                results.append(getattr(self._fs, method)(path))
            except Exception as exc:  # noqa: BLE001 - sorted out by the caller
                results.append(exc)
        return results

    def _modified(self, info: Mapping[str, Any]) -> _dt.datetime:
        for key in _MTIME_KEYS:
            when = _to_utc(info.get(key))
            if when is not None:
                return when
        return self.now()  # unknown age: too young to delete

    def _missing(self, exc: BaseException) -> bool:
        """True for "no such object"; a missing bucket is an error, never "absent"."""
        if not isinstance(exc, FileNotFoundError):
            return False
        return _error_code(exc) not in {"NoSuchBucket", "ContainerNotFound", "NoSuchContainer"}

    def _infos(self, digests: Iterable[str], action: str) -> dict[str, Mapping[str, Any]]:
        wanted = sorted({check_digest(d) for d in digests})
        found: dict[str, Mapping[str, Any]] = {}
        for digest, result in zip(wanted, self._batch("info", [self._path(d) for d in wanted])):
            if isinstance(result, BaseException):
                if self._missing(result):
                    continue
                raise self._fail(result, f"{action} blob {digest[:16]}") from result
            if result.get("type", "file") == "file":
                found[digest] = result
        return found

    # -- reads -----------------------------------------------------------------------

    def read(self, digest: str) -> bytes | None:
        path = self._path(digest)
        try:
            if self.protocol == "s3":
                # One GET: with concurrency s3fs first HEADs every object for its size.
                return bytes(self._fs.cat_file(path, max_concurrency=1))
            return bytes(self._fs.cat_file(path))
        except Exception as exc:  # noqa: BLE001
            if self._missing(exc) or isinstance(exc, IsADirectoryError):
                return None
            raise self._fail(exc, f"read blob {digest[:16]}") from exc

    def read_stream(self, digest: str) -> IO[bytes] | None:
        """The payload as a file to stream (the caller closes it), or None. A local
        file is streamed; a remote object is still one GET (a streamed read would
        first HEAD it), kept in memory as stored."""
        if self.protocol != "file":
            payload = self.read(digest)
            return io.BytesIO(payload) if payload is not None else None
        path = self._path(digest)
        try:
            return self._fs.open(path, "rb")  # type: ignore[no-any-return]
        except Exception as exc:  # noqa: BLE001
            if self._missing(exc) or isinstance(exc, IsADirectoryError):
                return None
            raise self._fail(exc, f"read blob {digest[:16]}") from exc

    def exists(self, digests: Iterable[str]) -> set[str]:
        return set(self._infos(digests, "look up"))

    def stat(self, digests: Iterable[str]) -> dict[str, BlobStat]:
        return {
            d: BlobStat(d, int(info.get("size") or 0), self._modified(info))
            for d, info in self._infos(digests, "stat").items()
        }

    def list(self) -> Iterator[BlobStat]:
        try:
            found = self._fs.find(self._root, detail=True)
        except Exception as exc:  # noqa: BLE001
            if self._missing(exc):
                return
            raise self._fail(exc, "list blobs") from exc
        prefix = self._root + "/"
        for path in sorted(found):
            info = found[path]
            name = str(info.get("name", path))
            if not name.startswith(prefix) or info.get("type", "file") != "file":
                continue
            digest = digest_from_path(name[len(prefix):])
            if digest is not None:
                yield BlobStat(digest, int(info.get("size") or 0), self._modified(info))

    # -- writes ----------------------------------------------------------------------

    def write(self, digest: str, payload: bytes | bytearray | memoryview | IO[bytes]) -> None:
        """Publishes ``payload`` (bytes, or a binary file object read to its end) under
        ``digest``, all or nothing; overwrites."""
        path = self._path(digest)
        self._check_writable(f"write blob {digest[:16]}")
        action = f"write blob {digest[:16]}"
        streaming = hasattr(payload, "read")
        try:
            if self.protocol == "file":
                self._write_local(path, payload)
            elif streaming and self.protocol in _STREAMING:
                self._write_stream(path, payload)  # type: ignore[arg-type]
            else:
                data = _read_all(payload) if streaming else bytes(payload)  # type: ignore[arg-type]
                self._fs.pipe_file(path, data)
        except Exception as exc:
            if _from_source(exc):
                raise
            raise self._fail(exc, action) from exc

    def _write_stream(self, path: str, source: IO[bytes]) -> None:
        # A multipart (S3) or resumable (GCS) upload, completed by commit() only after
        # the last byte: until then nothing exists under the final name.
        target = self._fs.open(path, "wb", autocommit=False, block_size=max(_CHUNK, 5 * 2**20))
        try:
            _copy(source, target.write)
            target.close()
            target.commit()
        except BaseException:
            try:
                target.discard()
            except Exception:  # noqa: BLE001 - the original error matters more
                log.debug("could not abort the upload of %s", path, exc_info=True)
            target.closed = True  # else its finaliser would try to upload the rest
            raise

    def _write_local(self, path: str, payload: Any) -> None:
        """Temp file in the same folder, fsync, rename: the folder store's protocol and
        temp-file naming (``.<name>.<pid>.<hex>.tmp``), so its cleanup finds leftovers."""
        folder, name = os.path.split(path)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o644)
        try:
            with os.fdopen(fd, "wb") as out:
                if hasattr(payload, "read"):
                    _copy(payload, out.write)
                else:
                    out.write(payload)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o444)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        try:
            dir_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return
        try:
            os.fsync(dir_fd)
        except OSError:
            pass
        finally:
            os.close(dir_fd)

    def delete(self, digests: Iterable[str]) -> int:
        self._check_writable("delete blobs")
        infos = self._infos(digests, "delete")
        if not infos:
            return 0
        paths = [self._path(d) for d in infos]
        try:
            self._fs.rm(paths)
        except Exception as exc:  # noqa: BLE001
            if not self._missing(exc):  # someone else deleted one first: fine
                raise self._fail(exc, f"delete {len(paths)} blobs") from exc
        log.debug("deleted %d blobs from %s", len(paths), self._location)
        return sum(int(info.get("size") or 0) for info in infos.values())

    def touch(self, digest: str) -> None:
        """Refreshes a stored payload's modified time; an absent digest is ignored."""
        path = self._path(digest)
        self._check_writable(f"touch blob {digest[:16]}")
        try:
            if self.protocol == "file":
                os.utime(path)
            elif self.protocol == "s3":
                bucket, key, _ = self._fs.split_path(path)
                self._fs.call_s3(
                    "copy_object", Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": key},
                    MetadataDirective="REPLACE", Metadata={"aot-touched": _utcnow().isoformat()},
                )
            else:
                data = self._fs.cat_file(path)
                self._fs.pipe_file(path, data)
        except Exception as exc:  # noqa: BLE001
            if self._missing(exc) or _error_code(exc) == "NoSuchKey":
                return
            raise self._fail(exc, f"touch blob {digest[:16]}") from exc

    # -- the clock -------------------------------------------------------------------

    def now(self) -> _dt.datetime:
        """The store's clock: read from a marker object's LastModified on a cloud store
        (cached for a minute); the local clock for ``memory://`` and ``file://``, whose
        times that same clock stamps, and for a read-only store (which never deletes)."""
        if self.protocol in ("memory", "file") or self.read_only:
            return _utcnow()
        if self._clock is not None:
            known, taken = self._clock
            elapsed = time.monotonic() - taken
            if elapsed < _CLOCK_TTL:
                return known + _dt.timedelta(seconds=elapsed)
        marker = f"{self._root}/{_CLOCK_MARKER}"
        taken = time.monotonic()
        try:
            self._fs.pipe_file(marker, b"jax-aot clock marker\n")
            info = self._fs.info(marker)
        except Exception as exc:  # noqa: BLE001
            raise self._fail(exc, "read the store's clock (write a marker object)") from exc
        stamp: _dt.datetime | None = None
        for key in _MTIME_KEYS:
            stamp = _to_utc(info.get(key))
            if stamp is not None:
                break
        if stamp is None:
            log.warning("%s reports no modified time; using the local clock", self._location)
            return _utcnow()
        self._clock = (stamp, taken)
        return stamp

    def close(self) -> None:
        self._closed = True



def _copy(source: IO[bytes], write: Callable[[bytes], Any]) -> None:
    while True:
        try:
            chunk = source.read(_CHUNK)
        except BaseException as exc:
            exc.__aot_from_source__ = True  # type: ignore[attr-defined]
            raise
        if not chunk:
            return
        write(chunk)


def _read_all(source: IO[bytes]) -> bytes:
    chunks: list[bytes] = []
    _copy(source, chunks.append)
    return b"".join(chunks)


def _from_source(exc: BaseException) -> bool:
    """An error raised by the caller's payload source propagates as it is."""
    return bool(getattr(exc, "__aot_from_source__", False))


def open_fsspec_store(
    url: str, *, read_only: bool = False, **storage_options: Any
) -> FsspecObjectStore:
    """The object store for ``url`` (``s3://``, ``gs://``, ``az://``, ``memory://``,
    ``file://``); ``storage_options`` go to the fsspec filesystem."""
    return FsspecObjectStore(url, read_only=read_only, storage_options=storage_options)
