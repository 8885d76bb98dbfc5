"""The network bounds given to ``aot.Cache(..., timeouts=...)`` (and to ``aot.load``,
``aot.jax_cache.install``, push/pull and warm-up workers) are the ones in effect: on
a real PostgreSQL session, in the S3 client's configuration, at the last statistics
flush; they beat the environment, which still applies without them."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

import aot
from aot.cache.timeouts import Timeouts, timeouts
from aot.errors import CacheError, UsageError

BOUND_VARIABLES = (
    "AOT_DB_CONNECT_TIMEOUT", "AOT_DB_STATEMENT_TIMEOUT", "AOT_BLOB_CONNECT_TIMEOUT",
    "AOT_BLOB_READ_TIMEOUT", "AOT_BLOB_RETRIES", "AOT_STATS_EXIT_TIMEOUT",
)
GIVEN = Timeouts(
    db_connect_s=2, db_statement_s=1.5, blob_connect_s=1.5, blob_read_s=2, blob_retries=1, stats_exit_s=0.25,
)


@pytest.fixture
def environment_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment sets other bounds than GIVEN, so a test sees which one won."""
    for name, value in zip(BOUND_VARIABLES, ("9", "7", "8", "9", "4", "6")):
        monkeypatch.setenv(name, value)


def _show(engine: sa.Engine, setting: str) -> str:
    with engine.connect() as conn:
        return str(conn.exec_driver_sql(f"SHOW {setting}").scalar_one())


def _connect_timeout(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        return str(conn.connection.dbapi_connection.info.get_parameters()["connect_timeout"])


def _s3_config(cache: aot.Cache) -> dict:
    return dict(cache.blobs.store._fs.config_kwargs)


def test_timeouts_is_public_and_a_partial_override_is_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    assert aot.Timeouts is Timeouts and "Timeouts" in aot.__all__
    monkeypatch.setenv("AOT_BLOB_RETRIES", "5")
    monkeypatch.setenv("AOT_BLOB_READ_TIMEOUT", "20")
    # A Timeouts is used whole: the fields not given are the defaults, not the environment's.
    assert Timeouts(blob_read_s=1) == Timeouts(blob_read_s=1, blob_retries=3)
    # from_environment keeps the environment's other bounds.
    mixed = Timeouts.from_environment(blob_read_s=1)
    assert (mixed.blob_read_s, mixed.blob_retries, mixed.db_connect_s) == (1, 5, 5)
    assert Timeouts.from_environment() == timeouts() == Timeouts(blob_read_s=20, blob_retries=5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"blob_read_s": 0}, "Timeouts(blob_read_s=0) is not a timeout: expected seconds, more than 0, "
                             "e.g. Timeouts(blob_read_s=10.0)"),
        ({"db_connect_s": -1}, "Timeouts(db_connect_s=-1) is not a timeout"),
        ({"blob_retries": 1.5}, "Timeouts(blob_retries=1.5) is not a count: expected a whole number of "
                                "attempts, 1 or more, e.g. Timeouts(blob_retries=3)"),
        ({"stats_exit_s": "soon"}, "Timeouts(stats_exit_s='soon') is not a timeout: expected seconds, 0 or "
                                   "more (0: drop at once)"),
    ],
)
def test_a_bound_that_is_not_one_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(CacheError) as info:
        Timeouts(**kwargs)
    assert str(info.value).startswith(message)


def test_zero_means_the_servers_statement_timeout_and_drop_at_once() -> None:
    zero = Timeouts(db_statement_s=0, stats_exit_s=0)
    assert (zero.db_statement_timeout_ms, zero.stats_exit_s) == (0, 0)


def test_a_cache_that_is_not_given_timeouts_reads_the_environment(
    tmp_path: Path, environment_bounds: None, s3_url: str, postgres_url: str
) -> None:
    with aot.Cache(tmp_path / "c", blob_location=s3_url) as cache:
        assert cache.timeouts is None
        config = _s3_config(cache)
        assert (config["connect_timeout"], config["read_timeout"]) == (8.0, 9.0)
        assert cache.stats.exit_seconds is None  # AOT_STATS_EXIT_TIMEOUT, read at close
    with aot.Cache(postgres_url) as cache:
        assert _show(cache.index.engine, "statement_timeout") == "7s"
        assert _connect_timeout(cache.index.engine) == "9"


