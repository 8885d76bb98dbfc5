"""Is a stored executable the one this host compiles from the stored portable HLO?
(``aot verify --recompile``.)

Three ways to compare two executables of one program, from the most to the least exact:

- **bytes**: the serialized executables are equal. Rare: the stored executable was
  compiled from the lowering of the model's code, the recompiled one from
  ``jax.export``'s module, whose names and sharding annotations differ, so their bytes
  differ even on CPU, where two compiles of one module serialize equal; and TPU
  executables differ from compile to compile (docs/accelerators.md).
- **optimized HLO**: the compiled modules after XLA's optimizations, each instruction
  hashed with its operands and called computations, without what names or locates
  things (instruction and computation names, source metadata, stack frames, the
  module's name and front-end attributes, replicated-sharding notes): the same
  instructions, fusions and layouts, whatever order a name-dependent tie-break
  scheduled them in.
- **outputs**: both executables run on the same generated inputs (deterministic
  pseudo-random values of each argument's shape and dtype) and give bit-identical
  outputs. Code generation below HLO (optimization level, fast math) shows here only.

:func:`compare_executables` says OK when the bytes are equal or the outputs are; the
optimized HLO is compared too and, when only its form differs (the export path keeps an
argument the original pruned, or a fused computation differs: 7 of 101 conformance
programs on CPU), OK says so. Without outputs, the optimized HLO decides.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Comparison", "NoGeneratedInputs", "canonical_hlo", "compare_executables", "generated_inputs"]

_STACK_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
# Attributes that name, locate or annotate and cannot change what runs.
_DROPPED_ATTRIBUTES = ("metadata", "frontend_attributes", "origin")
_NAME = re.compile(r"%[A-Za-z_][\w.\-]*")
_HEADER = re.compile(r"^(ENTRY )?(%[\w.\-]+) \((.*)\) -> (.*) \{$")
_PARAM_NAME = re.compile(r"(?:^|, )[\w.\-]+: ")
# A replicated sharding as XLA 0.12.1 prints an export's parameters (an empty mesh, no axis
# per dimension, or `replicated` for a scalar): the same note as ``sharding={replicated}``, which the lowering omits.
_REPLICATED = re.compile(r", sharding=\{mesh\[\], (?:replicated|\[(?:\{\}(?:, )?)*\])\}")


def _drop_attribute(line: str, name: str) -> str:
    """``line`` without ``, name={...}`` (braces balanced, quoted text skipped)."""
    marker = f", {name}={{"
    while (start := line.find(marker)) >= 0:
        i, depth, quoted = start + len(marker), 1, False
        while i < len(line) and depth:
            c = line[i]
            if c == '"' and line[i - 1] != "\\":
                quoted = not quoted
            elif not quoted:
                depth += {"{": 1, "}": -1}.get(c, 0)
            i += 1
        line = line[:start] + line[i:]
    return line


def _entry_layout(header: str) -> str:
    """The ``entry_computation_layout={...}`` of a module's header line (braces balanced)."""
    marker = "entry_computation_layout={"
    start = header.find(marker)
    if start < 0:
        return ""
    i, depth = start + len(marker), 1
    while i < len(header) and depth:
        depth += {"{": 1, "}": -1}.get(header[i], 0)
        i += 1
    return header[start + len(marker): i - 1]


def _stripped_lines(text: str) -> list[str]:
    """The module's lines without stack frames, metadata and annotations."""
    lines: list[str] = []
    skipping = False
    for raw in text.splitlines():
        line = raw.strip()
        if line in _STACK_SECTIONS:
            skipping = True
            continue
        if skipping:
            skipping = bool(line)
            continue
        if not line:
            continue
        if line.startswith("HloModule "):
            lines.append(f"HloModule {_entry_layout(line)}")
            continue
        for attribute in _DROPPED_ATTRIBUTES:
            line = _drop_attribute(line, attribute)
        lines.append(_REPLICATED.sub("", line.replace(", sharding={replicated}", "")))
    return lines


def canonical_hlo(text: str) -> str:
    """Optimized HLO text as a name-free digest per computation (see the module
    docstring): each instruction is hashed with its operands' and called computations'
    hashes in place of their names, so two compiles of one program agree however their
    instructions were named, and whatever order a name-dependent tie-break scheduled
    independent instructions in. One line per computation (its role and digest), in
    the module's order, and the module's entry layout first."""
    computations: dict[str, tuple[str, str, list[tuple[bool, str, str]]]] = {}
    head = ""
    current: list[tuple[bool, str, str]] | None = None
    for line in _stripped_lines(text):
        header = _HEADER.match(line)
        if header:
            params = _PARAM_NAME.sub(lambda m: ", " if m.group(0).startswith(",") else "", header.group(3))
            current = []
            computations[header.group(2)] = (header.group(1) or "", f"({params}) -> {header.group(4)}", current)
        elif line == "}":
            current = None
        elif current is not None:
            root, _, rest = line.partition("ROOT ") if line.startswith("ROOT ") else ("", "", line)
            name, _, body = rest.partition(" = ")
            current.append((bool(root) or line.startswith("ROOT "), name, body))
        elif line.startswith("HloModule "):
            head = line
    digests: dict[str, str] = {}

    def computation_digest(name: str) -> str:
        if name not in digests:
            digests[name] = "..."  # a cycle cannot occur in HLO; guards the recursion
            _, signature, instructions = computations[name]
            bodies = {n: b for _, n, b in instructions}
            memo: dict[str, str] = {}

            def digest(ref: str) -> str:
                if ref in memo:
                    return memo[ref]
                if ref in bodies:
                    memo[ref] = "..."
                    text = _NAME.sub(lambda m: digest(m.group(0)), bodies[ref])
                    memo[ref] = hashlib.sha256(text.encode()).hexdigest()[:16]
                    return memo[ref]
                if ref in computations:
                    return computation_digest(ref)
                return ref  # not defined in this module: keep its name

            roots = [digest(n) for is_root, n, _ in instructions if is_root]
            every = sorted(digest(n) for _, n, _ in instructions)
            digests[name] = hashlib.sha256(f"{signature}|{roots}|{every}".encode()).hexdigest()[:16]
        return digests[name]

    out = [head]
    out += [f"{'ENTRY ' if entry else ''}{computation_digest(name)} {sig}" for name, (entry, sig, _) in computations.items()]
    return "\n".join(out)


