"""Bundles: every artifact of some names in one zstd-compressed file, digests checked.

Layout (version 1): the 8-byte magic ``AOTBNDL1``, then one zstd frame, written with
zstd's content checksum, holding an 8-byte little-endian header length, the header
(JSON: bundle format, manifests, and the digest and size of each blob in order) and
the blobs' bytes, back to back. There are no paths in a bundle, so nothing in one can
name a place outside the cache; every size is bounded before it is read, every blob is
re-hashed on import, and the checksum (required on import) covers the manifests too,
which no blob digest does.

The header also carries each entry's compile time (``entries``: key and
``created_at``), kept on import, and the refs of the entries exported (``refs``: the
exporting cache's current refs of them, or one release's members and its label),
applied on import by the rules of :mod:`~aot.cache.admin.carried_refs`. Both are
optional: a bundle written before them imports with the import time as compile time
and sets no ref. Readers ignore header keys they do not know, so the format stays 1.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fnmatch
import json
import logging
import os
import re
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Union
from urllib.parse import urlsplit

import zstandard

from aot.artifact import Artifact, Manifest
from aot.cache.admin.carried_refs import CarriedRefs, RefsOutcome, apply_refs, carried_refs
from aot.cache.names import name_problem
from aot.cache.storage.frames import FRAME_HEADER_MAX, MAX_BLOB_BYTES, MAX_WINDOW_BYTES
from aot.errors import AotError, CacheError, CorruptArtifactError
from aot.fingerprint import sha256_hex
from aot.signing import verify
from aot.cache.units import counted

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

MAGIC = b"AOTBNDL1"
BUNDLE_FORMAT = 1
MAX_HEADER_BYTES = 64 * 1024 * 1024
_HOSTILE_STEP_BYTES = 4096  # at most 128 MiB inflated per step

# A file path, an object-store URL (s3://, gs://, az://, memory://, file://), "-"
# (stdout / stdin) or a binary stream: see "where a bundle lives" below.
BundlePath = Union[str, "os.PathLike[str]", IO[bytes]]


@dataclass(frozen=True, slots=True)
class Refusal:
    """An entry a bundle operation left out, and why."""

    key: str
    name: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "name": self.name, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class BundleReport:
    path: str
    entries: tuple[str, ...]
    imported: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # stored and intact already
    bytes: int = 0
    repaired: tuple[str, ...] = ()  # stored, but their blobs were missing or corrupt: restored
    refused: tuple[Refusal, ...] = ()  # names the cache does not accept
    refs: RefsOutcome = RefsOutcome()  # import: what it did to the cache's refs
    carried: CarriedRefs = CarriedRefs()  # export: the refs (and release) the bundle carries

    def to_dict(self) -> dict[str, Any]:
        return {
            "refs": self.refs.to_dict(),
            "carried": self.carried.to_dict(),
            "path": self.path,
            "entries": list(self.entries),
            "imported": list(self.imported),
            "skipped": list(self.skipped),
            "repaired": list(self.repaired),
            "refused": [r.to_dict() for r in self.refused],
            "bytes": self.bytes,
        }


def export_bundle(
    cache: ArtifactStore, path: BundlePath, names: list[str] | None, *, release: str | None = None,
) -> BundleReport:
    """Writes every intact entry matching ``names`` (globs; all if None), or the
    members of ``release``, to ``path``: a file (mode 0644), an object-store URL,
    ``"-"`` (stdout) or a binary stream; with their compile times and their refs."""
    where = _destination(path)  # an unsupported URL is refused before any work
    if release is not None and names:
        raise CacheError(f"give either NAME_GLOBs ({' '.join(names)}) or --release {release}: a release is exported whole")
    members = None if release is None else {m.key for m in carried_refs(cache, (), release).refs}
    matching = [
        e for e in cache.reader.entries()
        if e.ok and (not names or any(fnmatch.fnmatchcase(e.name, g) for g in names))
        and (members is None or e.key in members)
    ]
    refused = tuple(
        Refusal(e.key, e.name, problem) for e in matching if (problem := name_problem(e.name)) is not None
    )
    for refusal in refused:  # stored before the name rule: no cache would import it
        log.warning("not exporting %r (%s): %s", refusal.name[:80], refusal.key[:12], refusal.reason)
    entries = [e for e in matching if name_problem(e.name) is None]
    if not entries:
        raise CacheError(
            f"nothing to export: no intact entry matches {names or ['*']} in the cache at "
            f"{cache.display_location}; `aot ls` lists what is stored"
        )
    if members is not None and len(entries) != len(members):
        raise CacheError(
            f"release {release!r} names {counted(len(members), 'entry')} and {len(entries)} of them are stored intact "
            f"in the cache at {cache.display_location}; run `aot verify` there"
        )
    artifacts = [cache.artifact(e) for e in entries]  # verifies every blob
    carried = carried_refs(cache, [e.key for e in entries], release)
    blob_order: dict[str, bytes] = {}
    for artifact in artifacts:
        for ref in artifact.manifest.blobs.values():
            blob_order.setdefault(ref.digest, artifact.blobs[ref.digest])
    header = json.dumps(
        {
            "bundle_format": BUNDLE_FORMAT,
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "manifests": [a.manifest.to_dict() for a in artifacts],
            "blobs": [{"digest": d, "size": len(b)} for d, b in blob_order.items()],
            "entries": [{"key": e.key, "created_at": e.created_at.isoformat()} for e in entries],
            "refs": carried.to_dict(),
        },
        sort_keys=True,
    ).encode()
    size = _write_bundle(where, header, list(blob_order.values()))
    log.info("exported %d entries (%d blobs) to %s", len(artifacts), len(blob_order), where.label)
    return BundleReport(where.label, tuple(e.key for e in entries), bytes=size, refused=refused, carried=carried)


def _read_exact(stream: IO[bytes], n: int, what: str, path: str) -> bytes:
    # One read of the whole size (zstd's reader fills it): the bytes are allocated
    # once, never joined from chunks (which would hold them twice).
    first = stream.read(n)
    chunks = [first]
    remaining = n - len(first)
    while remaining:
        chunk = stream.read(min(remaining, 1 << 20))
        if not chunk:
            raise CorruptArtifactError(
                f"bundle {path} is truncated: {what} ends {remaining} bytes early; copy or "
                "export it again"
            )
        chunks.append(chunk)
        remaining -= len(chunk)
    return first if len(chunks) == 1 else b"".join(chunks)


@dataclass(frozen=True, slots=True)
class BundleExtras:
    """What a bundle's header carries beside its artifacts (absent from old bundles)."""

    created_at: dict[str, _dt.datetime]  # key -> the entry's compile time
    refs: CarriedRefs


