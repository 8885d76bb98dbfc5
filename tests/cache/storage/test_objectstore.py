"""The fleet's shared cache end to end: a PostgreSQL index with blobs on S3 (moto).

Warm-up in one process, strict serving in another; a digest mismatch on an object is
refused (never executed) and healed; push/pull between a folder cache and PostgreSQL
+ S3, both ways, idempotent; credentials never reach the index or a message."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

import aot
from aot.cache.storage.content import compress
from aot.cache.index.schema import METADATA
from aot.cache.admin.transfer import copy_entries, pull, push
from aot.errors import CorruptArtifactError

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[3]

_SERVE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import aot

    url, blobs = sys.argv[1], sys.argv[2]
    cache = aot.Cache(url, blob_location=blobs, read_only=True)
    tiny = aot.load("tiny", cache=cache, strict=True)
    out = tiny(np.arange(8, dtype=np.float32), np.full(8, 2.0, np.float32))
    mlp = aot.load("mlp.forward", cache=cache, strict=True)
    print(json.dumps({"tiny": np.asarray(out).tolist(), "signatures": len(mlp.signatures),
                      "fixtures": any(m.startswith("fixtures") for m in sys.modules)}))
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.slow
def test_warmup_in_one_process_strict_load_in_another(postgres_url: str, s3_url: str, tmp_path: Path) -> None:
    aot_cli = [sys.executable, "-m", "aot", "--cache", postgres_url, "--blobs", s3_url]
    warm = subprocess.run(
        [*aot_cli, "warmup", str(REPO / "fixtures" / "warmup.toml"), "--jobs", "1"],
        cwd=REPO, env=dict(_env(), PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=600,
    )
    assert warm.returncode == 0, warm.stderr[-3000:]
    serve = subprocess.run(
        [sys.executable, "-c", _SERVE, postgres_url, s3_url], cwd=tmp_path, env=_env(),
        capture_output=True, text=True, timeout=300,
    )
    assert serve.returncode == 0, serve.stderr[-3000:]
    result = json.loads(serve.stdout.strip().splitlines()[-1])
    assert result == {"tiny": [float(i * 2 + 1) for i in range(8)], "signatures": 3, "fixtures": False}


@pytest.fixture
def shared(postgres_url: str, s3_url: str):  # noqa: ANN201
    opened: list[Any] = []

    def open_(**kwargs: Any) -> aot.Cache:
        cache = aot.Cache(postgres_url, blob_location=s3_url, **kwargs)
        opened.append(cache)
        return cache

    yield open_
    for cache in opened:
        cache.close()


def _deserialized(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    import jax

    seen: list[str] = []
    client_class = type(jax.devices()[0].client)
    real = client_class.deserialize_executable

    def spy(self: Any, serialized: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(hashlib.sha256(bytes(serialized)).hexdigest())
        return real(self, serialized, *args, **kwargs)

    monkeypatch.setattr(client_class, "deserialize_executable", spy)
    return seen


def test_a_digest_mismatch_on_an_object_is_refused_then_healed(shared, compiled, monkeypatch, tmp_path) -> None:  # noqa: ANN001
    cache = shared()
    entry = cache.put(compiled.tiny)
    good = cache.blobs.store.read(entry.exe_digest)
    cache.blobs.store.write(entry.exe_digest, compress(b"another program"))  # a valid frame, wrong bytes
    seen = _deserialized(monkeypatch)
    with pytest.raises(CorruptArtifactError, match=f"{entry.exe_digest}.*digest mismatch"):
        aot.load(compiled.TINY_NAME, cache=shared(), strict=True)
    assert entry.exe_digest not in seen and seen == []  # never handed to XLA
    assert cache.index.get(entry.key).ok  # a strict loader never writes; verify quarantines
    report = cache.verify()
    assert [p.what for p in report.problems] == [f"executable blob {entry.exe_digest[:12]}: digest mismatch"]
    assert not cache.index.get(entry.key).ok

    # healed from a good copy: the object is rewritten in place, the row restored
    backup = aot.Cache(tmp_path / "backup")
    backup.put(compiled.tiny)
    result = push(backup, cache.location, blob_location=cache.blob_location)
    assert (len(result.repaired), len(result.copied)) == (0, 1)  # the quarantined row is replaced
    assert cache.blobs.store.read(entry.exe_digest) == good
    assert cache.index.get(entry.key).ok and cache.verify().ok
    fn = aot.load(compiled.TINY_NAME, cache=shared(), strict=True)
    np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)
    assert entry.exe_digest in seen
    backup.close()


def test_a_corrupt_object_is_recompiled_by_a_non_strict_loader(shared, compiled, monkeypatch) -> None:  # noqa: ANN001
    cache = shared()
    entry = cache.put(compiled.tiny)
    cache.blobs.store.write(entry.exe_digest, b"\x28\xb5\x2f\xfd truncated")
    seen = _deserialized(monkeypatch)
    fn = aot.load(compiled.TINY_NAME, cache=shared())
    np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)
    assert entry.exe_digest not in seen
    healed = cache.index.get(entry.key)
    assert healed.ok and cache.blobs.check(healed.exe_digest) is None
    monkeypatch.setattr("aot.cache.admin.maintenance.ORPHAN_GRACE_SECONDS", 0.0)
    cache.gc()  # the corrupt object, no longer referenced
    assert cache.verify().ok


def test_push_and_pull_between_a_folder_and_postgresql_s3(shared, compiled, tmp_path) -> None:  # noqa: ANN001
    folder = aot.Cache(tmp_path / "ci")
    for artifact in compiled.all():
        folder.put(artifact)
    remote = shared()
    first = push(folder, remote.location, ["mlp.*"], blob_location=remote.blob_location, jobs=4)
    assert (len(first.copied), len(first.skipped), first.failed) == (3, 0, ())
    assert first.bytes_copied == sum(e.stored_size for e in folder.entries("mlp.*"))
    for digest in remote.blobs.digests():  # as stored: no recompression
        assert remote.blobs.store.read(digest) == folder.blobs.store.read(digest)
    again = push(folder, remote.location, blob_location=remote.blob_location)
    assert (len(again.copied), len(again.skipped)) == (1, 3)  # only what was missing
    assert len(push(folder, remote.location, blob_location=remote.blob_location).copied) == 0
    assert remote.verify().ok and remote.index.leased_digests() == set()

    server = aot.Cache(tmp_path / "server")
    back = pull(server, remote.location, blob_location=remote.blob_location, jobs=2)
    assert (len(back.copied), len(back.skipped)) == (4, 0)
    assert len(pull(server, remote.location, blob_location=remote.blob_location).copied) == 0
    fn = aot.load(compiled.MLP_NAME, cache=server, strict=True)
    for batch in compiled.MLP_BATCHES:
        np.testing.assert_array_equal(np.asarray(fn(compiled.params, compiled.inputs[batch])), compiled.expected[batch])
    folder.close()
    server.close()


def test_credentials_never_reach_the_index_or_a_message(
    postgres_url: str, s3_bucket: str, compiled, monkeypatch, tmp_path  # noqa: ANN001
) -> None:
    secret = f"aot-secret-{secrets.token_hex(8)}"
    key_id = f"AKIA{secrets.token_hex(6).upper()}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)  # moto takes any
    blobs = f"s3://{s3_bucket}/cred"
    cache = aot.Cache(postgres_url, blob_location=blobs)
    for artifact in compiled.all():
        cache.put(artifact)
    texts: list[str] = [repr(cache), cache.display_location, cache.blobs.location]
    fn = aot.load(compiled.TINY_NAME, cache=cache)
    fn(*compiled.tiny_inputs)
    cache.stats.flush()
    texts.append(json.dumps(cache.verify().to_dict()))
    texts.append(json.dumps(copy_entries(cache, aot.Cache(tmp_path / "f")).to_dict()))
    from aot.cache.reports.doctor import diagnose

    texts.append(json.dumps(diagnose(postgres_url, check=True).to_dict(), default=str))
    # an unreachable endpoint and a missing bucket: their messages
    for url in (f"s3://{s3_bucket}-missing/x", blobs):
        if url == blobs:
            monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        # another bucket than the recorded one: opened as a mirror (else refused at once)
        broken = aot.Cache(postgres_url, blob_location=url, read_only=True, blob_mirror=url != blobs)
        with pytest.raises(aot.AotError) as info:
            broken.verify()
        texts.append(str(info.value))
        broken.close()
    engine = sa.create_engine(postgres_url)
    with engine.connect() as conn:
        for table in METADATA.sorted_tables:
            for row in conn.execute(sa.select(table)):
                texts.append(repr(tuple(row)))
    engine.dispose()
    everything = "\n".join(texts)
    assert "did not answer" in everything and "no such bucket" in everything
    assert secret not in everything and key_id not in everything
    cache.close()
