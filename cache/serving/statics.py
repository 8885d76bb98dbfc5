"""Serving a name whose entries have static arguments (``act='relu'``).

Entries that differ only in a static value are different programs with the same
input avals. A call passes its statics as ``jax.jit`` takes them, by position or by
keyword; they select the group of entries compiled with those values, and the rest of
the call (the arrays) is served by that group's :class:`Dispatcher` exactly as a name
without statics is. A name with no statics stored gets a plain :class:`Dispatcher`:
its call path (JAX's C++ dispatch) is untouched.

The rules, per static parameter (the union over the stored entries):
- passed (by position or keyword): its canonical text (:mod:`aot.statics`) must be a
  stored one, else :class:`SignatureNotFoundError`
  ``act='tanh' is not stored; stored: act='gelu', act='relu'``;
- omitted: served when exactly one value is stored for it (the entry was compiled
  with it, so a call that leaves it out meant it), else an error naming the values
  to choose from. Entries stored without that static serve calls that omit it.

A call may also leave its statics out and pass only the arrays (``f(x, y)`` for
``f(x, n, y)`` compiled with ``n`` static), as entries were called before statics were
part of a signature: an array found at a static position is taken as a dynamic
argument, and the static as omitted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aot.errors import SignatureNotFoundError
from aot.statics import StaticArg, canonical_text, describe_statics, statics_of_manifest_json

from aot.cache.serving.dispatcher import Dispatcher
from aot.cache.units import counted

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.index.entry import IndexEntry
    from aot.cache.serving.padding import PadPlan

log = logging.getLogger(__name__)

__all__ = ["StaticsDispatcher", "dispatcher_for"]


def dispatcher_for(
    cache: ArtifactStore, name: str, *, strict: bool = False,
    fallback: Callable[..., Any] | None = None, pad: PadPlan | None = None, release: str | None = None,
) -> Dispatcher | StaticsDispatcher:
    """A :class:`Dispatcher`, or a :class:`StaticsDispatcher` when an entry of ``name``
    has static arguments."""
    groups: dict[str, tuple[StaticArg, ...]] = {}
    entries = cache.entries_named(name, state=None)
    for entry in entries:
        if "=" not in entry.signature:
            # A static is in its row's signature column (``act='relu'``) as well: a row
            # without one is not read here (filing refuses a row whose manifest differs).
            groups.setdefault("", ())
            continue
        statics = statics_of_manifest_json(entry.manifest)
        groups.setdefault(describe_statics(statics), statics)
    if not any(groups):
        return Dispatcher(cache, name, strict=strict, fallback=fallback, pad=pad, release=release, entries=entries)
    if fallback is not None:
        log.warning(
            "aot.load(%r): its entries have static arguments; the fallback is not used "
            "(a call is served by the stored entries of its static values only)", name,
        )
    return StaticsDispatcher(cache, name, groups, strict=strict, pad=pad, release=release, entries=entries)


class _Merged:
    """The programs of every group (what ``load``'s start-up error lists)."""

    def __init__(self, children: dict[str, Dispatcher]) -> None:
        self.concrete = {
            (text, key): program
            for text, child in children.items() for key, program in child.programs.concrete.items()
        }
        self.refused = [r for child in children.values() for r in child.programs.refused]


class StaticsDispatcher:
    """Selects the group of entries by the call's static values (module docstring),
    then calls that group's :class:`Dispatcher` with the rest of the call."""

    def __init__(
        self, cache: ArtifactStore, name: str, groups: dict[str, tuple[StaticArg, ...]], *,
        strict: bool = False, pad: PadPlan | None = None, release: str | None = None,
        entries: Sequence[IndexEntry] | None = None,
    ) -> None:
        self.cache = cache
        self.name = name
        self.strict = strict
        self.fallback = None
        self.groups = groups
        self.children = {
            text: Dispatcher(cache, name, strict=strict, pad=pad, release=release, statics=text, entries=entries)
            for text in groups
        }
        # Every static parameter stored: (index, name); positions removed from the
        # end of a call first, so the dynamic arguments keep their order.
        params: dict[tuple[int | None, str | None], set[str]] = {}
        for statics in groups.values():
            for s in statics:
                params.setdefault((s.index, s.name), set()).add(s.text)
        self.params = sorted(params, key=lambda p: (p[0] is None, -(p[0] or 0), p[1] or ""))
        self.values = params
        self.programs = _Merged(self.children)

    # ------------------------------------------------------------ inspection

    @property
    def signatures(self) -> list[str]:
        return sorted(s for child in self.children.values() for s in child.signatures)

    def servable(self) -> list[str]:
        return sorted(s for child in self.children.values() for s in child.servable())

    def has_servable(self) -> bool:
        return any(child.has_servable() for child in self.children.values())

    @property
    def unusable(self) -> list[tuple[IndexEntry, str]]:
        return [u for child in self.children.values() for u in child.unusable]

    @property
    def skipped(self) -> list[tuple[str, str, str]]:
        return [s for child in self.children.values() for s in child.skipped]

    def __repr__(self) -> str:
        return f"StaticsDispatcher({self.name!r}, {counted(len(self.signatures), 'signature')})"

    def warm(self, *, workers: int | None = None) -> StaticsDispatcher:
        for child in self.children.values():
            child.warm(workers=workers)
        return self

    def load_in_background(self, *, workers: int | None = None) -> StaticsDispatcher:
        for child in self.children.values():
            child.load_in_background(workers=workers)
        return self

    def wait(self, timeout: float | None = None) -> bool:
        return all(child.wait(timeout) for child in self.children.values())

    @property
    def loading(self) -> bool:
        return any(child.loading for child in self.children.values())

    # ------------------------------------------------------------ calling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        rest = list(args)
        given: dict[tuple[int | None, str | None], str | None] = {}
        for index, pname in self.params:  # highest position first
            if pname is not None and pname in kwargs:
                given[(index, pname)] = canonical_text(kwargs.pop(pname))
            elif index is not None and index < len(rest) and not _is_array(rest[index]):
                # Positions are read from the highest down: each is still where it was.
                # An array there is a dynamic argument of a call that leaves the statics
                # out (the calling convention of entries served before statics were).
                given[(index, pname)] = canonical_text(rest.pop(index))
        return self._select(given)(*rest, **kwargs)

    def _select(self, given: dict[tuple[int | None, str | None], str | None]) -> Dispatcher:
        wanted = {}
        for param in self.params:
            if param in given:
                text = given[param]
                if text not in self.values[param]:
                    raise self._not_stored(param, text)
                wanted[param] = text
        for text, statics in self.groups.items():
            if {(s.index, s.name): s.text for s in statics} == wanted:
                return self.children[text]
        # Omitted statics with a single stored value: served with it.
        filled = dict(wanted)
        for param in self.params:
            if param not in filled and len(self.values[param]) == 1:
                filled[param] = next(iter(self.values[param]))
        for text, statics in self.groups.items():
            if {(s.index, s.name): s.text for s in statics} == filled:
                return self.children[text]
        missing = [p for p in self.params if p not in wanted and len(self.values[p]) > 1]
        if missing:
            param = missing[-1]
            label = _label(param)
            choices = ", ".join(f"{label}={t}" for t in sorted(self.values[param]))
            raise SignatureNotFoundError(
                f"{self.name}: {label} is a static argument with several stored values "
                f"({choices}); pass it as jax.jit takes it (by position or as {label}=...)",
                tuple(self.signatures),
            )
        asked = ", ".join(f"{_label(p)}={t}" for p, t in sorted(wanted.items(), key=lambda i: str(i[0])))
        raise SignatureNotFoundError(
            f"{self.name}: no entry is stored for the statics ({asked or 'none'}); stored: "
            + "; ".join(f"({t or 'no statics'})" for t in sorted(self.groups))
            + ". Compile this combination (aot warmup / aot compile)",
            tuple(self.signatures),
        )

    def _not_stored(self, param: tuple[int | None, str | None], text: str | None) -> SignatureNotFoundError:
        label = _label(param)
        stored = ", ".join(f"{label}={t}" for t in sorted(self.values[param]))
        shown = f"{label}={text}" if text is not None else f"the value passed as {label} (it has no stable text)"
        return SignatureNotFoundError(
            f"{self.name}: {shown} is not stored; stored: {stored}. Pass a stored value, or "
            "compile this one (aot warmup / aot compile)",
            tuple(self.signatures),
        )


def _label(param: tuple[int | None, str | None]) -> str:
    index, name = param
    return name if name is not None else f"args[{index}]"


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")