def read_bundle(path: BundlePath) -> list[Artifact]:
    """Parses and verifies a bundle (a file, an object-store URL, ``"-"`` for stdin, or
    a binary stream); raises CorruptArtifactError on anything amiss."""
    with _open_source(path) as (raw, label, _size):
        return _read_bundle(raw, label)[0]


def _read_bundle(raw: IO[bytes], path: str) -> tuple[list[Artifact], BundleExtras]:
    """Parses and verifies the bundle in ``raw`` (seekable; ``path`` names it in messages)."""
    if raw.read(len(MAGIC)) != MAGIC:
        raise CorruptArtifactError(f"{path} is not a jax-aot bundle (bad magic)")
    try:
        frame = zstandard.get_frame_parameters(raw.read(FRAME_HEADER_MAX))
    except zstandard.ZstdError as exc:
        raise CorruptArtifactError(f"bundle {path}: malformed zstd frame header: {exc}") from None
    if not frame.has_checksum:
        # Blob digests do not cover the manifests; the checksum does.
        raise CorruptArtifactError(
            f"bundle {path}: the zstd frame carries no content checksum, so the "
            "manifests cannot be checked; the bundle was damaged, or written by an "
            "older jax-aot: export it again"
        )
    raw.seek(len(MAGIC))
    decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES)
    try:
        try:
            with decompressor.stream_reader(raw, closefd=False) as stream:
                artifacts, extras = _parse(stream, path)
        except CorruptArtifactError:
            raise
        except AotError:
            # What the header says (a dtype this jax lacks, ...) counts only once the
            # checksum proves the header intact: a flipped bit can spell "fl7at32".
            # Nothing bounds what is left of the frame, so decode it in small steps.
            _check_frame_end(raw, path, step=_HOSTILE_STEP_BYTES)
            raise
        _check_frame_end(raw, path)
    except zstandard.ZstdError as exc:
        raise CorruptArtifactError(f"bundle {path}: malformed zstd data: {exc}") from None
    return artifacts, extras


