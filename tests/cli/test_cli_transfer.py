"""aot push / aot pull: between a folder cache and PostgreSQL + S3, both ways,
idempotent, resumable after a kill."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import Result

import aot
from aot.cache.index.entry import referenced_digests
from tests.cli.helpers import REPO, Invoke, one_line_error

TRANSFER_KEYS = {
    "source", "destination", "copied", "skipped", "repaired", "failed", "bytes_copied", "seconds", "keys", "refs",
}


@pytest.mark.postgres
def test_push_to_postgresql_s3_and_pull_back(invoke: Invoke, warmed, postgres_url: str, s3_url: str, tmp_path: Path) -> None:  # noqa: ANN001
    pushed = invoke("push", postgres_url, "mlp.*", "--to-blobs", s3_url)
    assert pushed.exit_code == 0, pushed.output
    assert re.fullmatch(
        rf"pushed 3 entries \(\d+\.\d KiB\) to {re.escape(postgres_url)}: 0 already there, 0 failed in \d+\.\ds\n"
        # The source's refs of what was copied, where the destination declared nothing.
        r"refs: 3 set\n",
        pushed.stdout,
    ), pushed.stdout
    data = json.loads(invoke("push", postgres_url, "--to-blobs", s3_url, "--json").stdout)
    assert set(data) == TRANSFER_KEYS
    assert (data["copied"], data["skipped"], data["repaired"], data["failed"]) == (2, 3, 0, [])
    again = json.loads(invoke("--json", "push", postgres_url, "--to-blobs", s3_url).stdout)
    assert (again["copied"], again["skipped"], again["bytes_copied"]) == (0, 5, 0)

    served = tmp_path / "served"
    pulled = json.loads(invoke("pull", postgres_url, "--from-blobs", s3_url, "--json", cache=served).stdout)
    assert (pulled["copied"], pulled["skipped"], pulled["source"]) == (5, 0, postgres_url)
    again = json.loads(invoke("pull", postgres_url, "--from-blobs", s3_url, "--json", cache=served).stdout)
    assert (again["copied"], again["skipped"]) == (0, 5)
    assert invoke("verify", cache=served).exit_code == 0
    assert sorted(e.key for e in aot.Cache(served).entries()) == sorted(
        e.key for e in aot.Cache(warmed).entries()
    )


def test_pull_from_nowhere_is_an_error(invoke: Invoke, tmp_path: Path) -> None:
    line = one_line_error(invoke("pull", tmp_path / "nothing", cache=tmp_path / "served"))
    assert line == f"Error: no cache at {tmp_path / 'nothing'} (nothing to pull from); check the SOURCE location"


def test_push_names_what_it_could_not_copy(invoke: Invoke, warmed, cache_dir: Path, tmp_path: Path) -> None:  # noqa: ANN001
    cache = aot.Cache(cache_dir)
    tiny = cache.entries("tiny")[0]
    cache.blobs.store.path_for(tiny.exe_digest).write_bytes(b"rot")
    result = invoke("push", tmp_path / "dest", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["copied"] == 4 and [f["key"] for f in data["failed"]] == [tiny.key]
    assert "corrupt" in data["failed"][0]["reason"]


@pytest.mark.postgres
@pytest.mark.parametrize("killed_at", ["put.blobs_ready", "put.committed"])
def test_a_push_killed_midway_completes_on_the_next_run(
    invoke: Invoke, warmed, cache_dir: Path, postgres_url: str, s3_url: str, killed_at: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # noqa: ANN001
    """Killed after the first entry's blobs (or row) reached PostgreSQL + S3: the next
    run copies the rest, writes none of what is there, and a third copies nothing."""
    env = dict(os.environ, AOT_TEST_PAUSE=f"{killed_at}=kill", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "aot", "--cache", str(cache_dir), "push", postgres_url,
         "--to-blobs", s3_url, "--jobs", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    first = aot.Cache(cache_dir).entries()[0]  # entries go in name order: allreduce
    from aot.cache.storage.fsspec_store import FsspecObjectStore

    written: list[str] = []
    real = FsspecObjectStore.write

    def spy(self, digest, payload):  # noqa: ANN001, ANN202
        written.append(digest)
        return real(self, digest, payload)

    monkeypatch.setattr(FsspecObjectStore, "write", spy)
    resumed = json.loads(invoke("push", postgres_url, "--to-blobs", s3_url, "--json").stdout)
    committed = killed_at == "put.committed"
    assert (resumed["copied"], resumed["skipped"]) == ((4, 1) if committed else (5, 0))
    assert not {first.exe_digest, first.hlo_digest} & set(written)  # already there: kept
    final = json.loads(invoke("push", postgres_url, "--to-blobs", s3_url, "--json").stdout)
    assert (final["copied"], final["skipped"]) == (0, 5)
    assert invoke("verify", cache=postgres_url, env={"AOT_BLOBS": s3_url}).exit_code == 0



def test_a_push_killed_mid_batch_leaves_no_row_without_blobs_and_resumes_without_copying_again(
    invoke: Invoke, warmed, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # noqa: ANN001
    """kill -9 once the blobs of a batch (every entry after the first) are durable at
    DEST and before its rows commit: DEST holds the first entry's row only, with its
    blobs; the next push commits the rest and writes no blob; a third copies nothing."""
    dest = tmp_path / "dest"
    env = dict(os.environ, AOT_TEST_PAUSE="copy.blobs_ready=kill", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "aot", "--cache", str(cache_dir), "push", str(dest), "--jobs", "2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    killed = aot.Cache(dest)
    try:
        rows = killed.index.entries()
        assert [r.key for r in rows] == [aot.Cache(cache_dir).entries()[0].key]
        assert all(killed.blobs.check(d) is None for r in rows for d in (r.exe_digest, r.hlo_digest) if d)
        arrived = set(killed.blobs.digests())
    finally:
        killed.close()
    wanted = {d for e in aot.Cache(cache_dir).entries() for d in referenced_digests(e)}
    assert arrived == wanted  # every blob arrived before the kill (each entry's manifest too)
    from aot.cache.storage.folder import FolderObjectStore

    written: list[str] = []
    real = FolderObjectStore.write

    def spy(self, digest, payload):  # noqa: ANN001, ANN202
        written.append(digest)
        return real(self, digest, payload)

    monkeypatch.setattr(FolderObjectStore, "write", spy)
    resumed = json.loads(invoke("push", dest, "--json").stdout)
    assert (resumed["copied"], resumed["skipped"], resumed["failed"]) == (4, 1, [])
    assert written == []  # what arrived is not copied again
    final = json.loads(invoke("push", dest, "--json").stdout)
    assert (final["copied"], final["skipped"]) == (0, 5)
    assert invoke("verify", cache=dest).exit_code == 0


@pytest.mark.postgres
def test_push_to_a_missing_bucket_fails_once_naming_it(invoke: Invoke, warmed, postgres_url: str, s3_env: str) -> None:  # noqa: ANN001
    blobs = "s3://aot-test-no-such-bucket/blobs"
    pushed = invoke("push", postgres_url, "--to-blobs", blobs)
    assert pushed.exit_code == 1
    lines = pushed.output.splitlines()
    assert len(lines) == 1, pushed.output  # one error, not one per entry plus warnings
    assert lines[0].startswith("Error: nothing copied to ")
    assert "cannot write blob " in lines[0] and f"at {blobs}: no such bucket" in lines[0]
    assert "cannot read" not in lines[0]


def _up_to_date_pair(warmed: Path, tmp_path: Path) -> Path:
    """``warmed`` with a release, a jit entry and a row whose name the rule refuses,
    pushed once to a folder that declares one slot otherwise: the copy's destination."""
    import dataclasses
    import hashlib

    from jax._src import compilation_cache as cc  # only to build a payload as JAX does

    from aot.cache.index.refs import RefOrigin

    with aot.Cache(warmed) as cache:
        tiny = cache.entries("tiny")[0]
        origin = RefOrigin("test", release="prod")
        cache.set_refs([tiny], origin, release_id=cache.index.open_release("prod", origin))
        backend = aot.jax_cache.JaxCacheBackend(cache, compile_once=False)
        body = b"step" * 100
        backend.put(f"jit_train_step-{hashlib.sha256(body).hexdigest()}",
                    cc.compress_executable(cc.combine_executable_and_time(body, 2)))
        backend.close()
        cache.index.bulk_insert([dataclasses.replace(tiny, key="f" * 64, name="bad\x01name")])
    dest = tmp_path / "dest"
    from aot.cache.admin.transfer import push

    with aot.Cache(warmed) as cache:
        assert len(push(cache, dest).copied) == 6  # 5 entries and the jit entry
    with aot.Cache(dest) as there:
        ref = there.refs_named("mlp.forward")[0]
        other = next(e for e in there.entries("mlp.forward") if e.key != ref.key)
        there.index.set_refs([(ref.name, ref.signature, ref.env_fp, other.key)], RefOrigin("theirs"))
    return dest


