"""What a compile was tuned with (a GPU's autotuning), as a small typed value.

Stored as its text in an entry's manifest (``autotune``) and shown by listings, which is
the format the index and manifests already hold: ``tuned sha256:...`` (every fusion found
in the GPU's captured results), ``defaults`` (XLA's default configs: no results for the
GPU), ``defaults sha256:...`` (some fusions missing from those results), ``measured``
(compiled on the GPU itself, which autotunes as it compiles)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULTS", "MEASURED", "TUNED", "Tuning"]

TUNED = "tuned"
DEFAULTS = "defaults"
MEASURED = "measured"


@dataclass(frozen=True, slots=True)
class Tuning:
    """A compile's tuning: its state and the digest of the results it was tried with."""

    state: str  # TUNED, DEFAULTS or MEASURED
    results: str | None = None  # "sha256:..." of the captured autotune results, when tried

    @property
    def text(self) -> str:
        """The stored spelling (``tuned sha256:...``)."""
        return f"{self.state} {self.results}" if self.results else self.state

    @property
    def fell_back(self) -> bool:
        """Whether it got XLA's default configs (no results, or incomplete ones)."""
        return self.state == DEFAULTS

    @classmethod
    def parse(cls, text: object) -> Tuning | None:
        """The tuning a stored text spells; None for none (or not a string)."""
        if not isinstance(text, str) or not text.strip():
            return None
        state, _, results = text.strip().partition(" ")
        return cls(state, results or None)

    def __str__(self) -> str:
        return self.text
