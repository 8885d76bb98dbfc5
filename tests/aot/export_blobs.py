"""Real ``jax.export`` bytes in an older export format, for the tests of JAX 0.11.1+'s
export rules (aot.export_rules): a real export of this JAX with its device count moved
to the 16-bit field that serialization formats before 5 (before 2025-11-23) used. No
field's value changes: the root table's vtable entry of the 32-bit ``nr_devices`` is
moved to the slot of ``nr_devices_short``, which is how such an export is laid out, so
JAX 0.11.1+ refuses it exactly as it refuses an export of that age, and older releases
read it.
"""

from __future__ import annotations

import inspect
import re
import struct


def _vtable_offset(accessor: object) -> int:
    """The vtable byte offset a generated flatbuffer accessor reads (``self._tab.Offset(N)``)."""
    found = re.search(r"_tab\.Offset\((\d+)\)", inspect.getsource(accessor))  # type: ignore[arg-type]
    assert found is not None, accessor
    return int(found.group(1))


def old_format_export(blob: bytes) -> bytes:
    """``blob`` (``jax.export`` bytes of JAX >= 0.9) laid out as a format-4 export: its
    device count only in the 16-bit field."""
    from jax._src.export import serialization_generated as flat

    data = bytearray(blob)
    (table,) = struct.unpack_from("<I", data, 0)
    (back,) = struct.unpack_from("<i", data, table)
    vtable = table - back
    (size,) = struct.unpack_from("<H", data, vtable)
    wide, short = _vtable_offset(flat.Exported.NrDevices), _vtable_offset(flat.Exported.NrDevicesShort)
    assert wide < size and short < size, (wide, short, size)
    (field,) = struct.unpack_from("<H", data, vtable + wide)
    assert field != 0, "the export has no 32-bit device count to move"
    struct.pack_into("<H", data, vtable + short, field)
    struct.pack_into("<H", data, vtable + wide, 0)
    return bytes(data)
