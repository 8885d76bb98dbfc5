"""JAX 0.11.1+'s export rules as the commands show them (docs/jax-releases.md): ``aot
verify --jax-release`` lists an entry whose portable HLO that release refuses, ``aot
warmup --refresh-exports`` exports it again (the executable kept), and the fallback
ladder refuses it as ``aot.ExportWindowError`` in one line on a release that refuses it.

The old export is a real export of this JAX in the layout of serialization formats
before 5 (tests/aot/export_blobs.py), which JAX 0.11.1+ itself refuses."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np
import pytest

import aot
from aot.artifact import EXECUTABLE, PORTABLE_HLO, Artifact
from aot.cache.index.refs import RefOrigin
from aot.cache.warmup.refresh import replace_portable_hlo
from aot.export_rules import RELEASE_DATES, newest_release, window_start
from aot.fingerprint import Fingerprint, combined_key
from aot.jaxcompat.versions import release_tuple
from tests.aot.export_blobs import old_format_export
from tests.cli.helpers import MANIFEST, Invoke

pytestmark = pytest.mark.version_suite

NEWEST = newest_release()
OLD = "before 2025-11-23"
#: A refresh for the newest release needs this release's exports inside its window
#: (0.10.1 and later for 0.12.1); on older ones each entry "could not be refreshed".
refreshes = pytest.mark.skipif(
    RELEASE_DATES[jax.__version__] < window_start(NEWEST),
    reason=f"jax {jax.__version__}'s own exports are outside jax {NEWEST}'s window: nothing it exports refreshes them",
)


def _age_tiny(cache_dir: Path) -> str:
    """Replaces the stored portable HLO of ``tiny`` with the same export in the pre-5
    layout, as an old cache holds it; its key."""
    with aot.Cache(cache_dir) as cache:
        [entry] = cache.entries("tiny")
        hlo = cache.artifact(entry, roles=(PORTABLE_HLO,)).blob(PORTABLE_HLO)
        return replace_portable_hlo(cache, entry, old_format_export(hlo)).key


def _digests(cache_dir: Path, key: str) -> tuple[str, str]:
    with aot.Cache(cache_dir) as cache:
        manifest = cache.artifact(key, roles=()).manifest
        return manifest.blobs[EXECUTABLE].digest, manifest.blobs[PORTABLE_HLO].digest


@refreshes
def test_verify_lists_the_expired_export_and_the_warmup_refreshes_it(invoke: Invoke, warmed) -> None:
    assert invoke("verify", "--jax-release", NEWEST).exit_code == 0  # fresh exports: nothing listed
    key = _age_tiny(warmed)
    executable, old_hlo = _digests(warmed, key)
    with aot.Cache(warmed) as cache:  # expired is not corrupt: nothing quarantined, the executable serves
        assert cache.verify().ok and cache.entries("tiny")[0].state == "ok"

    result = invoke("verify", "--jax-release", NEWEST)
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    head = [line for line in lines if line.startswith(f"portable HLO for jax {NEWEST}")]
    assert head == [f"portable HLO for jax {NEWEST} (window from 2026-05-18): 5 entries checked, "
                    "1 refused or outside the window"]
    listed = lines[lines.index(head[0]) + 1]
    assert listed.startswith(f"  tiny (f32[8], f32[8]) {key[:12]} jax {jax.__version__}: refused: "
                             f"serialization format older than 5 ({OLD}), serialization format < 5: ")
    assert f"which jax {NEWEST} refuses" in listed and "window (from 2026-05-18)" in listed
    assert "aot warmup MANIFEST --refresh-exports" in lines[lines.index(head[0]) + 2]
    data = json.loads(invoke("verify", "--jax-release", NEWEST, "--json").stdout)["exports"]
    assert (data["release"], data["checked"], data["ok"]) == (NEWEST, 5, False)
    [entry] = data["entries"]
    assert (entry["key"], entry["status"], entry["made"], entry["window_start"]) == (key, "refused", None, "2026-05-18")
    # 0.11.0 reads the old layout: outside its window only.
    older = json.loads(invoke("verify", "--jax-release", "0.11.0", "--json").stdout)["exports"]["entries"]
    assert [(e["key"], e["status"], e["refused"]) for e in older] == [(key, "expired", [])]

    warm = invoke("warmup", str(MANIFEST), "--refresh-exports")
    assert warm.exit_code == 0, warm.output
    assert warm.stdout.splitlines()[-1].endswith(f"; 1 export refreshed for jax {NEWEST}")
    assert f"refreshed the export of tiny {key[:12]} for jax {NEWEST} (was: " in warm.stdout
    assert " 0 compiled, 5 hit" in warm.stdout  # nothing compiled again
    after_exe, new_hlo = _digests(warmed, key)
    assert after_exe == executable and new_hlo != old_hlo  # the same executable, a new export
    assert invoke("verify", "--jax-release", NEWEST).exit_code == 0
    again = invoke("warmup", str(MANIFEST), "--refresh-exports", "--json")
    assert json.loads(again.stdout)["refreshed_exports"] == []  # nothing left to refresh
    with aot.Cache(warmed) as cache:
        assert cache.verify().ok


def test_an_unknown_release_is_a_usage_error(invoke: Invoke, warmed) -> None:
    result = invoke("verify", "--jax-release", "0.99.0")
    assert result.exit_code == 2 and "does not know the export rules of JAX 0.99.0" in result.output


def test_the_ladder_refuses_an_expired_export_in_one_line(invoke: Invoke, warmed, tmp_path, caplog) -> None:  # noqa: ANN001
    """The old export stored with another release's entry, the only entry of its name."""
    _age_tiny(warmed)
    other = "0.10.1" if jax.__version__ != "0.10.1" else "0.10.0"
    with aot.Cache(warmed) as cache:
        [here] = cache.entries("tiny")
        artifact = cache.artifact(here)
    m = artifact.manifest
    environment = Fingerprint.of("environment", m.environment.as_dict() | {"jax": other, "jaxlib": other})
    foreign = replace(m, environment=environment, key=combined_key(m.program, environment),
                      jax_version=other, jaxlib_version=other, hmac=None)
    fleet = tmp_path / "fleet"
    with aot.Cache(fleet) as cache:
        stored = cache.put_artifact(Artifact(foreign, artifact.blobs))
        cache.set_refs([stored], RefOrigin(f"warm-up on a host of jax {other}"))
    why = invoke("why", "tiny", "--arg", "f32[8]", "--arg", "f32[8]", cache=fleet)
    status = "refused" if release_tuple(jax.__version__) >= (0, 11, 1) else "expired"
    assert f"(another JAX release's entry, whose portable HLO is {status} for jax {jax.__version__}: " in why.stdout
    assert "--refresh-exports" in why.stdout
    inputs = (np.arange(8, dtype=np.float32), np.ones(8, dtype=np.float32))
    if release_tuple(jax.__version__) >= (0, 11, 1):  # this JAX refuses the format
        with pytest.raises(aot.ExportWindowError) as info:
            aot.load("tiny", cache=str(fleet))(*inputs)
        message = str(info.value)
        assert "\n" not in message and isinstance(info.value, aot.AotError)
        assert "has expired for this release: its device count is only in the 16-bit field" in message
        assert f"(serialization format older than 5 ({OLD}); jax {jax.__version__}'s window starts " in message
        assert "run `aot warmup MANIFEST --refresh-exports` where the model's code is" in message
    else:  # this JAX reads it: served, with a warning naming the refresh
        with caplog.at_level(logging.WARNING, logger="aot.export_window"):
            out = aot.load("tiny", cache=str(fleet))(*inputs)
        assert np.asarray(out).shape == (8,)
        assert "is outside jax.export's window" in caplog.text and "--refresh-exports" in caplog.text


@refreshes
def test_each_shard_refreshes_its_own_entries(warmed) -> None:  # noqa: ANN001
    """--shard I/N: results are indexed by manifest position, and so is the refresh."""
    from aot.cache.warmup.run import expand, load_manifest, run_warmup

    key = _age_tiny(warmed)
    items = expand(load_manifest(MANIFEST))
    reports = [run_warmup(str(warmed), items, shard=(i, 2), refresh_exports=NEWEST) for i in (1, 2)]
    refreshed = [r for report in reports for r in report.refreshed]
    assert [(r.key, r.label, r.refreshed) for r in refreshed] == [(key, "tiny", True)]
    assert all(report.ok and report.compiled == 0 for report in reports)
    with aot.Cache(warmed) as cache:
        assert cache.verify().ok
