"""What a stored ``jax.export`` flatbuffer says about its own age, read without
deserializing it (no device, no JAX release of another host).

``jax.export.deserialize`` hides what JAX's newer releases check before refusing an
export: the serialization version field, the JAX version that serialized it, the
16-bit device count of exports made before serialization version 5, and shardings
stored only as ``HloSharding`` protos (before version 6, 2026-01-15). The flatbuffer's
generated reader (``jax._src.export.serialization_generated``) reads those fields; an
accessor this release's reader lacks (``JaxVersion`` before 0.11.1) reads as unknown.
Release difference "Exported.JaxVersion": the generated reader of JAX 0.11.1+ has
``Exported.JaxVersion`` (serialization version 12), older ones do not.
Release difference "Exported.UniqueAvalsLength": the readers of JAX 0.10.0+ have the
unique avals and shardings tables (version 10), 0.9.x's do not (read as absent: an
export this release's reader cannot index is dated by its other fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ExportHeader", "read_export_header"]


@dataclass(frozen=True, slots=True)
class ExportHeader:
    """The fields of a serialized ``Exported`` that date it."""

    serialization_field: int  # as stored: 3 for every serializer before JAX 0.11.1
    jax_version: str | None  # recorded by serializers of version 12+ (None: not, or unreadable here)
    calling_convention: int
    nr_devices: int  # the 32-bit field (serialization version 5+)
    nr_devices_short: int  # the 16-bit field of older exports
    indexed: bool  # unique avals/shardings tables (serialization version 10+)
    named_shardings: bool  # some sharding stored as a NamedSharding (version 6+)
    hlo_sharding_only: bool  # some sharding stored only as an HloSharding proto (before version 6)


def read_export_header(blob: bytes) -> ExportHeader | None:
    """The dating fields of ``blob`` (``jax.export.serialize``'s bytes); None when the
    bytes are not a flatbuffer this release's reader can walk."""
    from jax._src.export import serialization_generated as flat

    try:
        exported = flat.Exported.GetRootAsExported(bytearray(blob), 0)
        version = getattr(exported, "JaxVersion", None)  # Release difference "Exported.JaxVersion"
        raw = version() if version is not None else None
        hlo_only = named = False
        if _length(exported, "InShardingsIdxsLength") == 0 and _length(exported, "OutShardingsIdxsLength") == 0:
            for kind in ("In", "Out"):
                for i in range(_length(exported, f"{kind}ShardingsLength")):
                    sharding = getattr(exported, f"{kind}Shardings")(i)
                    if sharding.NamedSharding() is not None:
                        named = True
                    elif not sharding.HloShardingProtoIsNone():
                        hlo_only = True
        else:
            named = _length(exported, "UniqueNamedShardingsLength") > 0
        return ExportHeader(
            serialization_field=int(exported.SerializationVersion()),
            jax_version=raw.decode("utf-8", "replace") if raw else None,
            calling_convention=int(exported.CallingConventionVersion()),
            nr_devices=int(exported.NrDevices()),
            nr_devices_short=int(exported.NrDevicesShort()),
            indexed=_length(exported, "UniqueAvalsLength") > 0,
            named_shardings=named,
            hlo_sharding_only=hlo_only,
        )
    except Exception:  # noqa: BLE001 - a malformed flatbuffer raises anything from struct to IndexError
        return None


def _length(exported: Any, accessor: str) -> int:
    method = getattr(exported, accessor, None)
    return int(method()) if method is not None else 0
