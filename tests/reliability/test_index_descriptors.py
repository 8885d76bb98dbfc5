"""Nothing of jax-aot opens a SQLite index file outside SQLite (issue 49).

On POSIX, closing *any* descriptor of a file drops every fcntl lock the process holds
on it, its own SQLite connections' included (SQLite's "How To Corrupt An SQLite
Database File", section 2.2). A WAL connection that lost its shared lock on the
database file lets another process's closing connection believe it is the last:
that one checkpoints and deletes the -wal and -shm under it, and the index ends up
corrupt. ``aot.load``'s read-ahead once read the database header with ``open()``.

Two checks: every raw open in aot/, cache/ and cli/ is listed here with why it cannot
reach an index file (a new one fails until it is reviewed and listed); and a process
that holds a connection keeps its lock through every read path of the library
(``aot.load`` with its read-ahead, read-only opens, the CLI's read commands), which
another process sees: its closing connection leaves the -wal and -shm in place.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from aot.cache.cache import Cache

from tests.reliability.helpers import TinyArtifacts, child_env

ROOT = Path(__file__).resolve().parents[2]

#: Calls that open a file by name (or copy, map or truncate one), by attribute name.
_OPENING_ATTRIBUTES = {
    "open", "read_bytes", "read_text", "write_bytes", "write_text", "mmap", "truncate",
    "backup", "file_digest", "fdopen",
}
#: shutil's, which open the files they copy or move (``dict.copy`` does not).
_SHUTIL = {"copy", "copy2", "copyfile", "copytree", "move"}

_USER_FILE = "a file the user names (never the index: a manifest, a bundle, a config, a key)"
_BLOB = "a blob (blobs/ab/<digest>.zst) or its temporary file, never the index"
_PROC = "a /proc or /sys file"
_CAPTURED = "a captured GPU target's JSON file (<name>.json, aot.platforms.cuda.captured_file), never the index"

#: Every raw open of the package: (file, function, call) -> why it never opens an index.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("aot/artifact.py", "Artifact.save", "(folder / f'{digest}.bin').write_bytes"): "a saved artifact's folder",
    ("aot/artifact.py", "Artifact.save", "(folder / 'manifest.json').write_text"): "a saved artifact's folder",
    ("aot/artifact.py", "Artifact.open", "(folder / 'manifest.json').read_bytes"): "a saved artifact's folder",
    ("aot/artifact.py", "Artifact.open", "path.read_bytes"): "a saved artifact's folder",
    ("aot/device.py", "_command_line", "open"): _PROC,
    ("aot/env_record.py", "_boot_id", "open"): _PROC,
    ("aot/env_record.py", "_read", "path.read_text"): "the per-host environment record (JSON)",
    ("aot/env_record.py", "_initial_environment", "open"): _PROC,
    ("aot/env_record.py", "_remember", "path.read_text"): "the per-host environment record (JSON)",
    ("aot/env_record.py", "_remember", "os.fdopen"): "the per-host environment record (JSON)",
    ("aot/platforms/cpu.py", "cpu_isa_features", "open"): _PROC,
    ("cache/admin/bundle.py", "_write_bundle", "os.fdopen"): _USER_FILE,
    ("cache/admin/bundle.py", "_write_file", "os.fdopen"): _USER_FILE,
    ("cache/admin/bundle.py", "_open_source", "where.file.open"): _USER_FILE,
    ("cache/admin/bundle.py", "_open_source", "target.fs.open"): _USER_FILE,
    ("cache/config.py", "Settings.signing_key", "path.read_bytes"): _USER_FILE,
    ("cache/config.py", "find_config", "path.read_text"): _USER_FILE,
    ("cache/config.py", "read_config", "path.read_text"): _USER_FILE,
    ("cache/jax_cache/local_rows.py", "LocalRows.get", "self._path(key).read_bytes"): "a JSON row of its own folder",
    ("cache/jax_cache/local_rows.py", "LocalRows.put", "os.fdopen"): "a JSON row of its own folder",
    ("cache/serving/read_ahead.py", "read_verified", "open"): _BLOB,
    ("cache/storage/folder.py", "FolderObjectStore.read_stream", "open"): _BLOB,
    ("cache/storage/folder.py", "FolderObjectStore.write", "os.open"): _BLOB,
    ("cache/storage/folder.py", "_fsync_dir", "os.open"): "a blob folder (fcntl locks are per file)",
    ("cache/storage/fsspec_store.py", "FsspecObjectStore.read_stream", "self._fs.open"): _BLOB,
    ("cache/storage/fsspec_store.py", "FsspecObjectStore._write_stream", "self._fs.open"): _BLOB,
    ("cache/storage/fsspec_store.py", "FsspecObjectStore._write_local", "os.open"): _BLOB,
    ("cache/storage/fsspec_store.py", "FsspecObjectStore._write_local", "os.fdopen"): _BLOB,
    ("cache/storage/locations.py", "open_object_store", "SqlObjectStore.open"): "a database URL, through SQLAlchemy",
    ("cache/warmup/jobs.py", "_read_int", "path.read_text"): _PROC,
    ("cache/warmup/jobs.py", "cgroup_room", "membership.read_text"): _PROC,
    ("cache/warmup/jobs.py", "_mem_available", "meminfo.read_text"): _PROC,
    ("cache/warmup/manifest.py", "load_manifest", "path.read_text"): _USER_FILE,
    ("cache/warmup/workers.py", "is_stopped", "open"): _PROC,
    ("aot/platforms/cuda.py", "autotune_options", "tmp.write_text"): "a temporary file of autotune results, for XLA's flag",
    ("aot/platforms/cuda.py", "config_for", "(resources.files('aot') / 'gpu_configs' / f'{name}.txtpb').read_text"):
        "a GPU target config shipped in the package",
    ("aot/platforms/cuda.py", "config_for", "path.read_text"): _CAPTURED,
    ("aot/jaxcompat/versions.py", "installed_version", "(Path(location) / 'version.py').read_text"):
        "jax's or jaxlib's version.py",
    ("cache/admin/targets.py", "_read", "Path(path).read_text"): _USER_FILE,
    ("cache/index/targets.py", "write_targets", "os.fdopen"): _CAPTURED,
    ("cache/index/targets.py", "write_targets", "path.read_text"): _CAPTURED,
    ("cli/common.py", "State.use_gpu_targets", "open"): _USER_FILE,
    ("cli/group.py", "stdout_closed", "os.open"): "os.devnull, put over a stdout whose reader left (aot ls | head)",
}


class _Opens(ast.NodeVisitor):
    def __init__(self, file: str) -> None:
        self.file = file
        self.scope: list[str] = []
        self.found: list[tuple[str, str, str]] = []

    def _scoped(self, node: ast.AST, name: str) -> None:
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scoped(node, node.name)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._scoped(node, node.name)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped(node, node.name)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            self.found.append((self.file, ".".join(self.scope) or "<module>", "open"))
        elif isinstance(func, ast.Attribute) and (
            func.attr in _OPENING_ATTRIBUTES or (func.attr in _SHUTIL and ast.unparse(func.value) == "shutil")
        ):
            self.found.append((self.file, ".".join(self.scope) or "<module>", ast.unparse(func)))
        self.generic_visit(node)


def _raw_opens() -> list[tuple[str, str, str]]:
    found = []
    for folder in ("aot", "cache", "cli"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            visitor = _Opens(path.relative_to(ROOT).as_posix())
            visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
            found += visitor.found
    return found


def test_every_raw_open_is_known_never_to_reach_an_index_file() -> None:
    found = _raw_opens()
    new = sorted(set(found) - set(ALLOWED))
    assert not new, (
        "new raw opens in the package (open, os.open, Path.read_bytes, shutil.copy, mmap, "
        "...): closing any descriptor of an SQLite index drops this process's locks on it "
        "and corrupts the index (issue 49). Open an index only through sqlite3/SQLAlchemy, "
        "decide from os.stat otherwise; if the call cannot reach an index file, list it in "
        f"ALLOWED with why: {new}"
    )
    gone = sorted(set(ALLOWED) - set(found))
    assert not gone, f"listed in ALLOWED but no longer in the code (delete them): {gone}"


HOLDER = r'''
import json, os, sqlite3, sys
import numpy as np
folder = sys.argv[1]
index = os.path.join(folder, "index.sqlite")
# A connection of this process, as a serving process's reader and statistics hold one.
holder = sqlite3.connect(index, isolation_level=None)
holder.execute("SELECT count(*) FROM artifacts").fetchone()

import aot
from aot.cache.cache import Cache
from aot.cache.index.read_only import read_only_open, served_manifests
from click.testing import CliRunner
from aot.cli.main import cli

read_only_open(index)
served_manifests(index, "rel.tiny", "0" * 64, most=8)
fn = aot.load("rel.tiny", cache=folder, strict=True)  # read-ahead on: the default
fn(np.arange(2, dtype=np.float32))
fn.cache.close()
with Cache(folder, read_only=True) as cache:
    cache.entries()
    cache.verify(quarantine=False)
codes = []
for args in (["ls"], ["ls", "--read-only"], ["stats"], ["verify"], ["doctor"], ["release", "ls"]):
    codes.append(CliRunner().invoke(cli, ["--cache", folder, *args]).exit_code)
holder.execute("SELECT count(*) FROM artifacts").fetchone()
print(json.dumps({"pid": os.getpid(), "codes": codes}), flush=True)
sys.stdin.readline()
holder.close()
'''

CLOSER = r'''
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("SELECT count(*) FROM artifacts").fetchone()
conn.close()  # the last connection closing checkpoints and deletes -wal and -shm
'''


def _posix_locks(pid: int, inode: int) -> list[str]:
    lines = Path("/proc/locks").read_text().splitlines()
    return [line for line in lines if f" {pid} " in line and f":{inode} " in line and "POSIX" in line]


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks")
def test_a_process_keeps_its_lock_on_the_index_through_every_read_path(tmp_path: Path, tiny: TinyArtifacts) -> None:
    folder = tmp_path / "cache"
    with Cache(folder) as writer:
        for n in (1, 2):
            writer.put_artifact(tiny.by_size[n])
    index = folder / "index.sqlite"
    env = child_env()
    env.pop("AOT_READ_AHEAD", None)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    try:
        line = holder.stdout.readline()
        assert line, holder.stderr.read()[-3000:]
        report = json.loads(line)
        assert report["codes"] == [0, 0, 0, 0, 0, 0]
        # The holder's shared lock on the database file, as any other process sees it.
        assert _posix_locks(report["pid"], index.stat().st_ino), Path("/proc/locks").read_text()
        subprocess.run([sys.executable, "-c", CLOSER, str(index)], check=True, env=env, timeout=60)
        # Not the last connection: the -wal and -shm the holder maps are still there.
        assert (folder / "index.sqlite-wal").exists() and (folder / "index.sqlite-shm").exists()
        holder.stdin.write("done\n")
        holder.stdin.flush()
        assert holder.wait(timeout=60) == 0, holder.stderr.read()[-3000:]
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    with Cache(folder, read_only=True) as cache:
        assert cache.verify(quarantine=False).ok
