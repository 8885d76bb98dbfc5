"""One named part that differs between two fingerprints.

Apart from :mod:`aot.fingerprint` (which still exports the name) because only two
fingerprints that differ need it: serving an entry of this environment never does,
and defining a frozen dataclass costs every process that imports it ~0.5 ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PartDifference:
    """One named part that differs between two fingerprints."""

    part: str
    expected: str | None
    actual: str | None

    def describe(self) -> str:
        expected, actual = self.expected, self.actual
        if self.part == "cpu_isa" and expected is not None and actual is not None:
            missing = sorted(set(expected.split()) - set(actual.split()))
            extra = sorted(set(actual.split()) - set(expected.split()))
            return (
                f"cpu_isa: stored artifact needs {missing or 'nothing more'}, "
                f"this CPU adds {extra or 'nothing'}"
            )
        return f"{self.part} {_short(expected)} != {_short(actual)}"

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "expected": self.expected, "actual": self.actual}


def _short(value: str | None, limit: int = 80) -> str:
    if value is None:
        return "(absent)"
    return value if len(value) <= limit else value[: limit - 3] + "..."
