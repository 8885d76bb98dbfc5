"""A blob's stored form: one zstd frame with the content size in its header, named by
the lowercase hex sha256 of what it inflates to (:func:`check_digest`) and kept by
path-based stores at :func:`blob_path`. :func:`inflate` decompresses and re-hashes a
payload with bounded memory: what it returns matched its digest.

:class:`~aot.cache.storage.content.ContentStore` reads every blob through here, and so
does ``aot.load``'s read-ahead, which runs before the stores are imported
(:mod:`aot.cache.serving.read_ahead`): this module imports nothing slower than zstandard.
"""

from __future__ import annotations

import hashlib
from typing import BinaryIO

import zstandard

from aot.errors import CorruptArtifactError

#: Problems found by :func:`inflate` (and reported by ``ContentStore.check``).
PROBLEM_MISSING = "missing"
PROBLEM_MISMATCH = "digest mismatch"
PROBLEM_UNDECODABLE = "truncated/undecodable zstd frame"
PROBLEM_SIZE = "size differs from the declared size"

#: The most a blob may inflate to when no size is declared (a caller of
#: ``ContentStore.get`` without ``size``), and the most any declaration may say:
#: a frame or a manifest claiming more is corrupt, not a reason to allocate it.
MAX_BLOB_BYTES = 8 * 1024**3

#: zstd frames asking for a larger window (decoder memory) are refused; this store
#: writes frames with windows far below it.
MAX_WINDOW_BYTES = 1 << 27

#: Bytes inflated (and hashed) per step of a streaming read.
CHUNK_BYTES = 8 * 1024 * 1024
#: zstd: 4-byte magic + at most 14 bytes of frame header.
FRAME_HEADER_MAX = 18

_HEX_DIGITS = "0123456789abcdef"


def check_digest(digest: str) -> str:
    """``digest`` if it is 64 lowercase hex characters, else CorruptArtifactError.

    Digests come from manifests and index rows and become file and object names, so
    anything else (``../``, upper case, a truncated value) is refused.
    """
    if not isinstance(digest, str) or len(digest) != 64 or digest.strip(_HEX_DIGITS):
        raise CorruptArtifactError(
            f"invalid blob digest {digest!r}: expected 64 lowercase hex characters "
            f"(a sha256); the manifest or index row naming it is damaged, run `aot verify`"
        )
    return digest


def blob_path(digest: str) -> str:
    """The relative path of a blob in every path-based store: ``ab/<digest>.zst``."""
    check_digest(digest)
    return f"{digest[:2]}/{digest}.zst"


def digest_of(data: bytes) -> str:
    """Lowercase hex sha256 of ``data`` (the uncompressed bytes)."""
    return hashlib.sha256(data).hexdigest()


def frame_size(head: bytes) -> int | None:
    """The content size a zstd frame header claims; None if it records none.
    Raises ZstdError when ``head`` is no frame header."""
    size = zstandard.get_frame_parameters(head).content_size
    return None if size == zstandard.CONTENTSIZE_UNKNOWN else int(size)


def inflate(
    digest: str, source: bytes | BinaryIO, size: int | None, *, keep: bool,
) -> tuple[str | None, bytes | None]:
    """Decompresses ``source`` (a payload, or a file object on one), hashing it as it
    streams: ``(problem, data)``; ``data`` only with ``keep`` and no problem.

    Memory is bounded by ``size`` (the size a manifest or index row declares; else
    :data:`MAX_BLOB_BYTES`), never by what the frame claims: a frame header whose
    content size exceeds the declared size is refused before a byte is inflated,
    and decoding stops as soon as the output passes the bound. Without ``keep`` only
    a chunk is held at a time.
    """
    limit = MAX_BLOB_BYTES if size is None else size
    if not 0 <= limit <= MAX_BLOB_BYTES:
        return f"{PROBLEM_SIZE}: {limit} bytes are declared, more than a blob may have ({MAX_BLOB_BYTES})", None
    if isinstance(source, (bytes, bytearray, memoryview)):
        head = bytes(source[:FRAME_HEADER_MAX])
    else:
        head = source.read(FRAME_HEADER_MAX)
        source.seek(0)
    try:
        claimed = frame_size(head)
    except zstandard.ZstdError:
        return PROBLEM_UNDECODABLE, None
    if claimed is not None and claimed > limit:
        bound = f"only {size} are declared" if size is not None else f"more than a blob may have ({limit})"
        return f"{PROBLEM_SIZE}: the zstd frame header claims {claimed} bytes, {bound}", None
    # A frame that claims the declared size is read in one call, which allocates the
    # result once (no join, no copy); otherwise chunks, each hashed as it comes.
    step = claimed + 1 if keep and claimed is not None and claimed == size else CHUNK_BYTES
    hasher = hashlib.sha256()
    chunks: list[bytes] = []
    total = 0
    try:
        decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES)
        with decompressor.stream_reader(source, read_size=CHUNK_BYTES, closefd=False) as reader:
            while True:
                chunk = reader.read(min(step, limit - total + 1))
                if not chunk:
                    break
                total += len(chunk)
                if total > limit:
                    bound = "declared" if size is not None else "a blob may have"
                    return f"{PROBLEM_SIZE}: inflates beyond the {limit} bytes {bound}", None
                hasher.update(chunk)
                if keep:
                    chunks.append(chunk)
    except zstandard.ZstdError:
        return PROBLEM_UNDECODABLE, None
    if claimed is not None and total != claimed:
        return PROBLEM_UNDECODABLE, None  # the frame ended before the size it claims
    if hasher.hexdigest() != digest:
        return PROBLEM_MISMATCH, None
    if size is not None and total != size:
        return f"{PROBLEM_SIZE}: {total} bytes, {size} are declared", None
    if not keep:
        return None, None
    return None, chunks[0] if len(chunks) == 1 else b"".join(chunks)