def test_given_timeouts_reach_the_postgres_sessions(postgres_url: str, environment_bounds: None) -> None:
    with aot.Cache(postgres_url, timeouts=GIVEN) as cache:
        assert cache.timeouts is GIVEN
        assert _show(cache.index.engine, "statement_timeout") == "1500ms"
        assert _connect_timeout(cache.index.engine) == "2"
    # A read-only open (what aot.load does first) carries them too.
    from aot.cache.serving.load import open_existing

    with open_existing(postgres_url, read_only=True, timeouts=GIVEN) as cache:
        assert _show(cache.index.engine, "statement_timeout") == "1500ms"
        assert _show(cache.index.engine, "default_transaction_read_only") == "on"


def test_given_timeouts_reach_the_s3_client_of_a_cache_and_of_its_local_tier(
    tmp_path: Path, s3_url: str, environment_bounds: None
) -> None:
    with aot.Cache(tmp_path / "c", blob_location=s3_url, timeouts=GIVEN) as cache:
        config = _s3_config(cache)
        assert (config["connect_timeout"], config["read_timeout"]) == (1.5, 2.0)
        assert config["retries"] == {"total_max_attempts": 1, "mode": "standard"}
        assert cache.stats.exit_seconds == 0.25
    for read_only in (False, True):  # statistics in the remote, or in the tier
        with aot.Cache(tmp_path / "c", blob_location=s3_url, local=tmp_path / "tier",
                       read_only=read_only, timeouts=GIVEN) as tiered:
            assert type(tiered).__name__ == "TieredCache"
            assert _s3_config(tiered)["read_timeout"] == 2.0
            assert tiered.local.timeouts is GIVEN
            assert tiered.stats.exit_seconds == 0.25


def test_the_last_statistics_flush_keeps_the_given_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import threading
    import time

    monkeypatch.setenv("AOT_STATS_EXIT_TIMEOUT", "30")
    cache = aot.Cache(tmp_path / "c", timeouts=Timeouts(stats_exit_s=0.3))
    release = threading.Event()
    recorder = cache.stats
    monkeypatch.setattr(recorder, "flush", lambda: release.wait(30))  # a write that hangs
    try:
        start = time.monotonic()
        assert recorder.close() is False
        assert 0.25 < time.monotonic() - start < 5  # not AOT_STATS_EXIT_TIMEOUT's 30 s
    finally:
        release.set()
        cache.close()


def test_load_and_install_open_their_cache_with_the_given_timeouts(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    aot.Cache(folder).close()
    from aot.cache.serving.load import open_existing

    with open_existing(folder, timeouts=GIVEN) as cache:
        assert cache.timeouts is GIVEN
    with aot.Cache(folder) as cache:
        with pytest.raises(UsageError, match="an open cache keeps the bounds it was opened with"):
            aot.load("f", cache, timeouts=GIVEN)
        with pytest.raises(UsageError, match="pass timeouts= to aot.Cache"):
            aot.jax_cache.install(cache, timeouts=GIVEN)
    backend = aot.jax_cache.install(str(folder), timeouts=GIVEN)
    try:
        assert backend.timeouts is GIVEN
        opened = backend._opener()
        try:
            assert opened.timeouts is GIVEN
        finally:
            opened.close()
    finally:
        aot.jax_cache.uninstall()


def test_warmup_workers_and_the_other_end_of_a_push_keep_the_bounds(tmp_path: Path) -> None:
    from aot.cache.admin.transfer import open_other
    with aot.Cache(tmp_path / "c", timeouts=GIVEN) as cache:
        assert cache.options()["timeouts"] is GIVEN
        with open_other(tmp_path / "d", read_only=False, like=cache) as other:
            assert other.timeouts is GIVEN
    with aot.Cache(tmp_path / "c") as cache:
        assert "timeouts" not in cache.options()  # the worker reads its environment


def test_a_cache_refuses_timeouts_of_another_type(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="timeouts must be an aot.Timeouts"):
        aot.Cache(tmp_path / "c", timeouts={"blob_read_s": 1})
