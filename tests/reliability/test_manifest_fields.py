"""Every manifest field is checked before XLA sees it.

An unsigned manifest is only as trustworthy as the index row it sits in. Each field of
a stored manifest is mutated in turn, through the index row, as an attacker (or a bad
copy) with write access to the index would; then the entry is loaded directly, run
through ``aot verify`` and served with ``aot.load``. The loads run in a child process
(manifest_field_worker.py): a mutation that made XLA abort fails one test, with the
case named, instead of killing the test run.

What must hold for every case: nothing aborts, nothing raises anything but an
``AotError``, and every output a caller receives carries the right values, dtype,
shape, devices, sharding and memory kind. Per field, docs/reliability.md's table says
whether it is covered by the key, cross-checked, or harmless; the expectations below
are that table.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aot
from aot.artifact import EXECUTABLE, FORMAT_VERSION, PORTABLE_HLO, Manifest
from aot.cache.cache import Cache
from aot.build import build_artifact

from tests.reliability.helpers import HERE, TinyArtifacts, child_env

WORKER = HERE / "manifest_field_worker.py"
KEY = "manifest-fields-key"
MESH_NAME = "rel.fields.mesh"


def mesh_program(x, y, unused):  # noqa: ANN001, ANN201 - two outputs, a dead argument
    return {"a": x * 2.0 + y, "b": jnp.sum(x, axis=1).astype(jnp.int32)}


def _mesh_artifact(rows: int) -> Any:
    mesh = jax.make_mesh((4, 2), ("a", "b"))
    computation = aot.lower(
        mesh_program, aot.spec(f"f32[{rows},4]"), aot.spec(f"f32[{rows},4]"), aot.spec("f32[3]"),
        name=MESH_NAME, donate_argnums=(1,),
        in_shardings=(NamedSharding(mesh, P("a", "b")), NamedSharding(mesh, P()), None),
        out_shardings={"a": NamedSharding(mesh, P("a")), "b": None},
    )
    executable = computation.compile()
    return build_artifact(executable, computation.portable_hlo(executable))


@pytest.fixture(scope="module")
def mesh_artifacts() -> dict[int, Any]:
    return {rows: _mesh_artifact(rows) for rows in (8, 16)}


# ---------------------------------------------------------------- mutations


def _tampered(value: Any) -> Any:
    """A different value of the same type (nested: the first leaf changed)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.5
    if isinstance(value, str):
        if len(value) == 64 and all(c in "0123456789abcdef" for c in value):
            return value[:-1] + ("0" if value[-1] != "0" else "1")
        return value + "x"
    if isinstance(value, list):
        return [_tampered(value[0]), *value[1:]] if value else [0]
    if isinstance(value, dict):
        if not value:
            return {"x": 1}
        first = sorted(value)[0]
        return {**value, first: _tampered(value[first])}
    if value is None:
        return {"flops": 1.0}
    raise TypeError(value)


