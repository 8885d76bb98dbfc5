"""Bundles to and from object-store URLs, standard output/input, and their file mode."""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

import aot
from aot.cache.admin.bundle import MAGIC

from tests.cli.helpers import REPO, Invoke, one_line_error


def test_bundle_through_s3(invoke: Invoke, warmed, s3_bucket: str, tmp_path: Path) -> None:  # noqa: ANN001
    url = f"s3://{s3_bucket}/bundles/models.aotb"
    exported = invoke("bundle", "export", url)
    assert exported.exit_code == 0, exported.output
    assert exported.stdout.startswith(f"exported 5 entries to {url} (")
    assert not (REPO / "s3:").exists() and not Path("s3:").exists()  # no local folder "s3:"
    imported = invoke("bundle", "import", url, cache=tmp_path / "served")
    assert imported.exit_code == 0, imported.output
    assert imported.stdout == f"imported 5 entries from {url} (0 already present)\nrefs: 5 set\n"
    assert len(aot.Cache(tmp_path / "served").entries()) == 5
    report = json.loads(invoke("bundle", "import", url, "--json", cache=tmp_path / "served").stdout)
    assert report["path"] == url and len(report["skipped"]) == 5 and report["bytes"] > 0


def test_missing_bundle_object_and_bucket(invoke: Invoke, warmed, s3_bucket: str) -> None:  # noqa: ANN001
    line = one_line_error(invoke("bundle", "import", f"s3://{s3_bucket}/none.aotb"))
    assert line.startswith(f"Error: cannot read bundle s3://{s3_bucket}/none.aotb: no such object")
    line = one_line_error(invoke("bundle", "export", f"s3://aot-no-bucket-{secrets.token_hex(4)}/x.aotb"))
    assert "no such bucket" in line


def test_bundle_through_stdout_and_stdin(invoke: Invoke, warmed, tmp_path: Path) -> None:  # noqa: ANN001
    exported = invoke("bundle", "export", "-", "mlp.*")
    assert exported.exit_code == 0, exported.stderr
    data = exported.stdout_bytes
    assert data.startswith(MAGIC)
    assert exported.stderr.startswith("exported 3 entries to <stdout> (")
    assert not Path("-").exists()
    as_json = invoke("bundle", "export", "-", "tiny", "--json")
    assert as_json.stdout_bytes.startswith(MAGIC)
    assert json.loads(as_json.stderr)["path"] == "<stdout>"
    imported = invoke("bundle", "import", "-", cache=tmp_path / "served", input=data)
    assert imported.exit_code == 0, imported.output
    assert imported.stdout == "imported 3 entries from <stdin> (0 already present)\nrefs: 3 set\n"
    line = one_line_error(invoke("bundle", "import", "-", cache=tmp_path / "x", input=b"junk"))
    assert line == "Error: <stdin> is not a jax-aot bundle (bad magic)"


def test_bundle_file_is_world_readable(invoke: Invoke, warmed, tmp_path: Path) -> None:  # noqa: ANN001
    old = os.umask(0o077)
    try:
        assert invoke("bundle", "export", tmp_path / "m.aotb").exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.aotb").stat().st_mode) == 0o644


def test_unsupported_url_is_refused(invoke: Invoke, warmed) -> None:  # noqa: ANN001
    line = one_line_error(invoke("bundle", "export", "ftp://host/x.aotb"))
    assert line.startswith("Error: unsupported object-store URL 'ftp://host/x.aotb': expected one of")
    assert not (REPO / "ftp:").exists()


def test_library_bundle_through_memory_url(warmed, tmp_path: Path) -> None:  # noqa: ANN001
    url = f"memory://aot-test-{secrets.token_hex(4)}/x.aotb"
    report = aot.Cache(warmed).export_bundle(url, "tiny")
    assert report.path == url and len(report.entries) == 1
    served = aot.Cache(tmp_path / "served")
    assert len(served.import_bundle(url).imported) == 1
    assert [e.name for e in served.entries()] == ["tiny"]


def test_library_takes_a_url_even_through_pathlib(warmed, tmp_path: Path) -> None:  # noqa: ANN001
    # Path("memory://b/x") is "memory:/b/x": still the URL, never a local folder.
    url = f"memory://aot-test-{secrets.token_hex(4)}/x.aotb"
    report = aot.Cache(warmed).export_bundle(Path(url), "tiny")
    assert report.path == url
    assert len(aot.Cache(tmp_path / "served").import_bundle(Path(url)).imported) == 1
    local = tmp_path / "s3:" / "x.aotb"  # an absolute (or ./) path is always local
    report = aot.Cache(warmed).export_bundle(local, "tiny")
    assert report.path == str(local) and local.is_file()
