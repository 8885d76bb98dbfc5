"""A damaged index is named and repaired (issue 49); a cache on a read-only file system
is read (issue 52).

The damage is real: pages of a real index file overwritten, or the file truncated.
Which rows are lost is asked of SQLite itself (a row it cannot read by its key), and
``aot repair`` must recover exactly the others, keep the release and the statistics,
and name what it lost.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest

import aot
from aot.cache.index.refs import RefOrigin
from aot.cache.storage.folder import blob_path
from tests.cli.helpers import Invoke, one_line_error


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _prepare(cache_dir: Path) -> tuple[list[str], np.ndarray]:
    """A release over every entry and one counted call of ``tiny``; the keys, in rowid
    order, and what the call returned."""
    with aot.Cache(cache_dir) as cache:
        entries = cache.entries()
        label = cache.index.open_release("prod", RefOrigin("ci", commit="c1"))
        cache.set_refs(entries, RefOrigin("ci"), release_id=label)
    with aot.Cache(cache_dir) as cache:
        fn = aot.load("tiny", cache=cache, strict=True)
        out = np.asarray(fn(np.arange(8, dtype=np.float32), np.ones(8, np.float32)))
    conn = sqlite3.connect(cache_dir / "index.sqlite")
    try:
        return [k for (k,) in conn.execute("SELECT key FROM artifacts ORDER BY rowid")], out
    finally:
        conn.close()


#: What a rebuilt row must hold as the lost one did (its times are the manifest's).
_ROW = "key, name, program_fp, env_fp, signature, platform, manifest, exe_digest, hlo_digest, raw_size, stored_size, " \
       "compile_seconds, state, manifest_digest"


def _rows(index: Path) -> dict[str, tuple[object, ...]]:
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        return {row[0]: tuple(row) for row in conn.execute(f"SELECT {_ROW} FROM artifacts")}
    finally:
        conn.close()


def _corrupt_first_artifacts_leaf(index: Path) -> list[str]:
    """Overwrites the first leaf page of the artifacts table; the keys SQLite can no
    longer read."""
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        (page,) = conn.execute(
            "SELECT min(pageno) FROM dbstat WHERE name = 'artifacts' AND pagetype = 'leaf'"
        ).fetchone()
        keys = [k for (k,) in conn.execute("SELECT key FROM artifacts INDEXED BY sqlite_autoindex_artifacts_1 ORDER BY key")]
    finally:
        conn.close()
    with open(index, "r+b") as f:
        f.seek((page - 1) * page_size)
        f.write(bytes(range(256)) * (page_size // 256))
    conn = sqlite3.connect(f"file:{index}?mode=ro&immutable=1", uri=True)
    lost = []
    try:
        for key in keys:
            try:
                conn.execute("SELECT manifest FROM artifacts WHERE key = ?", (key,)).fetchall()
            except sqlite3.DatabaseError:
                lost.append(key)
    finally:
        conn.close()
    return lost


def test_a_corrupt_index_is_named_planned_and_repaired(invoke: Invoke, warmed: Path, cache_dir: Path) -> None:
    """The rows on the unreadable page are rebuilt from their manifest blobs: every
    entry is back, as it was, serves the same bytes, and the release still names it."""
    keys, served = _prepare(cache_dir)
    index = cache_dir / "index.sqlite"
    rows = _rows(index)
    lost = _corrupt_first_artifacts_leaf(index)
    assert 0 < len(lost) < len(keys), (lost, keys)
    damaged = _digest(index)

    for command in (["ls"], ["verify"]):
        error = one_line_error(invoke(*command))
        assert "is corrupt" in error or "malformed" in error, error
        assert "aot repair" in error and "check the path" not in error, error
    doctor = invoke("doctor", "--no-verify")
    assert "aot repair" in doctor.output and "check the path" not in doctor.output, doctor.output

    plan = invoke("repair", "--dry-run")
    assert plan.exit_code == 0, plan.output
    lines = plan.output.splitlines()
    assert lines[0] == f"{index}: corrupt (database disk image is malformed)"
    assert lines[1].startswith(f"would repair: {len(keys) - len(lost)} entries recovered (")
    many = "entry" if len(lost) == 1 else "entries"
    assert lines[2].startswith(f"  rebuilt from the blob store: {len(lost)} {many} ("), plan.output
    assert all(key[:12] in lines[2] for key in lost[:5]), plan.output
    assert not any("artifacts: a row that could not be read" in line for line in lines), plan.output
    assert not any("stored blob(s) belong to no recovered entry" in line for line in lines), plan.output
    assert lines[-1].startswith(f"  the damaged file to be moved aside to {index}.damaged-")
    assert _digest(index) == damaged and sorted(p.name for p in cache_dir.iterdir()) == ["blobs", "index.sqlite"]

    done = invoke("repair", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["done"] is True and report["damage"] == "corrupt (database disk image is malformed)"
    aside = Path(report["aside"])
    assert aside.parent == cache_dir and _digest(aside) == damaged  # moved, never deleted
    assert report["kept"]["artifacts"] == len(keys)
    assert sorted(label[-13:-1] for label in report["rebuilt"]) == sorted(k[:12] for k in lost)

    assert _rows(index) == rows  # the lost rows as they were: manifest text, digests, sizes
    assert invoke("verify").exit_code == 0
    listed = json.loads(invoke("ls", "--json").stdout)
    assert sorted(e["key"] for e in listed["entries"]) == sorted(keys)
    shown = json.loads(invoke("release", "show", "prod", "--json").stdout)
    assert sorted(m["key"] for m in shown["members"]) == sorted(keys)
    stats = json.loads(invoke("stats", "--json").stdout)
    assert sum(r["calls"] for r in stats["rows"] if r["name"] == "tiny") == 1
    with aot.Cache(cache_dir) as cache:
        for key in lost:
            cache.load(key)  # deserialized: its blobs are the ones the manifest names
        fn = aot.load("tiny", cache=cache, strict=True)
        again = np.asarray(fn(np.arange(8, dtype=np.float32), np.ones(8, np.float32)))
    assert again.tobytes() == served.tobytes()
    again = invoke("repair")
    assert again.exit_code == 0 and again.output == f"{index}: PRAGMA quick_check finds nothing wrong; nothing to repair\n"


def test_an_entry_whose_manifest_is_not_a_blob_stays_lost_and_named(invoke: Invoke, warmed: Path, cache_dir: Path) -> None:
    """An entry stored before schema 10 has no manifest blob: its lost row cannot be
    rebuilt; the plan names it and counts its executable and HLO blobs as orphans."""
    keys, _ = _prepare(cache_dir)
    index = cache_dir / "index.sqlite"
    rows = _rows(index)
    lost = _corrupt_first_artifacts_leaf(index)
    gone = lost[0]
    manifest_digest = str(rows[gone][-1])
    (cache_dir / "blobs" / blob_path(manifest_digest)).unlink()
    others = {d for key, row in rows.items() if key != gone for d in row[7:9]}
    orphans = len({d for d in rows[gone][7:9] if d} - others)

    plan = invoke("repair", "--dry-run")
    assert plan.exit_code == 0, plan.output
    lines = plan.output.splitlines()
    unread = [line for line in lines if line.startswith("    artifacts: a row that could not be read (")]
    assert len(unread) == 1 and f"key={gone[:24]}" in unread[0], plan.output
    assert f"    {orphans} stored blob(s) belong to no recovered entry (their rows were not readable and " \
           "no manifest blob rebuilt them; `aot warmup` stores them again, `aot gc` removes the blobs)" in lines
    if len(lost) > 1:
        assert lines[2].startswith(f"  rebuilt from the blob store: {len(lost) - 1} entr"), plan.output


def test_a_truncated_index_is_called_truncated_not_a_wrong_path(invoke: Invoke, warmed: Path, cache_dir: Path) -> None:
    index = cache_dir / "index.sqlite"
    with open(index, "r+b") as f:
        f.truncate(index.stat().st_size // 2 + 100)
    for command in (["ls"], ["verify"], ["stats"], ["release", "ls"]):
        error = one_line_error(invoke(*command))
        assert "truncated" in error and "aot repair" in error and "check the path" not in error, error
    plan = invoke("repair", "--dry-run")
    assert plan.exit_code == 0 and plan.output.splitlines()[0].startswith(f"{index}: truncated ("), plan.output


@pytest.fixture
def read_only_volume(warmed: Path, tmp_path: Path):  # noqa: ANN201
    """The warmed cache copied to a file system mounted read-only (root mounts a tmpfs;
    elsewhere the test skips and says why)."""
    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
    try:
        subprocess.run(["cp", "-r", str(warmed), str(mount_point / "cache")], check=True)
        remount = subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], capture_output=True, text=True)
        if remount.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remount.stderr.strip()}")
        assert not (mount_point / "cache" / "index.sqlite-shm").exists()
        yield mount_point / "cache"
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_read_commands_work_on_a_read_only_file_system(invoke: Invoke, read_only_volume: Path) -> None:
    for command in (["ls"], ["verify"], ["stats"], ["release", "ls"]):
        result = invoke(*command, cache=read_only_volume)
        assert result.exit_code == 0, (command, result.output)
    assert invoke("ls", "--json", cache=read_only_volume).stdout.count('"key"') == len(
        json.loads(invoke("ls", "--json", cache=read_only_volume).stdout)["entries"]
    )
    error = one_line_error(invoke("gc", cache=read_only_volume))
    assert error == (
        f"Error: cannot collect garbage: the cache at {read_only_volume} is on a read-only file "
        "system; copy it to a writable one (or compile in CI and ship a bundle)"
    )


def test_an_index_lost_whole_gets_its_releases_refs_and_captured_gpus_back(
    invoke: Invoke, warmed: Path, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`truncate -s 50% index.sqlite`: every entry comes back from its manifest blob, the
    release sets (label, members, commit, their chain) and the captured GPU from their
    journal blobs, the refs from the release; what nothing journals is named, with what
    to run instead. `release="prod", strict=True` serves as before."""
    from aot.platforms import cuda as gpu_targets
    from aot.cache.index.targets import CapturedTarget

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    gpu_targets.use_captured(None)
    keys, served = _prepare(cache_dir)  # prod set 1: every entry, commit c1
    with aot.Cache(cache_dir) as cache:
        entries = cache.entries()
        cache.index.declare_release("prod", [(e.name, e.signature, e.env_fp, e.key) for e in entries],
                                    RefOrigin("ci", commit="c2"))  # set 2, its previous set 1
        cache.index.put_captured_target(CapturedTarget(
            name="fleet", platform="cuda", config="gpu_device_info { }\n", config_digest="sha256:" + "ab" * 32,
            versions='{"runtime": "12.8"}', device_kind="NVIDIA H200", host="gpu-host-1", user="ci",
        ))
    before = {
        "show": json.loads(invoke("release", "show", "prod", "--json").stdout),
        "ls": invoke("release", "ls").stdout,
        "history": invoke("release", "history", "prod").stdout,
        "targets": invoke("target", "ls").stdout,
        "refs": sorted((r["name"], r["key"]) for r in json.loads(invoke("ls", "--json").stdout)["entries"]),
    }
    assert "prod" in before["ls"] and "cuda:fleet" in before["targets"]
    index = cache_dir / "index.sqlite"
    with open(index, "r+b") as f:
        f.truncate(index.stat().st_size // 2)

    plan = invoke("repair", "--dry-run")
    assert plan.exit_code == 0, plan.output
    lines = plan.output.splitlines()
    assert lines[1] == "would repair: 0 entries recovered"
    assert lines[2].startswith(f"  rebuilt from the blob store: {len(keys)} entries ("), plan.output
    assert lines[3] == "  release sets rebuilt from their journal blobs: 2 (prod (set 1), prod (set 2))"
    assert lines[4] == "  captured GPUs rebuilt from their journal blobs: 1 (fleet)"
    assert lines[5] == (f"  refs set again (the refs table was lost): {len(keys)}, from the release sets "
                        "and the newest entry of each signature")
    assert lines[7:14] == [
        "  not recovered:",
        "    the whole index: SQLite cannot read its schema (database disk image is malformed)",
        "    call_stats: serving statistics (calls, loads, misses, recompiles) are not journaled; "
        "they count again from the next calls (`aot stats`)",
        "    ref_history: the history of each ref is not journaled; each ref rebuilt has one record "
        "(source repair); `aot release history LABEL` shows the release sets",
        "    jit_entries: entries of JAX's own cache (aot.jax_cache) are not journaled; JAX compiles them "
        "again on their next miss; `aot gc` removes their blobs",
        "    jit_stats: hits and misses of JAX's own cache are not journaled; they count again from the next calls",
        "    default_release: the default release label is not journaled; run `aot release default LABEL` again",
    ], plan.output
    assert len(lines) == 15 and lines[14].startswith("  the damaged file to be moved aside to ")

    planned = json.loads(invoke("repair", "--dry-run", "--json").stdout)
    done = invoke("repair", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["releases_rebuilt"] == ["prod (set 1)", "prod (set 2)"] and report["targets_rebuilt"] == ["fleet"]
    assert report["kept"] == planned["kept"]  # the plan equals its run
    assert [item["kind"] for item in report["lost"]] == ["whole_index", *(["not_journaled"] * 5)]

    assert invoke("release", "ls").stdout == before["ls"]
    assert json.loads(invoke("release", "show", "prod", "--json").stdout) == before["show"]
    assert invoke("release", "history", "prod").stdout == before["history"]
    assert invoke("target", "ls").stdout == before["targets"]
    assert sorted((r["name"], r["key"]) for r in json.loads(invoke("ls", "--json").stdout)["entries"]) == before["refs"]
    assert invoke("verify").exit_code == 0
    with aot.Cache(cache_dir) as cache:
        fn = aot.load("tiny", cache=cache, release="prod", strict=True)
        again = np.asarray(fn(np.arange(8, dtype=np.float32), np.ones(8, np.float32)))
        assert again.tobytes() == served.tobytes()
        assert [t.name for t in cache.index.captured_targets()] == ["fleet"]
        assert cache.gc(dry_run=True).blobs == ()  # every journal blob is named again