def _edit(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def apply(manifest: dict[str, Any]) -> dict[str, Any]:
        changed = copy.deepcopy(manifest)
        fn(changed)
        return changed
    return apply


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def assign(manifest: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = manifest
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        slot = int(last) if isinstance(node, list) else last
        node[slot] = value(node[slot]) if callable(value) else value
    return _edit(assign)


def semantic_cases(manifest: dict[str, Any], donor: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """The mutations an attacker would choose: each changes what XLA or the caller
    acts on, while the key (over the fingerprints) stays the same."""
    n_dev = len(manifest["device_ids"])
    first_out = manifest["out_avals"][0]
    shape = first_out["shape"]
    cases: dict[str, Callable[..., Any]] = {
        "device_ids: another device": _set("device_ids", [3] if n_dev == 1 else manifest["device_ids"][::-1]),
        "device_ids: a device this host does not have": _set("device_ids", [99] * n_dev),
        "out_avals[0].dtype: float32 -> int32": _set("out_avals.0.dtype", "int32"),
        "out_avals[0].shape: first dim halved": _set("out_avals.0.shape", [shape[0] // 2, *shape[1:]]),
        "out_avals[0].shape: first dim + 1": _set("out_avals.0.shape", [shape[0] + 1, *shape[1:]]),
        "out_avals[0].weak_type: true": _set("out_avals.0.weak_type", True),
        "in_avals[0].dtype": _set("in_avals.0.dtype", "int32"),
        "in_avals[0].weak_type: true": _set("in_avals.0.weak_type", True),
        "out_shardings[0].memory_kind: pinned_host": _set("out_shardings.0.memory_kind", "pinned_host"),
        "in_shardings[0].memory_kind: pinned_host": _set("in_shardings.0.memory_kind", "pinned_host"),
        "args[0].donated: flipped": _set("args.0.donated", lambda a: not a),
        "args[0].kept: flipped": _set("args.0.kept", lambda a: not a),
        "args[0].path: renamed": _set("args.0.path", "renamed"),
        "committed: flipped": _set("committed", lambda c: not c),
        "name: another name": _set("name", "another.name"),
        "blobs.executable: another program's executable": _set(
            "blobs.executable", donor["blobs"][EXECUTABLE]
        ),
        "blobs.portable_hlo: another program's portable HLO": _set(
            "blobs.portable_hlo", donor["blobs"][PORTABLE_HLO]
        ),
        "blobs.executable.size": _set("blobs.executable.size", lambda s: s + 1),
        "in_tree: an extra tuple level": _set("in_tree", {"t": "tuple", "c": [manifest["in_tree"]]}),
        "out_tree: an extra tuple level": _set("out_tree", {"t": "tuple", "c": [manifest["out_tree"]]}),
    }
    if n_dev == 1:
        cases["in_shardings[0].device: 3"] = _set("in_shardings.0.device", 3)
        cases["out_shardings[0].device: 3"] = _set("out_shardings.0.device", 3)
    else:
        cases["in_shardings[0].spec: axes swapped"] = _set("in_shardings.0.spec", ["b", "a"])
        cases["in_shardings[0].mesh: devices reversed"] = _set(
            "in_shardings.0.mesh.device_ids", lambda ids: ids[::-1]
        )
        cases["out_shardings[0].spec: replicated"] = _set("out_shardings.0.spec", [])
        cases["out_shardings[1]: another placement"] = _set(
            "out_shardings.1", {"type": "gspmd", "device_ids": manifest["device_ids"],
                                "hlo": "{devices=[8]<=[8]}", "memory_kind": "device"}
        )
    return cases


def all_cases(manifest: dict[str, Any], donor: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every field and every direct child of a mapping (type-preserving), then the
    semantic mutations; mutations the reader cannot see (a fingerprint's digest is
    recomputed from its parts) are left out."""
    parsed = Manifest.from_dict(manifest).to_dict()
    out: list[tuple[str, dict[str, Any]]] = []
    for field in sorted(manifest):
        changed = copy.deepcopy(manifest)
        # A format within the readable ones only names another layout of the same
        # fields (entries are written at the lowest that carries them): the change
        # that matters is one this jax-aot does not read.
        changed[field] = FORMAT_VERSION + 1 if field == "format_version" else _tampered(manifest[field])
        out.append((field, changed))
        # every direct child of a mapping, except the analyses' counters (all alike)
        if isinstance(manifest[field], dict) and field not in ("cost_analysis", "memory_analysis"):
            for sub in sorted(manifest[field]):
                changed = copy.deepcopy(manifest)
                changed[field][sub] = _tampered(manifest[field][sub])
                out.append((f"{field}.{sub}", changed))
    out += [(label, edit(manifest)) for label, edit in semantic_cases(manifest, donor).items()]
    kept = []
    for label, changed in out:
        assert changed != manifest, label
        try:
            if Manifest.from_dict(changed).to_dict() == parsed:
                continue  # derived: the manifest the loader sees is unchanged
        except aot.AotError:
            pass
        kept.append((label, changed))
    return kept


# ---------------------------------------------------------------- expectations

# Fields nothing executes: display, statistics, error messages (docs/reliability.md).
HARMLESS = (
    "arg_names", "compile_seconds", "cost_analysis", "created_at", "memory_analysis",
    "xla_name", "args[0].path", "in_avals[0].weak_type",
)
# Not checkable (neither XLA nor jax.export records weak types): the values, dtype,
# shape and placement are right, the weak-type label follows the manifest. Only a
# signature catches it (docs/reliability.md, known limits).
WEAK_OUTPUT = "out_avals[0].weak_type: true"
# The portable HLO is read only to recompile: serving is unaffected, verify reports it.
HLO_ONLY = ("blobs.portable_hlo", "blobs.portable_hlo.digest", "blobs.portable_hlo.size",
            "blobs.portable_hlo: another program's portable HLO")
# Refused and cannot be healed: the key's own fields (the manifest no longer parses,
# so nothing in it is trusted), and the pytree structure (it lives only in the
# manifest; the portable HLO is exported flat).
UNHEALABLE = ("environment", "key", "kind", "program", "signature", "in_tree", "out_tree")
# Refused and skipped, never quarantined by a server: a format version this jax-aot
# does not read is what another (newer) jax-aot writes into a shared cache, so a
# serving process cannot tell it from damage (an entry that cannot load here
# is skipped); `aot verify` reports it.
OTHER_VERSION = ("format_version",)
# The issue's reproductions: each must be refused as corruption, then healed.
ISSUE_CASES = (
    "device_ids: another device", "device_ids: a device this host does not have", "out_avals[0].dtype: float32 -> int32",
    "out_avals[0].shape: first dim halved", "out_avals[0].shape: first dim + 1",
)


# Labels a mutation of that kind may change: the weak type (not checkable), and
# whether outputs are committed to their device (on one device with no sharding
# asked for, either is a valid program: docs/reliability.md, "partially checkable").
IGNORED = {"weak": ("weak_type",), "placement": ("committed",)}


def expectation(label: str, program: str) -> str:
    if label.split(":")[0] in HARMLESS or label.startswith(("cost_analysis.", "memory_analysis.")):
        return "harmless"
    if label == "committed: flipped" or label == "committed":
        # one device, nothing asked for: either value is possible (docs: partially checkable)
        return "placement" if program == "single" else "healed"
    if label == WEAK_OUTPUT:
        return "weak"
    if label in HLO_ONLY:
        return "hlo-only"
    if label.split(".")[0].split(":")[0] in OTHER_VERSION:
        return "other-version"
    if label.split(".")[0].split(":")[0] in UNHEALABLE:
        return "unhealable"
    return "healed"


# ---------------------------------------------------------------- the test


def _run(location: Path, key: str, signing: str | None, cases: list[tuple[str, Any]], tmp: Path) -> tuple[dict, dict[str, dict]]:
    cases_file = tmp / "cases.json"
    cases_file.write_text(json.dumps(cases))
    proc = subprocess.run(
        [str(Path(__import__("sys").executable)), str(WORKER), str(location), key, signing or "-", str(cases_file)],
        env=child_env(), capture_output=True, text=True, timeout=900,
    )
    lines = proc.stdout.splitlines()
    started = [line[6:] for line in lines if line.startswith("START ")]
    results = {}
    expected = None
    for line in lines:
        if line.startswith("{"):
            data = json.loads(line)
            if "expected" in data:
                expected = data["expected"]
            else:
                results[data["case"]] = data
    if proc.returncode != 0 or len(results) != len(cases):
        last = started[-1] if started else "(before the first case)"
        pytest.fail(
            f"the worker died (exit {proc.returncode}) in case {last!r}; "
            f"{len(results)} of {len(cases)} cases done\n{proc.stderr[-3000:]}"
        )
    assert expected is not None
    return expected, results


def _diff(got: Any, expected: dict) -> Any:
    if not isinstance(got, dict):
        return got
    return [
        (i, k, g.get(k), e.get(k))
        for i, (g, e) in enumerate(zip(got["leaves"], expected["leaves"]))
        for k in e if g.get(k) != e.get(k)
    ] or [got.get("structure"), expected.get("structure")]


def _same_output(got: Any, expected: dict, *, ignore: tuple[str, ...] = ()) -> bool:
    """Same values and labels (``ignore``: labels the mutated field legitimately sets)."""
    if not isinstance(got, dict):
        return False
    if ignore:
        got = {**got, "leaves": [{**l, **dict.fromkeys(ignore)} for l in got["leaves"]]}
        expected = {**expected, "leaves": [{**l, **dict.fromkeys(ignore)} for l in expected["leaves"]]}
    return got == expected


@pytest.mark.parametrize("signing", [None, KEY], ids=["unsigned", "signed"])
@pytest.mark.parametrize("program", ["single", pytest.param("mesh", marks=pytest.mark.slow)])
def test_every_manifest_field_mutated_in_the_index(
    program: str, signing: str | None, tmp_path: Path, tiny: TinyArtifacts,
    request: pytest.FixtureRequest,
) -> None:
    if program == "single":
        target, donor = tiny.by_size[8], tiny.by_size[4]
    else:
        artifacts = request.getfixturevalue("mesh_artifacts")
        target, donor = artifacts[8], artifacts[16]
    location = tmp_path / "cache"
    with Cache(location, signing_key=signing) as cache:
        cache.put_artifact(target)
        cache.put_artifact(donor)  # its blobs are what a swap points at
        entry = cache.index.get(target.manifest.key)
        original = json.loads(entry.manifest)
    cases = all_cases(original, donor.manifest.to_dict())
    assert len(cases) > 35, len(cases)
    expected, results = _run(location, target.manifest.key, signing, cases, tmp_path)

    outcomes: dict[str, str] = {}
    for label, _ in cases:
        r = results[label]
        kind = expectation(label, program)
        for stage in ("direct", "served"):
            value = r[stage]
            assert not (isinstance(value, str) and value.startswith("ERROR")), (label, stage, value)
            if isinstance(value, dict):  # whatever was served carries the right labels
                assert _same_output(value, expected, ignore=IGNORED.get(kind, ())), (
                    label, stage, _diff(value, expected))
        refused = isinstance(r["direct"], str)
        assert not any(p.startswith("ERROR") for p in r["verify"]), (label, r["verify"])
        if refused:
            assert r["verify"], f"{label}: the loader refuses it but verify says ok"
        outcomes[label] = r["direct"].split(":")[1].strip() if refused else "served"
        if signing is not None:
            # a signature covers every field: refused before XLA, never compiled from
            assert refused, (label, r["direct"])
            assert ("IntegrityError" in r["direct"] or "CorruptArtifactError" in r["direct"]
                    or "IncompatibleEnvironmentError" in r["direct"]), (label, r["direct"])
            continue
        if kind in ("harmless", "placement"):
            ignore = IGNORED.get(kind, ())
            assert _same_output(r["direct"], expected, ignore=ignore), (label, _diff(r["direct"], expected))
            assert r["verify"] == [], (label, r["verify"])
            assert _same_output(r["served"], expected, ignore=ignore), (label, _diff(r["served"], expected))
        elif kind == "weak":
            assert not refused and r["verify"] == [], (label, r)
        elif kind == "hlo-only":
            assert _same_output(r["direct"], expected), (label, _diff(r["direct"], expected))
            assert r["verify"], f"{label}: verify must report the portable HLO"
        elif kind == "other-version":
            assert refused and "IncompatibleEnvironmentError" in r["direct"], (label, r["direct"])
            assert isinstance(r["served"], str) and r["served"].startswith("refused"), (label, r["served"])
            assert r["row_state"] == "ok", (label, r["row_state"])
        elif kind == "unhealable":
            assert refused, (label, r["direct"])
            assert isinstance(r["served"], str) and r["served"].startswith("refused"), (label, r["served"])
            assert r["row_state"] == "quarantined", (label, r["row_state"])
        else:  # refused as corruption, then recompiled from the portable HLO
            assert refused, (label, r["direct"])
            assert "CorruptArtifactError" in r["direct"] or "IncompatibleEnvironmentError" in r["direct"], (label, r["direct"])
            assert _same_output(r["served"], expected), (label, _diff(r["served"], expected))
            assert r["row_state"] == "ok" and r["row_problems"] == [], (label, r["row_state"], r["row_problems"])
    if signing is None:
        for label in ISSUE_CASES:
            assert results[label]["direct"].startswith("refused: CorruptArtifactError"), results[label]["direct"]
    print(f"{program} {'signed' if signing else 'unsigned'}: {len(cases)} mutated manifests: "
          + ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())))
