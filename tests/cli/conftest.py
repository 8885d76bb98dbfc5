"""Fixtures of the CLI tests: a CliRunner bound to a temporary cache, a warmed cache.

Tests run from the repository root (``fixtures.models`` is importable from there, as
the warmup manifest expects) with a cache folder under ``tmp_path``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from aot.cli.main import cli
from tests.cli.helpers import MANIFEST, REPO, Invoke

# A developer's settings must not change what the tests see.
_SETTINGS_ENV = (
    "AOT_CACHE", "AOT_BLOBS", "AOT_SIGNING_KEY", "AOT_SIGNING_KEY_FILE", "AOT_MANIFEST", "COLUMNS",
    "AOT_DB_CONNECT_TIMEOUT", "AOT_DB_STATEMENT_TIMEOUT", "AOT_BLOB_CONNECT_TIMEOUT",
    "AOT_BLOB_READ_TIMEOUT", "AOT_BLOB_RETRIES", "AOT_STATS_EXIT_TIMEOUT",
)


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    for name in _SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _invoker(location: Path) -> Invoke:
    runner = CliRunner()

    def invoke(*args: str, cache: Path | str | None = location, **kwargs) -> Result:
        prefix = ["--cache", str(cache)] if cache is not None else []
        return runner.invoke(cli, [*prefix, *map(str, args)], **kwargs)

    return invoke


@pytest.fixture
def invoke(cache_dir: Path) -> Invoke:
    """``invoke("ls", "--json")`` runs ``aot --cache <tmp cache> ls --json`` in-process."""
    return _invoker(cache_dir)


@pytest.fixture(scope="session")
def _warmed_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from aot.cache.warmup.run import expand, load_manifest, run_warmup

    folder = tmp_path_factory.mktemp("warmed") / "cache"
    report = run_warmup(str(folder), expand(load_manifest(MANIFEST)), jobs=1)
    assert report.ok, report.to_dict()
    return folder


@pytest.fixture
def warmed(_warmed_template: Path, cache_dir: Path) -> Iterator[Path]:
    """A copy of a cache holding every entry of fixtures/warmup.toml."""
    shutil.copytree(_warmed_template, cache_dir)
    yield cache_dir