def _normalized(output: str) -> str:
    """Without the durations (text and JSON), which differ from run to run."""
    return re.sub(r'"seconds": [0-9.e-]+', '"seconds": S', re.sub(r" in \d+\.\ds\n", " in Ss\n", output))


def test_an_up_to_date_push_or_pull_prints_what_the_writers_path_prints(
    invoke: Invoke, warmed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """The read-only pass (cache/admin/up_to_date.py) and the writer's path print the
    same bytes and exit with the same status, for push and pull, text and --json."""
    from aot.cache.admin import transfer

    dest = _up_to_date_pair(warmed, tmp_path)
    commands = [
        ("push", str(dest)), ("push", str(dest), "--json"), ("push", str(dest), "mlp.*", "--refs"),
        ("pull", str(dest)), ("pull", str(dest), "--json", "-j", "1"), ("pull", str(dest), "tiny", "train*"),
    ]
    saved = tmp_path / "saved"
    shutil.copytree(warmed, saved / "cache")
    shutil.copytree(dest, saved / "dest")

    def run(command: tuple[str, ...]) -> Result:  # from the same two caches each time
        for folder, copy in ((warmed, saved / "cache"), (dest, saved / "dest")):
            shutil.rmtree(folder)
            shutil.copytree(copy, folder)
        return invoke(*command)

    decided: list[object] = []
    real = transfer.up_to_date
    monkeypatch.setattr(transfer, "up_to_date", lambda *a, **k: decided.append(real(*a, **k)) or decided[-1])
    fast = [run(command) for command in commands]
    # Read-only but for --refs over a slot declared otherwise there: a ref to write.
    assert [d is not None for d in decided] == [True, True, False, True, True, True]
    monkeypatch.setattr(transfer, "up_to_date", lambda *a, **k: None)
    slow = [run(command) for command in commands]
    for command, a, b in zip(commands, fast, slow):
        assert (a.exit_code, _normalized(a.stdout), a.stderr) == (b.exit_code, _normalized(b.stdout), b.stderr), command
    assert [r.exit_code for r in fast] == [1, 1, 0, 0, 0, 0]  # push: the refused name fails
    assert fast[0].stdout.splitlines()[1:] == [
        "refs: 0 set, 1 kept (the destination's own; --refs overwrites)",
        "failed ffffffffffff: the name holds the control character '\\x01' at position 3",
    ]
    assert fast[2].stdout.splitlines()[1] == "refs: 1 set"
    assert _normalized(fast[3].stdout) == (  # that slot the other way: this cache's own ref kept
        f"pulled 0 entries (0 B) from {dest}: 6 already there, 0 failed in Ss\n"
        "refs: 0 set, 1 kept (the destination's own; --refs overwrites)\n"
    )
