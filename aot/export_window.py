"""Whether this JAX release may call a portable HLO (``jax.export`` bytes) that another
release stored: ``jax.export``'s compatibility window.

An entry of another JAX release has no executable here (the jaxlib release is part of
the environment key); the fallback ladder recompiles its portable HLO, which JAX
promises to call across releases within a window: a release calls what releases of
about the last six months exported (backward), and what it exports is callable by
releases of about a month before it (forward). JAX states the window in three places,
each read here through public ``jax.export`` only:

- the calling convention version of the export, which must lie in
  ``jax.export.minimum_supported_calling_convention_version`` ..
  ``maximum_supported_calling_convention_version`` of this release (JAX raises the
  minimum as old conventions leave the window);
- the serialization itself: ``jax.export.deserialize`` refuses a flatbuffer this
  release cannot read (from 0.11 also an expired one: serialization version 12
  records ``jax_version``);
- the StableHLO module inside, deserialized when the export is lowered: a module
  serialized for a newer StableHLO than this release's cannot be read.

A refusal by any of these, for an entry of another release, is
:class:`aot.ExportWindowError` (an incompatible environment, never corruption: the
bytes matched their digest, and another host of that release serves them); for an
entry of this release it stays corruption.
"""

from __future__ import annotations

import logging
from typing import Any

import jax

from aot.errors import CorruptArtifactError, ExportWindowError
from aot.jaxcompat.releases import calling_convention, calling_convention_window, same_release

__all__ = ["check_expiry", "check_window", "refusal"]

log = logging.getLogger(__name__)


def _label(name: str, key: str) -> str:
    return f"{name!r} ({key[:12]})"


def _releases(stored_jax: str | None) -> str:
    return f"exported by jax {stored_jax or '(unknown)'}, served by jax {jax.__version__}"


def check_window(name: str, key: str, stored_jax: str | None, exported: Any) -> None:
    """Raises :class:`aot.ExportWindowError` when ``exported`` (deserialized portable
    HLO of the entry ``key`` of ``name``, stored by ``stored_jax``) uses a calling
    convention outside this release's window."""
    window = calling_convention_window()
    version = calling_convention(exported)
    if window is None or version is None or window[0] <= version <= window[1]:
        return
    raise ExportWindowError(
        f"the portable HLO of {_label(name, key)} uses jax.export calling convention {version}, "
        f"outside the window this release calls ({window[0]}..{window[1]}): {_releases(stored_jax)}. "
        f"Compile it from its code on jax {jax.__version__} (aot warmup MANIFEST on a host of this "
        "release), or serve it from hosts of the release that stored it",
        (f"jax {stored_jax} != {jax.__version__}",),
    )


def refusal(name: str, key: str, stored_jax: str | None, step: str, exc: BaseException) -> Exception:
    """What a failure of ``step`` (reading or lowering the portable HLO) means: outside
    the window when another release stored it (:class:`aot.ExportWindowError`), else
    corruption (:class:`aot.CorruptArtifactError`)."""
    if stored_jax is not None and not same_release(stored_jax):
        return ExportWindowError(
            f"the portable HLO of {_label(name, key)} cannot be {step} by this release: {exc} "
            f"({_releases(stored_jax)}: outside jax.export's compatibility window, which covers "
            f"about six months back and one month ahead). Compile it from its code on jax "
            f"{jax.__version__} (aot warmup MANIFEST on a host of this release), or serve it from "
            "hosts of the release that stored it",
            (f"jax {stored_jax} != {jax.__version__}",),
        )
    return CorruptArtifactError(
        f"the portable HLO of {_label(name, key)} cannot be {step}: {exc}; recompile the entry "
        "from its code (aot warmup / aot compile)"
    )


def check_expiry(name: str, key: str, stored_jax: str | None, hlo: bytes) -> None:
    """Raises :class:`aot.ExportWindowError` when this release refuses the portable HLO
    ``hlo`` of the entry ``key`` of ``name`` for its format (:mod:`aot.export_rules`:
    JAX 0.11.1+'s refusals), read from its header before JAX's own ``deserialize``
    refuses it, so that the refusal names the export's date, the window and the
    refresh. An export only older than the window this release promises is still
    called (JAX reads it), with a warning naming the refresh."""
    from aot.export_rules import judge, refresh_advice

    release = jax.__version__
    # The calling convention is check_window's, against this release's live window.
    verdict = judge(hlo, stored_jax, release, calling_convention=False)
    if verdict is None or verdict.status is None:
        return  # unreadable: jax.export.deserialize says why (refusal)
    window = f"jax {release}'s window starts {verdict.window_start}" if verdict.window_start else f"jax {release}"
    if not verdict.refused:
        log.warning("the portable HLO of %s is outside jax.export's window: %s (%s); %s",
                    _label(name, key), verdict.describe(), window, refresh_advice(release))
        return
    raise ExportWindowError(
        f"the portable HLO of {_label(name, key)} has expired for this release: {verdict.describe()} "
        f"({verdict.date.how}; {window}; the entry is of jax {stored_jax or '(unknown)'}). To serve it here, "
        f"{refresh_advice(release)}, or compile it from its code on this release (aot warmup MANIFEST)",
        (f"export {verdict.date.made or 'before 2025-11-23'} refused by jax {release}",),
    )
