"""cache.release_diff(a, b): the members that differ between two labels' current sets
and why (what `aot release diff` prints)."""

from __future__ import annotations

from aot.cache.index.refs import RefOrigin


def _declare(cache, label: str, entries) -> None:  # noqa: ANN001
    cache.index.declare_release(label, [(e.name, e.signature, e.env_fp, e.key) for e in entries], RefOrigin("ci"))


def test_a_signature_in_another_environment_is_one_member_changed(open_folder_cache, compiled, foreign) -> None:  # noqa: ANN001
    """prod serves tiny built with jaxlib 0.0.1; candidate serves it built here: the
    same member, changed in its environment (not one removed and one added)."""
    cache = open_folder_cache()
    old, new = cache.put(foreign(compiled.tiny, jaxlib="0.0.1")), cache.put(compiled.tiny)
    _declare(cache, "prod", [old])
    _declare(cache, "candidate", [new])
    diff = cache.release_diff("prod", "candidate")
    assert [(c.change, c.key_a, c.key_b) for c in diff.changes] == [("changed", old.key, new.key)]
    here = cache.index.get(new.key)
    jaxlib = [d for d in diff.changes[0].differences if d.part == "jaxlib"]
    assert [(d.expected, d.actual) for d in jaxlib] == [("0.0.1", _jaxlib(here))]
    assert diff.describe().splitlines()[2] == f"      jaxlib 0.0.1 != {_jaxlib(here)}"
    assert diff.same == 0


def test_a_member_whose_entry_is_gone_is_compared_by_key_only(open_folder_cache, compiled) -> None:  # noqa: ANN001
    """A set that names an entry gc collected (a rollback set, a label copied without
    its entries): the member still differs, and the diff says why its parts are not."""
    cache = open_folder_cache()
    stored = cache.put(compiled.tiny)
    _declare(cache, "prod", [stored])
    gone = "0" * 64
    cache.index.declare_release("candidate", [(stored.name, stored.signature, stored.env_fp, gone)], RefOrigin("ci"))
    (change,) = cache.release_diff("prod", "candidate").changes
    assert change.change == "changed" and change.differences == () and change.target_b is None
    assert change.describe()[1:] == [
        "      parts not compared: entry 000000000000 is not stored (or its manifest is unreadable)"
    ]


def _jaxlib(entry) -> str:  # noqa: ANN001
    import json

    return json.loads(entry.manifest)["environment"]["parts"]["jaxlib"]
