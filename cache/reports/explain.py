"""Explain a miss: the nearest stored entry and which fingerprint parts differ.

Besides the parts (the input signature, every program part with a function to lower,
the environment, the state), the input signature is compared leaf by leaf, so the
explanation names the argument that differs (``x: stored f32[1,784], got f32[4,784]``)
as the loader's own error does, instead of printing two whole signatures.

With a device target (``tpu:v5e:1x1``) the question is whether a replica on that
accelerator would hit: entries are compared with the target's environment (computed
without the device, as a warm-up for the target computes it) and the function, when
given, is lowered for the target.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax

from aot.artifact import Manifest
from aot.errors import AotError, SpecError
from aot.fingerprint import (
    UNKNOWN_ENVIRONMENT_NOTE, Fingerprint, PartDifference, environment_fingerprint, release_only,
    xla_flags_outside_key,
)
from aot.lowering import lower, lower_pmap
from aot.specs import format_aval, spec
from aot.cache.index.served import Slot, ref_map, served_key
from aot.cache.rows import release_slots
from aot.signatures import ArgLeaf, LeafDifference, Signature, leaf_differences
from aot.cache.units import counted

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.warmup.manifest import WarmupItem

#: Width of each signature in the first line of :meth:`Explanation.describe`.
SIGNATURE_WIDTH = 72


@dataclass(frozen=True, slots=True)
class Explanation:
    name: str
    signature: str
    hit: bool
    nearest_key: str | None
    nearest_signature: str | None
    differences: tuple[PartDifference, ...]
    stored: int
    arguments: Signature | None = None  # the request, by path
    nearest_arguments: Signature | None = None
    argument_differences: tuple[LeafDifference, ...] = ()
    # XLA flags set here that are not part of any key (they cannot change the code).
    xla_flags_outside_key: str = ""
    # The entry aot.load serves for the nearest entry's signature here, and why: "ref"
    # (its ref names it) or "newest" (no ref: the legacy rule); None: nothing served.
    served_key: str | None = None
    served_by: str | None = None
    #: False when this host's environment is unknown (not recorded; finding it out
    #: would open the device): environments are not compared, and nothing is a hit.
    environment_known: bool = True
    #: The release explained against (a replica of that label serves its members
    #: only); None: the refs.
    release: str | None = None
    #: The nearest entry matches every part, but the release has no member for its
    #: signature here: a replica of the release misses.
    not_in_release: bool = False
    #: The nearest entry matches, but the signing checks refuse it (unsigned, signed
    #: with another key, altered): why. None: not refused.
    refused: str | None = None
    #: The device target explained for (``tpu:v5e:1x1``); None: this host.
    device_target: str | None = None
    #: Nothing stored under the name: the stored names close to it (a typo?).
    similar: tuple[str, ...] = ()
    #: A manifest item's bucket (``[batch=8]``), named in the label.
    bucket: str = ""
    #: Another release's nearest entry whose portable HLO this release refuses or no
    #: longer promises to call (aot.export_rules): why. None: callable, or not asked.
    export_window: str | None = None

    @property
    def label(self) -> str:
        """``tiny`` or, for a device target, ``tiny@tpu:v5e:1x1``; a manifest item's
        with its bucket, ``mlp.forward[batch=8]`` (as warm-ups name items)."""
        return self.name + self.bucket + (f"@{self.device_target}" if self.device_target else "")

    def _served(self) -> str:
        if self.served_key is None:
            return "; nothing is served for this signature here"
        why = {
            "ref": "its ref names it", "release": f"release {self.release} names it",
        }.get(self.served_by or "", "no ref: the newest entry")
        if self.served_key == self.nearest_key:
            return f" (served: {why})"
        return f"; but aot.load serves {self.served_key[:12]} ({why})"

    def _shown(self, signature: Signature | None, flat: str | None) -> str:
        if signature is not None and signature.has_paths:
            return signature.compact(SIGNATURE_WIDTH)
        return flat or ""

    def describe(self) -> str:
        request = self._shown(self.arguments, self.signature)
        if self.stored == 0:
            close = f" (did you mean {' or '.join(map(repr, self.similar))}?)" if self.similar else ""
            return f"{self.label}: nothing is stored under this name{close}; compile it first"
        if not self.environment_known and not self.differences:
            return (
                f"{self.label} ({request}): entry {self.nearest_key[:12]} matches the program; whether it "  # type: ignore[index]
                f"is for this host cannot be told: {UNKNOWN_ENVIRONMENT_NOTE}"
            )
        if self.refused is not None:
            return (
                f"{self.label} ({request}): miss; entry {self.nearest_key[:12]} matches but is refused: "  # type: ignore[index]
                f"expected an artifact signed with this cache's signing key, got {self.refused}. "
                "Sign it: store it again with the key set (AOT_SIGNING_KEY; aot warmup / aot compile), "
                "or `aot push` it from a cache that signs"
            )
        if self.hit:
            return f"{self.label} ({request}): hit, key {self.nearest_key[:12]}{self._served()}"  # type: ignore[index]
        if self.not_in_release:
            return (
                f"{self.label} ({request}): miss; not served by release {self.release}: entry "
                f"{self.nearest_key[:12]} matches, but the release's set has no member for this "  # type: ignore[index]
                f"signature here (add it in the run that declared the release: aot warmup MANIFEST "
                f"--release {self.release} with that run's --run ID or commit; or promote a set that has it)"
            )
        nearest = self._shown(self.nearest_arguments, self.nearest_signature)
        lines = [
            f"{self.label} ({request}): miss; nearest of {counted(self.stored, 'stored entry')} is "
            f"{self.nearest_key[:12]} ({nearest})"  # type: ignore[index]
        ]
        for d in self.differences:
            if d.part == "in_avals" and self.argument_differences:
                lines += [f"  {leaf.describe()}" for leaf in self.argument_differences]
            else:
                lines.append(f"  {d.describe()}")
        if release_only(self.differences) and self.export_window:
            lines.append(f"  (another JAX release's entry, whose portable HLO {self.export_window})")
        elif release_only(self.differences):
            lines.append(
                "  (another JAX release's entry: aot.load recompiles its portable HLO here within "
                "jax.export's compatibility window, never with strict=True; warm this release up to "
                "serve it strict: docs/jax-releases.md)"
            )
        if not self.environment_known:
            lines.append(f"  (environments not compared: {UNKNOWN_ENVIRONMENT_NOTE})")
        if self.xla_flags_outside_key:
            lines.append(
                f"  (not compared: XLA flags {self.xla_flags_outside_key}, which cannot change "
                "the executable)"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "signature": self.signature,
            "hit": self.hit,
            "nearest_key": self.nearest_key,
            "nearest_signature": self.nearest_signature,
            "differences": [d.to_dict() for d in self.differences],
            "stored": self.stored,
            "arguments": self.arguments.to_list() if self.arguments is not None else [],
            "argument_differences": [d.to_dict() for d in self.argument_differences],
            "xla_flags_outside_key": self.xla_flags_outside_key,
            "served_key": self.served_key,
            "served_by": self.served_by,
            "target": self.device_target,
            **({} if self.release is None else {"release": self.release, "not_in_release": self.not_in_release}),
            **({} if self.environment_known else {"environment_unknown": True}),
            **({} if self.refused is None else {"refused": self.refused}),
            **({} if self.export_window is None else {"export_window": self.export_window}),
            **({"did_you_mean": list(self.similar)} if self.similar else {}),
        }


def explain(
    cache: ArtifactStore, name: str, *args: Any, fn: Callable[..., Any] | None = None,
    statics: Mapping[str, Any] | None = None, release: str | None = None,
    device_target: str | None = None, **lower_kwargs: Any,
) -> Explanation:
    """Compares the request with every entry of ``name``: all program parts when ``fn``
    is given (it is lowered with ``lower_kwargs``), else the input signature of
    ``args`` and the keyword arguments' specs ``lower_kwargs``, and the static values
    ``statics`` (by parameter name) when given; always the environment.

    ``release``: explained for a replica of that label, which serves its members and
    nothing else (a signature it lacks is a miss there); None: the refs. Resolve it
    with :func:`aot.cache.serving.release_rule.served_release`, the rule of ``aot.load``.

    ``device_target`` (``tpu:v5e:1x1``): explained for a replica on that accelerator:
    its environment (needs libtpu, never this host's device; raises
    :class:`aot.DeviceTargetError` without it), and ``fn`` lowered for it."""
    from aot.executable import arg_paths
    from aot.statics import StaticArg

    if device_target is not None:
        from aot.targets import parse_target

        target = parse_target(device_target)
        device_target = target.name
        environment: Fingerprint | None = environment_fingerprint(devices=target.devices())
        if fn is not None:
            lower_kwargs = {**lower_kwargs, "target": device_target}
    else:
        environment = cache.known_environment()  # None: unknown here (the device is not opened)
    request: Signature | None
    if fn is not None:
        pmap = lower_kwargs.pop("pmap", False)  # a pmap item of a manifest (explain_item)
        computation = (lower_pmap if pmap else lower)(fn, *args, name=name, **lower_kwargs)
        program_parts = computation.program_fingerprint.as_dict()
        signature = computation.signature
        paths = arg_paths(computation.in_tree, computation.arg_names)
        request = Signature(tuple(
            ArgLeaf(path, format_aval(a.shape, a.dtype, a.weak_type))
            for path, a in zip(paths, computation.in_avals)
        ), tuple(s.describe() for s in computation.statics))
        positional, keywords = (), {}
        wanted = None
    else:
        positional = tuple(spec(a) for a in args)
        keywords = {k: spec(v) for k, v in lower_kwargs.items()}
        leaves = jax.tree_util.tree_leaves((positional, [keywords[k] for k in sorted(keywords)]))
        signature = ", ".join(format_aval(leaf.shape, leaf.dtype, leaf.weak_type) for leaf in leaves)
        program_parts = {"in_avals": signature}
        request = None  # named after each candidate's own parameter names
        # Static values by name (aot why --static), compared with each entry's statics.
        wanted = None if statics is None else tuple(
            StaticArg.of(None, k, v, where=name).describe() for k, v in sorted(statics.items())
        )
        if wanted:
            signature = ", ".join([signature, *wanted]) if signature else ", ".join(wanted)
    best: tuple[tuple[int, int, int, int], Manifest, tuple[PartDifference, ...], Signature, Signature] | None = None
    entries = list(cache.index.by_name(name, state=None))
    from aot.cache.serving.selection import checked_rows

    refused = dict(
        (entry.key, why) for entry, why in checked_rows(entries, cache.signing_key, cache.require_signatures)[1]
    )
    refs = ref_map(cache.index.refs_named(name))
    members = release_slots(cache, release, (name,)) if release is not None else None

    def serves(slot: Slot) -> str | None:
        """The key served for ``slot`` (by the release's members when one is named)."""
        return served_key(entries, refs, slot) if members is None else members.get(slot)

    here = environment.digest if environment is not None else None
    for entry in entries:
        try:
            manifest = Manifest.from_json(entry.manifest)
        except AotError:
            continue
        stored_parts = manifest.program.as_dict()
        diffs = tuple(
            PartDifference(part, stored_parts.get(part), value)
            for part, value in sorted(program_parts.items())
            if stored_parts.get(part) != value
        ) + (manifest.environment.diff(environment) if environment is not None else ())
        stored_statics = tuple(s.describe() for s in manifest.statics)
        if wanted is not None and tuple(sorted(stored_statics)) != wanted:
            diffs += (PartDifference(
                "statics", ", ".join(stored_statics) or "none", ", ".join(wanted) or "none"
            ),)
        if not entry.ok:
            diffs += (PartDifference("state", "ok", entry.state),)
        stored_signature = Signature.from_manifest_args(manifest.args, manifest.statics)
        mine = request if request is not None else Signature.from_specs(
            positional, keywords, manifest.arg_names or _names_from_paths(manifest)
        )
        if request is None and wanted:
            mine = Signature(mine.leaves, wanted)
        leaf_diffs = leaf_differences(stored_signature, mine)
        # Among equally near entries, the one served for its signature.
        served_here = here is not None and serves((name, entry.signature, here)) == entry.key
        score = (len(diffs), len(leaf_diffs), sum(d.distance() for d in leaf_diffs), 0 if served_here else 1)
        if best is None or score < best[0]:
            best = (score, manifest, diffs, stored_signature, mine)
    outside = xla_flags_outside_key()
    if best is None:
        import difflib

        shown = request if request is not None else Signature.from_specs(positional, keywords)
        similar = tuple(difflib.get_close_matches(name, cache.names(), n=3)) if not entries else ()
        return Explanation(
            name, signature, False, None, None, (), len(entries), shown,
            xla_flags_outside_key=outside, environment_known=environment is not None,
            device_target=device_target, similar=similar,
        )
    _, manifest, diffs, stored_signature, mine = best
    leaf_diffs = (
        leaf_differences(stored_signature, mine)
        if any(d.part == "in_avals" for d in diffs) else ()
    )
    slot = (name, manifest.signature, here)
    served = serves((name, manifest.signature, here)) if here is not None else None
    if members is not None:
        served_by = "release" if served is not None else None
    else:
        served_by = ("ref" if slot in refs else "newest") if here is not None else None
    matches = not diffs and environment is not None
    missing_in_release = matches and members is not None and served is None
    refusal = refused.get(manifest.key) if matches else None
    parts = {d.part for d in diffs}
    window = None
    if parts & {"jax", "jaxlib"} and parts <= {"jax", "jaxlib", "platform_version"}:
        window = _export_window(cache, manifest)
    return Explanation(
        name, signature, matches and not missing_in_release and refusal is None, manifest.key, manifest.signature, diffs,
        len(entries), mine, stored_signature, leaf_diffs, xla_flags_outside_key=outside,
        served_key=served, served_by=served_by, environment_known=environment is not None,
        release=release, not_in_release=missing_in_release, refused=refusal, device_target=device_target,
        export_window=window,
    )


def _export_window(cache: ArtifactStore, manifest: Manifest) -> str | None:
    """Why this JAX release refuses (or no longer promises to call) the portable HLO of
    another release's entry the fallback ladder would recompile; None: it calls it."""
    from aot.artifact import PORTABLE_HLO
    from aot.export_rules import judge, refresh_advice

    entry = cache.lookup(manifest.key)
    if entry is None or entry.hlo_digest is None:
        return None
    try:
        blob = cache.artifact(entry, roles=(PORTABLE_HLO,)).blob(PORTABLE_HLO)
    except AotError:
        return None
    verdict = judge(blob, manifest.jax_version, jax.__version__)
    if verdict is None or verdict.status is None:
        return None
    what = "aot.load refuses it" if verdict.refused else "aot.load recompiles it with a warning"
    return f"is {verdict.status} for jax {jax.__version__}: {verdict.describe()}; {what}: {refresh_advice(jax.__version__)}"


def explain_item(cache: ArtifactStore, item: WarmupItem, *, release: str | None = None) -> Explanation:
    """Explains ``item`` (a warm-up manifest's entry, or the one ``aot why``'s options
    describe) lowered exactly as the warm-up lowers it (:func:`prepare`: the same mesh
    over the same devices, shardings, donation, statics, x64 mode and device target), so
    that its key is the one the warm-up stored: every program part and the environment
    of its target (else this host's) are compared."""
    from aot.cache.warmup.functions import prepare, x64_hint, x64_mode

    with x64_mode(item):
        prepared = prepare(item)
        options = {k: v for k, v in prepared.options.items() if k not in ("name", "target")}
        try:
            explanation = explain(
                cache, item.name, *prepared.args, fn=prepared.fn, release=release,
                device_target=item.device_target, **options,
            )
        except SpecError as exc:  # e.g. a 64-bit dtype refused while lowering
            raise x64_hint(item, exc) from None
    bucket = f"[{','.join(f'{k}={v}' for k, v in item.bucket)}]" if item.bucket else ""
    return dataclasses.replace(explanation, bucket=bucket)


def _names_from_paths(manifest: Manifest) -> tuple[str, ...]:
    """Positional parameter names of a manifest written without ``arg_names``."""
    from aot.signatures import path_head

    names: list[str] = []
    for arg in manifest.args:
        head = path_head(str(arg.get("path", "")))
        if head and head not in names:
            names.append(head)
    return tuple(names)