def _check_frame_end(raw: IO[bytes], path: str, step: int = 1 << 20) -> None:
    """The frame must be complete, content checksum included.

    python-zstandard's stream reader ends quietly on a frame cut short and then never
    checks the checksum: with 1-3 of its bytes cut, any change to the content passed.
    So decode once more, discarding the output (no more than what was just read), and
    require the frame's end. Each ``step`` bytes of input inflate to at most 32768 times
    as much (a 4-byte RLE block of 128 KiB).
    """
    raw.seek(len(MAGIC))
    frame = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES).decompressobj()
    while not frame.eof:
        chunk = raw.read(step)
        if not chunk:
            raise CorruptArtifactError(
                f"bundle {path} is truncated: its zstd frame (or its checksum) ends early; "
                "copy or export it again"
            )
        frame.decompress(chunk)
    if frame.unused_data or raw.read(1):
        raise CorruptArtifactError(f"bundle {path}: unexpected bytes after the zstd frame")


def _parse(stream: IO[bytes], path: str) -> tuple[list[Artifact], BundleExtras]:
    (header_len,) = struct.unpack("<Q", _read_exact(stream, 8, "header length", path))
    if header_len > MAX_HEADER_BYTES:
        raise CorruptArtifactError(f"bundle {path}: header of {header_len} bytes is too large")
    try:
        header = json.loads(_read_exact(stream, header_len, "header", path))
        if header.get("bundle_format") != BUNDLE_FORMAT:
            raise CorruptArtifactError(
                f"bundle {path}: format {header.get('bundle_format')!r} != {BUNDLE_FORMAT}; "
                "import it with the jax-aot that wrote it"
            )
        manifests = [Manifest.from_dict(m) for m in header["manifests"]]
        blob_list = [(str(b["digest"]), int(b["size"])) for b in header["blobs"]]
        extras = BundleExtras(
            {str(e["key"]): _utc(e["created_at"]) for e in header.get("entries") or ()},
            CarriedRefs.from_dict(header.get("refs")),
        )
    except CorruptArtifactError:
        raise
    except AotError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise CorruptArtifactError(f"bundle {path}: malformed header: {exc!r}") from None
    _check_declared(manifests, blob_list, path)
    blobs: dict[str, bytes] = {}
    for digest, size in blob_list:
        data = _read_exact(stream, size, f"blob {digest[:16]}", path)
        if sha256_hex(data) != digest:
            raise CorruptArtifactError(
                f"bundle {path}: blob {digest[:16]} does not match its digest; the bundle "
                "was altered or damaged in transit. Export it again."
            )
        blobs[digest] = data
    if stream.read(1):
        raise CorruptArtifactError(f"bundle {path}: unexpected bytes after the last blob")
    keys = [m.key for m in manifests]
    if len(keys) != len(set(keys)):
        raise CorruptArtifactError(f"bundle {path}: an entry appears twice")
    for m in manifests:
        if not isinstance(m.name, str):
            raise CorruptArtifactError(f"bundle {path}: entry name {m.name!r} is not a string")
    return [Artifact(m, {r.digest: blobs[r.digest] for r in m.blobs.values()}) for m in manifests], extras


def _utc(text: Any) -> _dt.datetime:
    value = _dt.datetime.fromisoformat(str(text))
    if value.tzinfo is None:
        raise ValueError(f"created_at {text!r} has no time zone")
    return value.astimezone(_dt.timezone.utc)


def _check_declared(manifests: list[Manifest], blob_list: list[tuple[str, int]], path: str) -> None:
    """Before a byte of a blob is inflated: the header lists exactly the blobs the
    manifests reference, each once, with the size every manifest declares for it,
    so reading allocates no more than the entries need."""
    declared: dict[str, int] = {}
    for m in manifests:
        for ref in m.blobs.values():
            if declared.setdefault(ref.digest, ref.size) != ref.size:
                raise CorruptArtifactError(
                    f"bundle {path}: manifests declare blob {ref.digest[:16]} with sizes "
                    f"{declared[ref.digest]} and {ref.size}; export it again"
                )
    listed: set[str] = set()
    for digest, size in blob_list:
        if digest in listed:
            raise CorruptArtifactError(f"bundle {path}: blob {digest[:16]} appears twice")
        listed.add(digest)
        if digest not in declared:
            raise CorruptArtifactError(
                f"bundle {path}: holds blobs no manifest references (digest {digest[:16]!r}, "
                f"{size} bytes); refused before reading it. Export it again"
            )
        if size != declared[digest] or not 0 <= size <= MAX_BLOB_BYTES:
            raise CorruptArtifactError(
                f"bundle {path}: blob {digest[:16]} has size {size}, its manifest declares "
                f"{declared[digest]}; refused before reading it. Export it again"
            )
    if set(declared) - listed:
        raise CorruptArtifactError(f"bundle {path}: blobs {sorted(set(declared) - listed)[:3]} are missing")


