"""click parameter types: sizes, ages, meshes; completion of entry names and manifests."""

from __future__ import annotations

import os
from typing import Any

import click
from click.shell_completion import CompletionItem


class SizeType(click.ParamType):
    """``10G``, ``500M``, ``1.5GiB``, a byte count -> bytes (binary units)."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from aot.cache.units import parse_size
        from aot.errors import AotError

        try:
            size = parse_size(str(value))
        except AotError as exc:
            self.fail(str(exc), param, ctx)
        assert size is not None
        return size


class AgeType(click.ParamType):
    """``30d``, ``12h``, ``15min``, ``2w``, ``1mo`` (30 days); ``m`` is refused. The
    value stays the text given (the plan quotes it); it is checked here."""

    name = "age"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from aot.cache.units import parse_age
        from aot.errors import AotError

        try:
            parse_age(str(value))
        except AotError as exc:
            self.fail(str(exc), param, ctx)
        return str(value)


class MeshType(click.ParamType):
    """``data=4,model=2`` -> ``(("data", 4), ("model", 2))``."""

    name = "mesh"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        from aot.cache.warmup.manifest import parse_mesh
        from aot.errors import SpecError

        try:
            return parse_mesh(str(value))
        except SpecError as exc:
            self.fail(str(exc), param, ctx)


SIZE = SizeType()
AGE = AgeType()
MESH = MeshType()


def complete_entry_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The names stored in the cache the command line's options (or AOT_CACHE, or
    [tool.aot]) name; nothing when there is no cache (completion never fails).

    Runs on every TAB, so it imports neither JAX nor (for a folder cache) SQLAlchemy:
    a folder's index is read with the standard library's SQLite reader."""
    try:
        from aot.cache.config import resolve_settings
        from aot.cache.index.protocol import open_reader

        from aot.cli.common import State

        state = ctx.find_object(State)
        flags = {"cache": getattr(state, "location", None), "blobs": None}
        location = resolve_settings(flags).cache.value
        assert location is not None
        index = open_reader(location)
        if index is None:  # no cache: never create one
            return []
        try:
            names = [name for name in index.names() if name.startswith(incomplete)]
        finally:
            index.close()
    except Exception:  # noqa: BLE001 - completion must never print an error
        return []
    return [CompletionItem(name) for name in names]


def complete_manifests(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """``*.toml`` files (and folders, to descend into) starting with ``incomplete``."""
    folder, prefix = os.path.split(incomplete)
    try:
        names = sorted(os.listdir(folder or "."))
    except OSError:
        return []
    items = []
    for name in names:
        if not name.startswith(prefix) or (name.startswith(".") and not prefix.startswith(".")):
            continue
        if name == "__pycache__":  # Python's bytecode, never a manifest's folder
            continue
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            items.append(CompletionItem(path + os.sep))
        elif name.endswith(".toml"):
            items.append(CompletionItem(path))
    return items
