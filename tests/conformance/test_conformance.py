"""The conformance suite: every registered program is compiled into a cache by one
process and served by another that cannot import the program's module, and what it
serves is compared bit for bit with ``jax.jit``: the output structure, each leaf's
dtype, shape, weak type, sharding and bytes, and which donated inputs were deleted.

Two kinds of subprocess, started once per module (``conformance`` fixture): one
compile process for every program, and one serving process per group (the LAPACK
group apart, so that a crash there cannot take the others down). A process that
dies on a program is restarted with the programs after it, and that program's test
reports the death. Each program is its own test id.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import pytest

from tests.conformance import conformance_data as data
from tests.conformance import conformance_programs as programs

# The conformance programs served without their code, on every supported JAX release too.
pytestmark = [pytest.mark.slow, pytest.mark.version_suite]

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "conformance_harness.py"
GROUP_ORDER = ("main", "lapack")
PROCESS_TIMEOUT = 900


@dataclass
class Run:
    compiled: dict[str, dict[str, Any]] = field(default_factory=dict)
    served: dict[str, dict[str, Any]] = field(default_factory=dict)
    crashes: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_ENABLE_X64", None)
    return env


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(mode: str, arguments: list[str], records: Path, names: Iterable[str], run: Run) -> None:
    """Runs the harness over ``names``; a process that dies is restarted after the
    program it died on (recorded in ``run.crashes``)."""
    remaining = list(names)
    while remaining:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(HARNESS), mode, *arguments, str(records), *remaining],
            env=_environment(), capture_output=True, text=True, timeout=PROCESS_TIMEOUT,
            cwd=records.parent,
        )
        run.seconds[f"{mode} #{len(run.seconds) + 1}"] = round(time.perf_counter() - start, 2)
        lines = _records(records)
        done = {r["name"] for r in lines if "name" in r}
        if proc.returncode == 0 and all(n in done for n in remaining):
            return
        started = [r["start"] for r in lines if "start" in r and r["start"] in remaining]
        in_flight = next((n for n in reversed(started) if n not in done), None)
        crash = {"mode": mode, "exit": _exit_status(proc.returncode), "stderr": proc.stderr[-4000:]}
        if in_flight is None:  # died before its first program: every remaining one fails
            for name in remaining:
                run.crashes.setdefault(name, crash)
            return
        run.crashes[in_flight] = crash
        remaining = [n for n in remaining if n not in done and n != in_flight]


def _selected(session: pytest.Session) -> set[str]:
    """The programs whose tests this session runs (``-k`` compiles only those)."""
    return {
        item.callspec.params["name"] for item in session.items
        if getattr(item, "originalname", None) == "test_program" and hasattr(item, "callspec")
    }


@pytest.fixture(scope="module")
def conformance(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Run:
    folder = tmp_path_factory.mktemp("conformance")
    cache = folder / "cache"
    run = Run()
    selected = _selected(request.session) or set(programs.REGISTRY)
    order = sorted(
        (n for n in programs.REGISTRY if n in selected),
        key=lambda n: GROUP_ORDER.index(programs.REGISTRY[n].group),
    )
    compiled_file = folder / "compiled.jsonl"
    _run("compile", [str(cache)], compiled_file, order, run)
    run.compiled = {r["name"]: r for r in _records(compiled_file) if "name" in r}
    for group in GROUP_ORDER:
        names = [
            n for n in order
            if programs.REGISTRY[n].group == group and programs.REGISTRY[n].refuse is None
            and n in run.compiled and "compile_error" not in run.compiled[n]
        ]
        served_file = folder / f"served-{group}.jsonl"
        _run("serve", [str(cache), str(compiled_file)], served_file, names, run)
        run.served.update({r["name"]: r for r in _records(served_file) if "name" in r})
    print(f"\nconformance subprocess seconds: {run.seconds}")  # shown with -s
    return run


def _params() -> list[Any]:
    out = []
    for name, program in programs.REGISTRY.items():
        marks = [pytest.mark.xfail(strict=True, reason=program.xfail)] if program.xfail else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def _differences(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    problems = []
    if actual["treedef"] != expected["treedef"]:
        problems.append(f"output structure {actual['treedef']} != jax.jit's {expected['treedef']}")
    for i, (want, got) in enumerate(zip(expected["leaves"], actual["leaves"])):
        where = want["path"] or f"output {i}"
        for key in ("path", "python_type", "dtype", "shape", "weak_type", "sharding", "sha256"):
            if want[key] != got[key]:
                detail = f"{got[key]!r} != jax.jit's {want[key]!r}"
                if key == "sha256":
                    detail = f"bytes differ: {got['preview']} != jax.jit's {want['preview']}"
                problems.append(f"{where}: {key}: {detail}")
    if len(expected["leaves"]) != len(actual["leaves"]):
        problems.append(f"{len(actual['leaves'])} output leaves != jax.jit's {len(expected['leaves'])}")
    if actual.get("deleted") != expected.get("deleted"):
        problems.append(f"donated inputs deleted {actual.get('deleted')} != jax.jit's {expected.get('deleted')}")
    return problems


@pytest.mark.parametrize("name", _params())
def test_program(conformance: Run, name: str) -> None:
    program = programs.REGISTRY[name]
    crash = conformance.crashes.get(name)
    assert crash is None, f"the {crash['mode']} process died ({crash['exit']}) on {name}:\n{crash['stderr']}"
    compiled = conformance.compiled[name]
    if program.refuse is not None:
        refused = compiled["refused"]
        assert refused is not None, f"aot.lower accepted {name}; expected {program.refuse}"
        assert refused["type"] == program.refuse, refused["traceback"]
        assert "calls back" in refused["message"] or "callback" in refused["message"], refused["message"]
        return
    assert "compile_error" not in compiled, compiled["compile_error"]["traceback"]
    served = conformance.served[name]
    assert not served["model_imported"]
    assert "error" not in served, served["error"]["traceback"]
    problems = []
    for builder, expected in compiled["expected"].items():
        assert "error" not in expected, f"jax.jit itself failed: {expected['error']['traceback']}"
        actual = served["calls"][builder]
        if "error" in actual:
            problems.append(f"{builder}: {actual['error']['type']}: {actual['error']['message']}")
            continue
        problems += [f"{builder}: {p}" for p in _differences(expected, actual)]
    assert not problems, "\n".join(problems)


def test_the_registry_is_large_and_names_its_builders() -> None:
    assert len(programs.REGISTRY) >= 60
    for program in programs.REGISTRY.values():
        assert all(b in data.INPUTS for b in program.serve_inputs), program.name
        assert program.group in GROUP_ORDER
        assert program.xfail is None or program.xfail.startswith("issue 11: ")


def test_linen_parameters_have_the_structure_linen_init_gives() -> None:
    (params, x), _ = data.INPUTS["linen_mlp"]()
    shapes = jax.eval_shape(programs._linen_mlp().init, jax.random.PRNGKey(0), x)
    assert jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(params)
    assert jax.tree_util.tree_map(lambda s: s.shape, shapes) == jax.tree_util.tree_map(lambda a: a.shape, params)


def test_the_serving_process_cannot_import_the_programs(tmp_path: Path) -> None:
    code = (
        "import sys, conformance_harness as h\n"
        "h.block_model_code()\n"
        "try:\n    import conformance_programs\nexcept ImportError as e:\n    print('blocked:', e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=_environment(), capture_output=True, text=True,
        cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "blocked: the serving process must not import conformance_programs" in proc.stdout
