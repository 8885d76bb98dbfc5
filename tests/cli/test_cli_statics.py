"""Statics in what the CLI shows: aot compile --static lands in the signature, and
ls, show and why (--static) show and compare it."""

from __future__ import annotations

import json

from tests.cli.helpers import Invoke


def _compile(invoke: Invoke, double: str) -> dict:
    result = invoke(
        "compile", "tests.cli.models:affine", "--name", "affine", "--arg", "f32[8]",
        "--kwarg", "bias=f32[8]", "--static", f"double={double}", "--json",
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_static_values_are_two_signatures_in_ls_and_show(invoke: Invoke) -> None:
    doubled, plain = _compile(invoke, "true"), _compile(invoke, "false")
    assert doubled["signature"] == "f32[8], f32[8], double=True"
    assert plain["signature"] == "f32[8], f32[8], double=False"
    listed = invoke("ls")
    assert listed.exit_code == 0, listed.output
    rows = [line.split("  ")[0:3] for line in listed.stdout.splitlines()[1:3]]
    assert sorted(line for line in listed.stdout.splitlines() if "affine" in line and "double=" in line) == sorted(
        line for line in listed.stdout.splitlines() if "affine" in line
    ) and len(rows) == 2
    assert "x: f32[8], bias: f32[8], double=True" in listed.stdout
    assert "x: f32[8], bias: f32[8], double=False" in listed.stdout
    data = json.loads(invoke("ls", "--json").stdout)["entries"]
    assert sorted((e["signature"], tuple(e["statics"])) for e in data) == [
        ("f32[8], f32[8], double=False", ("double=False",)),
        ("f32[8], f32[8], double=True", ("double=True",)),
    ]
    # Two statics are two signatures: neither supersedes the other.
    assert all(e["superseded_by"] is None for e in data)
    shown = invoke("show", doubled["key"])
    assert shown.stdout.splitlines()[0] == "affine (x: f32[8], bias: f32[8], double=True)"
    assert "  double (static)  True" in shown.stdout.splitlines()
    shown_json = json.loads(invoke("show", doubled["key"], "--json").stdout)["entries"][0]
    assert shown_json["statics"] == ["double=True"]
    assert shown_json["manifest"]["statics"] == [{"index": None, "name": "double", "repr": "True"}]


def test_why_compares_statics_without_the_function(invoke: Invoke) -> None:
    doubled = _compile(invoke, "true")
    hit = invoke("why", "affine", "--arg", "f32[8]", "--kwarg", "bias=f32[8]", "--static", "double=true", "--json")
    assert hit.exit_code == 0, hit.output
    assert json.loads(hit.stdout)["nearest_key"] == doubled["key"]
    miss = invoke("why", "affine", "--arg", "f32[8]", "--kwarg", "bias=f32[8]", "--static", "double=false")
    assert miss.exit_code == 1
    assert miss.stdout.splitlines() == [
        f"affine (x: f32[8], bias: f32[8], double=False): miss; nearest of 1 stored entry is "
        f"{doubled['key'][:12]} (x: f32[8], bias: f32[8], double=True)",
        "  statics double=True != double=False",
    ]
