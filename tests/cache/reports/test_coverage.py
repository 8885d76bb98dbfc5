"""check_coverage: each manifest item is looked up in the environment it is compiled
for, its device target's or this host's, in one manifest (what `aot verify --manifest`
reports)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import aot
from aot.cache.reports.coverage import check_coverage
from aot.cache.warmup.manifest import expand, load_manifest
from aot.cache.warmup.run import run_warmup
from tests.aot.test_targets import needs_libtpu
from tests.cli.helpers import REPO

MANIFEST = '''
[[function]]
name = "tiny"
function = "fixtures.models:tiny"
args = ["f32[8]", "f32[8]"]
'''


@needs_libtpu
def test_host_and_target_items_each_checked_in_their_environment(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.syspath_prepend(str(REPO))
    path = tmp_path / "m.toml"
    path.write_text(MANIFEST, encoding="utf-8")
    (host,) = expand(load_manifest(path))
    on_1x1 = dataclasses.replace(host, device_target="tpu:v5e:1x1")
    on_2x2 = dataclasses.replace(host, device_target="tpu:v5e:2x2")
    cache = aot.Cache(tmp_path / "cache")
    try:
        assert run_warmup(cache, [host, on_1x1], jobs=1).ok

        report = check_coverage(cache, [host, on_1x1, on_2x2], manifest="m.toml", strict=True, lower=True)
        assert [m.item.label for m in report.missing] == ["tiny@tpu:v5e:2x2"]
        assert report.missing[0].reason.startswith("stored for another environment")
        assert report.stale == () and report.failed
        assert report.summary() == "m.toml: 1 of 3 entries missing for this environment, tpu:v5e:1x1 and tpu:v5e:2x2:"
        data = report.to_dict()
        assert data["targets"] == ["tpu:v5e:1x1", "tpu:v5e:2x2"] and data["host"] is True
        assert data["missing"][0]["target"] == "tpu:v5e:2x2"

        covered = check_coverage(cache, [on_1x1], manifest="m.toml", strict=True, lower=True)
        assert not covered.failed and covered.summary() == "m.toml: the 1 entry is stored for tpu:v5e:1x1"
    finally:
        cache.close()
