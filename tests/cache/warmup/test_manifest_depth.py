"""A deeply nested manifest is a ManifestError naming the depth limit, not a RecursionError."""

from __future__ import annotations

from pathlib import Path

import pytest

from aot.cache.warmup.manifest import MAX_NESTING, load_manifest, parse_manifest
from aot.errors import ManifestError

FUNCTION = '[[function]]\nname = "f"\nfunction = "m:f"\nargs = ["f32[2]"]\n'


def _nested_static(levels: int) -> str:
    return FUNCTION + "static = { s = " + "[" * levels + "1" + "]" * levels + " }\n"


@pytest.mark.parametrize(
    "text",
    [
        _nested_static(5000),  # past the TOML reader's stack
        FUNCTION + "static = " + "{ a = " * 5000 + "1" + " }" * 5000 + "\n",
        "x = " + "[" * 5000 + "]" * 5000 + "\n" + FUNCTION,
        _nested_static(MAX_NESTING + 5),  # read, but deeper than the limit
    ],
    ids=["arrays", "inline-tables", "top-level", "just-past-the-limit"],
)
def test_a_deep_manifest_is_a_manifest_error_naming_the_limit(text: str) -> None:
    with pytest.raises(ManifestError, match=f"nest more than {MAX_NESTING} levels deep") as raised:
        parse_manifest(text, "deep.toml")
    message = str(raised.value)
    assert message.startswith("deep.toml: ") and "args_from" in message and "\n" not in message


def test_a_manifest_within_the_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(_nested_static(MAX_NESTING - 8), encoding="utf-8")  # the document, [[function]], static count too
    (entry,) = load_manifest(path).functions
    assert dict(entry.static)["s"][0][0] is not None
