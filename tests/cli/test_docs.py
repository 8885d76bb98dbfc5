"""docs/cli.md documents every command and every option (as sqlite-utils'
tests/test_docs.py does), and the docs it points to exist."""

from __future__ import annotations

import re

import click
import pytest

from aot.cli.common import global_options
from aot.cli.main import cli
from tests.cli.helpers import REPO

DOCS = REPO / "docs"
CLI_MD = (DOCS / "cli.md").read_text()
GLOBAL = {max(option.opts, key=len) for option in global_options()}
GROUP_ONLY = {"--version", "--help"}


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = list(_commands(cli))


def _section(path: tuple[str, ...]) -> str:
    """The text under the ``## `aot PATH` ...`` heading, up to the next ``## ``."""
    heading = re.compile(rf"^## .*`aot {re.escape(' '.join(path))}`", re.MULTILINE)
    match = heading.search(CLI_MD)
    assert match is not None, f"docs/cli.md has no section for `aot {' '.join(path)}`"
    end = CLI_MD.find("\n## ", match.end())
    return CLI_MD[match.start(): end if end != -1 else len(CLI_MD)]


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_and_its_options_are_documented(path: tuple[str, ...], command: click.Command) -> None:
    section = _section(path)
    assert f"aot {' '.join(path)}" in CLI_MD.split("## Global options")[0], "missing from the synopsis"
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        longest = max(param.opts, key=len)
        if longest in GLOBAL or longest in GROUP_ONLY:
            continue
        assert f"`{longest}" in section, f"`aot {' '.join(path)}`: {longest} is not documented"


def test_global_options_are_documented() -> None:
    section = CLI_MD.split("## Global options", 1)[1].split("\n## ", 1)[0]
    for option in sorted(GLOBAL):
        assert f"`{option}" in section, option
    group_options = {max(p.opts, key=len) for p in cli.params if isinstance(p, click.Option)}
    assert group_options - GLOBAL == GROUP_ONLY - {"--help"}  # --help is added by click
    for option in ("-v", "--version", "-h"):
        assert f"`{option}" in section


def test_every_environment_variable_and_config_key_is_documented() -> None:
    from aot.cache.config import ENVIRONMENT, SIGNING_KEY_ENV, TIMEOUT_KEYS
    from aot.cache.timeouts import ENVIRONMENT as BOUNDS

    for variable in (*ENVIRONMENT.values(), SIGNING_KEY_ENV, *BOUNDS.values()):
        assert variable in CLI_MD, variable
    config = CLI_MD.split("## Settings and the configuration file", 1)[1].split("\n## ", 1)[0]
    for key in (*ENVIRONMENT, *TIMEOUT_KEYS):
        assert f"\n{key} = " in config, key


def test_linked_documents_exist() -> None:
    for doc in (DOCS / "cli.md", DOCS / "specs.md", DOCS / "manifest.md", DOCS / "serving.md"):
        for target in re.findall(r"\]\(([a-z]+\.md)(?:#[^)]*)?\)", doc.read_text()):
            assert (DOCS / target).exists(), f"{doc.name} links to {target}"


def test_no_reference_to_a_design_document_outside_the_repository() -> None:
    for path in (REPO / "fixtures" / "warmup.toml", REPO / "tests" / "aot" / "test_specs.py"):
        assert "DESIGN.md" not in path.read_text(), path


def test_the_manifest_keys_are_documented() -> None:
    from aot.cache.warmup.manifest import _FUNCTION_KEYS

    manifest_md = (DOCS / "manifest.md").read_text()
    for key in _FUNCTION_KEYS:
        assert f"| `{key}` |" in manifest_md, key


def test_every_dtype_and_alias_is_in_the_spec_docs() -> None:
    from aot.specs import _ALIASES, DTYPES

    specs_md = (DOCS / "specs.md").read_text()
    for name in (*DTYPES, *_ALIASES):
        assert f"`{name}`" in specs_md, name


def test_the_ten_line_example_does_not_reuse_a_name_of_the_readme_main_job() -> None:
    """README command 1 warms fixtures/warmup.toml into ./aot-cache, the cache the
    ten-line example compiles into: one name there would mix two programs' buckets."""
    from aot.cache.warmup.manifest import load_manifest

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    example = readme.split("## In ten lines", 1)[1].split("```", 2)[1]
    assert './aot-cache' in example and "aot-cache warmup fixtures/warmup.toml" in readme
    used = set(re.findall(r'name="([^"]+)"', example)) | set(re.findall(r'aot\.load\("([^"]+)"', example))
    assert used == {"example.forward"}
    assert used.isdisjoint({f.name for f in load_manifest(REPO / "fixtures" / "warmup.toml").functions})
