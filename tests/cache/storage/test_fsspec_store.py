"""The fsspec object store against real stores: a moto S3 server, memory:// and file://.

The S3 cases need AOT_TEST_S3_ENDPOINT (.ci/moto.sh); the failure cases that stop a
server or switch on authentication run their own in-process moto server on a free
port, so the shared one is never disturbed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import os
import secrets
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from aot.errors import CacheError, ReadOnlyCacheError
from aot.cache.storage.fsspec_store import FsspecObjectStore
from aot.cache.storage.objectstore import BlobStat, ObjectStore, blob_path


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


D1, D2, D3, ABSENT = (digest(bytes([i])) for i in range(4))


@pytest.fixture(params=["memory", "file", "s3"])
def url(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    if request.param == "memory":
        return f"memory://aot-test-{secrets.token_hex(6)}/blobs"
    if request.param == "file":
        return f"file://{tmp_path}/blobs"
    return request.getfixturevalue("s3_url")


@pytest.fixture
def store(url: str) -> Iterator[FsspecObjectStore]:
    s = FsspecObjectStore(url)
    yield s
    s.close()


def test_is_an_object_store(store: FsspecObjectStore) -> None:
    assert isinstance(store, ObjectStore)
    assert "://" in store.location and "testing" not in store.location


def test_round_trip_and_overwrite(store: FsspecObjectStore) -> None:
    assert store.read(D1) is None
    store.write(D1, b"first payload")
    assert store.read(D1) == b"first payload"
    store.write(D1, b"repaired")  # overwriting is how a corrupt blob is repaired
    assert store.read(D1) == b"repaired"
    store.write(D2, io.BytesIO(b"from a file object" * 1000))
    assert store.read(D2) == b"from a file object" * 1000


def test_batched_calls_ignore_absent_digests(store: FsspecObjectStore) -> None:
    store.write(D1, b"a" * 10)
    store.write(D2, b"b" * 200)
    assert store.exists([D1, D2, D3, ABSENT]) == {D1, D2}
    stats = store.stat(iter([D1, ABSENT, D2]))
    assert {d: s.stored_size for d, s in stats.items()} == {D1: 10, D2: 200}
    assert all(isinstance(s, BlobStat) and s.modified.tzinfo is not None for s in stats.values())
    assert store.delete([D1, D3, ABSENT]) == 10
    assert store.exists([D1, D2]) == {D2}
    assert store.delete([D1]) == 0
    assert store.exists([]) == set() and store.stat([]) == {} and store.delete([]) == 0


def test_list_yields_blobs_with_sizes_and_ages(store: FsspecObjectStore) -> None:
    store.write(D1, b"x" * 5)
    store.write(D2, b"y" * 7)
    store.now()  # writes a clock marker on cloud stores: not a blob
    listed = {s.digest: s for s in store.list()}
    assert {d: s.stored_size for d, s in listed.items()} == {D1: 5, D2: 7}
    now = store.now()
    for s in listed.values():
        assert dt.timedelta(seconds=-2) <= now - s.modified < dt.timedelta(minutes=5)


def test_an_empty_or_new_prefix_lists_nothing(url: str) -> None:
    assert list(FsspecObjectStore(url + "/never-written").list()) == []


def test_touch_makes_a_blob_young(store: FsspecObjectStore, url: str) -> None:
    store.write(D1, b"payload")
    before = store.stat([D1])[D1].modified
    time.sleep(1.2 if url.startswith("s3://") else 0.05)  # S3: one-second resolution
    assert store.now() > before
    store.touch(D1)
    after = store.stat([D1])[D1].modified
    assert after > before
    assert store.read(D1) == b"payload"  # touching keeps the payload
    store.touch(ABSENT)  # absent: nothing happens
    assert store.exists([ABSENT]) == set()


def test_now_is_the_stores_clock_and_monotone(store: FsspecObjectStore) -> None:
    first = store.now()
    store.write(D1, b"p")
    written = store.stat([D1])[D1].modified
    second = store.now()
    assert first <= second
    assert written - second <= dt.timedelta(seconds=1)  # a fresh blob is never in the future
    assert abs(second - dt.datetime.now(dt.timezone.utc)) < dt.timedelta(minutes=5)


def test_read_only_store_refuses_writes(url: str) -> None:
    FsspecObjectStore(url).write(D1, b"p")
    ro = FsspecObjectStore(url, read_only=True)
    assert ro.read(D1) == b"p"
    for call in (lambda: ro.write(D2, b"q"), lambda: ro.delete([D1]), lambda: ro.touch(D1)):
        with pytest.raises(ReadOnlyCacheError, match="read-only"):
            call()
    assert ro.exists([D1, D2]) == {D1}


class _FailingSource(io.RawIOBase):
    """A payload source that breaks after ``good`` bytes (a producer that crashed)."""

    def __init__(self, good: int, on_fail=None) -> None:  # type: ignore[no-untyped-def]
        self.left = good
        self.on_fail = on_fail

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            if self.on_fail is not None:
                self.on_fail()
                return b"z" * (n if n > 0 else 1 << 20)
            raise RuntimeError("the payload source failed")
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return b"z" * n


def test_no_partial_object_when_the_source_fails(store: FsspecObjectStore, url: str) -> None:
    store.write(D2, b"old intact payload")
    for d in (D1, D2):
        with pytest.raises(RuntimeError, match="payload source failed"):
            store.write(d, _FailingSource(12 * 2**20))  # two parts of a multipart upload
    assert store.exists([D1, D2]) == {D2}
    assert store.read(D1) is None
    assert store.read(D2) == b"old intact payload"  # the failed overwrite left it alone
    if url.startswith("file://"):
        folder = os.path.join(url[len("file://"):], D1[:2])
        assert not os.path.isdir(folder) or os.listdir(folder) == []  # no temp file left


def test_file_url_uses_the_shared_layout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = FsspecObjectStore(f"file://{tmp_path}")
    s.write(D1, b"payload")
    assert (tmp_path / blob_path(D1)).read_bytes() == b"payload"
    (tmp_path / blob_path(D2)).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / blob_path(D2)).write_bytes(b"placed by a folder store")
    (tmp_path / "ab").mkdir(exist_ok=True)
    (tmp_path / "ab" / "not-a-blob.txt").write_bytes(b"ignored")
    assert {b.digest for b in s.list()} == {D1, D2}
    assert s.read(D2) == b"placed by a folder store"


@pytest.mark.parametrize("bad", ["ftp://host/x", "/plain/path", "s3://", "postgresql://h/db"])
def test_unsupported_urls_are_refused(bad: str) -> None:
    with pytest.raises(CacheError, match="unsupported object-store URL|names no bucket"):
        FsspecObjectStore(bad)


# ---------------------------------------------------------------- S3 errors


def test_missing_bucket_is_an_error_not_absent(s3_env: str) -> None:
    s = FsspecObjectStore(f"s3://aot-no-such-bucket-{secrets.token_hex(4)}/p")
    for call in (lambda: s.read(D1), lambda: s.write(D1, b"p"), lambda: s.exists([D1]),
                 lambda: list(s.list())):
        with pytest.raises(CacheError, match="no such bucket"):
            call()


def test_no_credentials(s3_bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    s = FsspecObjectStore(f"s3://{s3_bucket}/p")
    with pytest.raises(CacheError, match="no credentials were found.*AWS_ACCESS_KEY_ID"):
        s.read(D1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_endpoint_down(s3_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    s = FsspecObjectStore("s3://bucket/p")
    start = time.monotonic()
    with pytest.raises(CacheError, match=f"did not answer.*127.0.0.1:{port}.*AWS_ENDPOINT_URL"):
        s.exists([D1])
    assert time.monotonic() - start < 30


# private_moto (an in-process moto server of the test's own): tests/conftest.py


def _set_auth(endpoint: str, free_requests: str) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=free_requests.encode(), method="POST",
        headers={"Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def test_refused_and_denied_credentials(private_moto, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    _, endpoint = private_moto
    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint)
    iam.create_user(UserName="nobody")  # a real user with no permission at all
    key = iam.create_access_key(UserName="nobody")["AccessKey"]
    _set_auth(endpoint, "0")
    try:
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-real-secret")
        with pytest.raises(CacheError, match="credentials were refused") as refused:
            FsspecObjectStore("s3://private/p").write(D1, b"p")
        assert "not-a-real-secret" not in str(refused.value)
        with pytest.raises(CacheError, match="credentials were refused"):
            FsspecObjectStore("s3://private/p").read(D1)
        with pytest.raises(CacheError, match="access denied.*HTTP 403.*AWS_ACCESS_KEY_ID"):
            FsspecObjectStore("s3://private/p").exists([D1])  # a HEAD: no error code to tell
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        with pytest.raises(CacheError, match="access denied") as denied:
            FsspecObjectStore("s3://private/p").write(D1, b"p")
        assert key["SecretAccessKey"] not in str(denied.value)
    finally:
        _set_auth(endpoint, "inf")


def test_server_killed_mid_write_leaves_no_object(private_moto) -> None:  # type: ignore[no-untyped-def]
    server, _ = private_moto
    s = FsspecObjectStore("s3://private/p")
    s.write(D2, b"intact")
    with pytest.raises(CacheError, match="did not answer|cannot write blob"):
        s.write(D1, _FailingSource(6 * 2**20, on_fail=server.stop))
    server.start()  # same process, same port: the buckets survived
    assert s.exists([D1, D2]) == {D2}
    assert s.read(D1) is None and s.read(D2) == b"intact"


def test_s3_waits_are_bounded_by_default_and_by_the_environment(
    s3_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AOT_BLOB_CONNECT_TIMEOUT", "AOT_BLOB_READ_TIMEOUT", "AOT_BLOB_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    config = FsspecObjectStore("s3://bucket/p")._fs.config_kwargs
    assert (config["connect_timeout"], config["read_timeout"]) == (5.0, 10.0)
    assert config["retries"]["total_max_attempts"] == 3
    monkeypatch.setenv("AOT_BLOB_CONNECT_TIMEOUT", "1.5")
    monkeypatch.setenv("AOT_BLOB_READ_TIMEOUT", "2")
    monkeypatch.setenv("AOT_BLOB_RETRIES", "1")
    config = FsspecObjectStore("s3://bucket/p")._fs.config_kwargs
    assert (config["connect_timeout"], config["read_timeout"]) == (1.5, 2.0)
    assert config["retries"]["total_max_attempts"] == 1
    monkeypatch.setenv("AOT_BLOB_READ_TIMEOUT", "soon")
    with pytest.raises(CacheError, match="AOT_BLOB_READ_TIMEOUT='soon' is not a timeout"):
        FsspecObjectStore("s3://bucket/p")


def test_a_frozen_s3_endpoint_fails_within_the_read_timeout(
    s3_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A listener that accepts connections and never answers: a frozen server.
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(16)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{frozen.getsockname()[1]}")
        monkeypatch.setenv("AOT_BLOB_READ_TIMEOUT", "0.5")
        monkeypatch.setenv("AOT_BLOB_RETRIES", "1")
        s = FsspecObjectStore("s3://bucket/p")
        start = time.monotonic()
        with pytest.raises(CacheError, match="did not answer"):
            s.exists([D1])
        # botocore's own read timeout is 60 s; s3fs's retry loop repeats a few bounded waits
        assert time.monotonic() - start < 15


def test_storing_into_a_missing_bucket_is_called_a_write(s3_env: str) -> None:
    """Storing looks for an intact copy first: the error still names the write the
    user asked for (and the missing bucket, and what to do)."""
    from aot.cache.storage.content import ContentStore

    store = ContentStore(FsspecObjectStore(f"s3://aot-no-such-bucket-{secrets.token_hex(4)}/p"))
    with pytest.raises(CacheError) as caught:
        store.put(b"payload")
    message = str(caught.value)
    assert "cannot write blob " in message and "cannot read" not in message
    assert ": no such bucket (NoSuchBucket); create it first, or fix the bucket name in the URL" in message