def import_bundle(cache: ArtifactStore, path: BundlePath, *, refs: bool = False) -> BundleReport:
    """Imports a bundle (a file, an object-store URL, ``"-"`` for stdin, or a stream).

    Stores every entry whose name the cache accepts (the others are reported in
    ``refused``), each with the compile time the bundle records (an old bundle's:
    the import time). An entry already stored is checked: intact, it is skipped; with
    missing or corrupt blobs, it is restored from the bundle. Then the bundle's refs
    are written where the cache has none (``refs``: overwriting its own), and a
    release the bundle carries is recorded under its label."""
    cache.check_writable("import a bundle")
    with _open_source(path) as (raw, label, size):
        artifacts, extras = _read_bundle(raw, label)
    for artifact in artifacts:  # check all signatures before writing anything
        verify(artifact.manifest, cache.signing_key, require=cache.require_signatures)
    outcomes: dict[str, list[str]] = {"stored": [], "present": [], "repaired": []}
    refused: list[Refusal] = []
    for artifact in artifacts:
        manifest = artifact.manifest
        problem = name_problem(manifest.name)
        if problem is not None:
            log.warning("not importing %r (%s): %s", manifest.name[:80], manifest.key[:12], problem)
            refused.append(Refusal(manifest.key, manifest.name, problem))
            continue
        # verifies the blobs of a stored entry
        _, outcome = cache.store_artifact(artifact, created_at=extras.created_at.get(manifest.key))
        outcomes[outcome].append(manifest.key)
    present = [key for keys in outcomes.values() for key in keys]
    ref_outcome = apply_refs(cache, extras.refs, present, overwrite=refs, source=f"import of bundle {label}")
    log.info(
        "imported %d entries from %s (%d already present, %d repaired, %d refused)",
        len(outcomes["stored"]), label, len(outcomes["present"]), len(outcomes["repaired"]), len(refused),
    )
    return BundleReport(
        label, tuple(a.manifest.key for a in artifacts), tuple(outcomes["stored"]),
        tuple(outcomes["present"]), bytes=size,
        repaired=tuple(outcomes["repaired"]), refused=tuple(refused), refs=ref_outcome, carried=extras.refs,
    )


# ---------------------------------------------------------------- where a bundle lives
#
# A bundle is a local file, an object-store URL (s3://, gs://, az://, memory://,
# file://, through fsspec), "-" (stdout on export, stdin on import) or a binary stream.
# Files are written to a temp file, fsynced and renamed, with mode 0644 so that a
# server running as another user can read them; uploads are one object PUT (or a
# multipart upload completed at the end): never a partial bundle under the final name.

STDIO = "-"
_COLLAPSED_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/(?!/)(.*)$")


@dataclass(frozen=True, slots=True)
class _Where:
    kind: str  # "file", "url", "stream"
    label: str  # for messages and reports (a URL without credentials)
    file: Path | None = None
    url: str | None = None
    stream: IO[bytes] | None = None


def _classify(path: Any, *, reading: bool) -> _Where:
    if hasattr(path, "read" if reading else "write"):
        return _Where("stream", getattr(path, "name", None) or "<stream>", stream=path)
    text = os.fspath(path)
    if text == STDIO:
        std = sys.stdin if reading else sys.stdout
        return _Where("stream", "<stdin>" if reading else "<stdout>", stream=std.buffer)
    from aot.cache.storage.locations import is_url

    if not is_url(text):
        # pathlib folds "s3://b/x" into "s3:/b/x": read that back as the URL it was,
        # and refuse other "scheme:/..." forms rather than create a folder "scheme:"
        # (a local folder of that name is reached as "./scheme:/...").
        match = _COLLAPSED_URL.match(text)
        if match is not None:
            scheme, rest = match.group(1).lower(), match.group(2)
            text = f"{scheme}:///{rest}" if scheme == "file" else f"{scheme}://{rest}"
    if is_url(text):
        if urlsplit(text).scheme.lower() == "file":
            local = Path(urlsplit(text).path)
            return _Where("file", str(local), file=local)
        from aot.cache.storage.fsspec_store import open_url

        target = open_url(text)  # refuses unknown schemes with the list of known ones
        return _Where("url", target.location, url=text)
    return _Where("file", str(path), file=Path(text))


