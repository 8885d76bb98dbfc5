"""Hostile zstd payloads for the memory-bound tests: lying frame headers and bombs."""

from __future__ import annotations

import zstandard

_ZEROS = bytes(1 << 20)


def claiming(data: bytes, content_size: int, *, checksum: bool = False) -> bytes:
    """One valid zstd frame of ``data`` whose header claims ``content_size`` bytes."""
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=False, write_checksum=checksum)
    plain = compressor.compress(data)
    descriptor = plain[4]
    assert descriptor >> 6 == 0 and not descriptor & 0x20, "expected no content size, a window byte"
    # Frame_Content_Size_flag 3: an 8-byte content size after the window descriptor.
    return plain[:4] + bytes([descriptor | 0xC0]) + plain[5:6] + content_size.to_bytes(8, "little") + plain[6:]


def bomb(inflated: int, *, content_size: bool = True, prefix: bytes = b"", checksum: bool = False) -> bytes:
    """A small zstd frame of ``prefix`` then ``inflated`` zero bytes (made in chunks)."""
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=content_size, write_checksum=checksum)
    chunker = compressor.chunker(size=len(prefix) + inflated if content_size else -1, chunk_size=1 << 20)
    out = bytearray()
    for chunk in chunker.compress(prefix):
        out += chunk
    remaining = inflated
    while remaining:
        step = min(remaining, len(_ZEROS))
        for chunk in chunker.compress(_ZEROS[:step]):
            out += chunk
        remaining -= step
    for chunk in chunker.finish():
        out += chunk
    return bytes(out)