class NoGeneratedInputs(ValueError):
    """No input of this dtype can be generated here (an extended dtype such as a PRNG
    key of a non-default implementation)."""


def generated_inputs(avals: Sequence[Any], seed: int = 0) -> list[Any]:
    """Deterministic pseudo-random arguments of ``avals`` (shape and dtype): normals for
    floats and complex numbers, small integers, random booleans, typed PRNG keys of
    JAX's default implementation split from ``seed``."""
    import jax

    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for aval in avals:
        shape = tuple(aval.shape)
        if jax.dtypes.issubdtype(aval.dtype, jax.dtypes.prng_key):
            key = jax.random.key(seed + len(out))
            if key.dtype != aval.dtype:
                raise NoGeneratedInputs(f"cannot generate inputs of dtype {aval.dtype}")
            out.append(jax.random.split(key, int(np.prod(shape, dtype=int))).reshape(shape))
            continue
        dtype = np.dtype(aval.dtype)
        if dtype == np.bool_:
            value = rng.integers(0, 2, size=shape).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            value = rng.integers(0, 8, size=shape).astype(dtype)
        elif np.issubdtype(dtype, np.complexfloating):
            value = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
        else:
            value = rng.standard_normal(shape).astype(dtype)  # bf16 and fp8 included (ml_dtypes)
        out.append(np.asarray(value))
    return out


@dataclass(frozen=True, slots=True)
class Comparison:
    """How two executables of one program compared."""

    same: bool
    method: str  # "bytes", "hlo+outputs", "outputs" (the HLO's form differs), "hlo" (no outputs run)
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"same": self.same, "method": self.method, "detail": self.detail}


def _first_difference(a: str, b: str) -> str:
    for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines())):
        if x != y:
            return f"line {i + 1}: stored {x[:100]!r}, here {y[:100]!r}"
    return f"stored {len(a.splitlines())} lines, here {len(b.splitlines())}"


def compare_executables(
    stored: Any, recompiled: Any, *, stored_bytes: bytes, recompiled_bytes: bytes,
    run: bool = True, seed: int = 0,
) -> Comparison:
    """Compares two :class:`aot.MeshExecutable` of one program (see the module
    docstring), loaded with flat outputs. ``run``: also run both on generated inputs.

    The verdict: equal bytes; else bit-identical outputs on generated inputs, the
    optimized HLO compared too (``hlo+outputs`` when it is the same, ``outputs`` with
    the first difference when only its form differs: the recompile keeps an argument
    the original pruned, or a fusion is cut otherwise); without outputs (``run=False``,
    or inputs that cannot be generated), the optimized HLO alone."""
    if stored_bytes == recompiled_bytes:
        return Comparison(True, "bytes")
    mine, theirs = canonical_hlo(stored.as_text()), canonical_hlo(recompiled.as_text())
    hlo_note = "" if mine == theirs else "optimized HLO differs: " + _first_difference(mine, theirs)
    if not run:
        return Comparison(not hlo_note, "hlo", hlo_note)
    import jax

    try:
        args = generated_inputs(list(stored.in_avals), seed)
    except NoGeneratedInputs as exc:
        return Comparison(not hlo_note, "hlo", hlo_note or f"outputs not compared: {exc}")

    def outputs(executable: Any) -> list[np.ndarray]:
        # Flat leaves in, by the executable's own structure: no model code is needed.
        result = executable.bind(executable.info.in_tree)(list(args))
        leaves = jax.tree_util.tree_leaves(jax.block_until_ready(result))
        return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
                for x in leaves]

    expected, actual = outputs(stored), outputs(recompiled)
    if len(expected) != len(actual):
        return Comparison(False, "outputs", f"{len(expected)} outputs stored, {len(actual)} here")
    for i, (x, y) in enumerate(zip(expected, actual)):
        if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
            note = f"; {hlo_note}" if hlo_note else " (the optimized HLO is the same)"
            return Comparison(False, "outputs", f"output {i} differs on generated inputs (seed {seed}){note}")
    if hlo_note:
        return Comparison(True, "outputs", f"outputs equal; {hlo_note} (in form only)")
    return Comparison(True, "hlo+outputs")