def _destination(path: Any) -> _Where:
    where = _classify(path, reading=False)
    if where.kind == "file" and where.file is not None and where.file.is_dir():
        raise CacheError(f"cannot write bundle {where.label}: it is a folder; name a file")
    return where


def _encode(raw: IO[bytes], header: bytes, blobs: list[bytes]) -> None:
    raw.write(MAGIC)
    compressor = zstandard.ZstdCompressor(level=3, write_checksum=True)
    with compressor.stream_writer(raw, closefd=False) as out:
        out.write(struct.pack("<Q", len(header)))
        out.write(header)
        for data in blobs:
            out.write(data)
    raw.flush()


def _write_bundle(where: _Where, header: bytes, blobs: list[bytes]) -> int:
    """Writes the bundle all or nothing; returns its size in bytes."""
    if where.kind == "stream":
        assert where.stream is not None
        counter = _CountingWriter(where.stream)
        try:
            _encode(counter, header, blobs)  # type: ignore[arg-type]
            where.stream.flush()
        except OSError as exc:
            raise CacheError(f"cannot write bundle to {where.label}: {exc}") from exc
        return counter.count
    if where.kind == "file":
        assert where.file is not None
        return _write_file(where.file, header, blobs)
    # An object store: encode to a local temp file, then one upload of the whole file.
    from aot.cache.storage.fsspec_store import open_url, translate_error

    assert where.url is not None
    target = open_url(where.url)
    fd, tmp = tempfile.mkstemp(prefix=".aot-bundle.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw:
            _encode(raw, header, blobs)
        size = os.path.getsize(tmp)
        try:
            target.fs.put_file(tmp, target.path)
        except Exception as exc:  # noqa: BLE001 - every store error becomes a CacheError
            raise translate_error(exc, "write the bundle", target.location, target.protocol) from exc
        return size
    finally:
        Path(tmp).unlink(missing_ok=True)


def _write_file(path: Path, header: bytes, blobs: list[bytes]) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise CacheError(f"cannot write bundle {path}: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as raw:
            # mkstemp makes it 0600; a bundle is for others to read (a server's user).
            os.chmod(tmp, 0o644)
            _encode(raw, header, blobs)
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise CacheError(f"cannot write bundle {path}: {exc}") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path.stat().st_size


class _CountingWriter:
    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.count = 0

    def write(self, data: bytes) -> int:
        self.stream.write(data)
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def _open_source(path: Any) -> Iterator[tuple[IO[bytes], str, int]]:
    """A seekable binary handle on the bundle, its label and its size.

    Reading checks the zstd frame in a second pass, so stdin, streams and object-store
    URLs are first copied to an unnamed local temp file (one download, disk-backed).
    """
    where = _classify(path, reading=True)
    if where.kind == "file":
        assert where.file is not None
        try:
            raw = where.file.open("rb")
        except OSError as exc:
            raise CacheError(f"cannot read bundle {where.label}: {exc}") from exc
        with raw:
            yield raw, where.label, os.fstat(raw.fileno()).st_size
        return
    with tempfile.TemporaryFile(prefix="aot-bundle.") as spool:
        if where.kind == "stream":
            assert where.stream is not None
            try:
                shutil.copyfileobj(where.stream, spool, 1 << 20)
            except OSError as exc:
                raise CacheError(f"cannot read bundle from {where.label}: {exc}") from exc
        else:
            from aot.cache.storage.fsspec_store import open_url, translate_error

            assert where.url is not None
            target = open_url(where.url)
            try:
                with target.fs.open(target.path, "rb") as remote:
                    shutil.copyfileobj(remote, spool, 8 << 20)
            except FileNotFoundError as exc:
                if "bucket" in str(exc).lower():
                    raise translate_error(exc, "read the bundle", target.location, target.protocol) from exc
                raise CacheError(
                    f"cannot read bundle {target.location}: no such object; check the URL "
                    "(export it first with `aot bundle export URL`)"
                ) from exc
            except Exception as exc:  # noqa: BLE001 - every store error becomes a CacheError
                raise translate_error(exc, "read the bundle", target.location, target.protocol) from exc
        size = spool.tell()
        spool.seek(0)
        yield spool, where.label, size
