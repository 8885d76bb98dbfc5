"""``aot why --target PLATFORM:CHIP:TOPOLOGY``: would a replica on that accelerator hit?
(compared with the target's environment, computed here without the chip), and
``--function``, the Python function, which ``--target MODULE:FUNCTION`` used to name."""

from __future__ import annotations

import json

from tests.aot.test_targets import needs_libtpu
from tests.cli.helpers import Invoke

TINY = ("--arg", "f32[8]", "--arg", "f32[8]")


@needs_libtpu
def test_why_answers_for_a_target(invoke: Invoke) -> None:
    compiled = invoke("compile", "fixtures.models:tiny", "--name", "tiny", *TINY, "--target", "tpu:v5e:1x1")
    assert compiled.exit_code == 0, compiled.output

    hit = invoke("why", "tiny", *TINY, "--target", "tpu:v5e:1x1")
    assert hit.exit_code == 0, hit.output
    assert hit.stdout.startswith("tiny@tpu:v5e:1x1 (x: f32[8], y: f32[8]): hit, key "), hit.stdout
    # Lowered for the target too: every program part matches what the warm-up stored.
    lowered = invoke("why", "tiny", *TINY, "--function", "fixtures.models:tiny", "--target", "tpu:v5e:1x1", "--json")
    assert lowered.exit_code == 0, lowered.output
    assert json.loads(lowered.stdout)["target"] == "tpu:v5e:1x1"

    other = invoke("why", "tiny", *TINY, "--target", "tpu:v5e:2x2")
    assert other.exit_code == 1, other.output
    lines = other.stdout.splitlines()
    assert lines[0].startswith("tiny@tpu:v5e:2x2 (x: f32[8], y: f32[8]): miss; nearest of 1 stored entry is ")
    assert "  device_count 1 != 4" in lines

    # This host (8 CPU devices) misses it: the entry is the TPU's.
    here = invoke("why", "tiny", *TINY, "--json")
    assert here.exit_code == 1
    data = json.loads(here.stdout)
    assert data["target"] is None and "platform" in {d["part"] for d in data["differences"]}


def test_the_old_target_spelling_of_the_function_warns_and_works(invoke: Invoke) -> None:
    invoke("compile", "fixtures.models:tiny", "--name", "tiny", *TINY)
    old = invoke("why", "tiny", *TINY, "--target", "fixtures.models:tiny")
    assert old.exit_code == 0, old.output
    assert old.stdout.startswith("tiny (x: f32[8], y: f32[8]): hit, key "), old.stdout
    assert old.stderr.splitlines() == [
        "warning: --target MODULE:FUNCTION is now --function MODULE:FUNCTION (--target names a device "
        "target, e.g. tpu:v5e:2x2); running as --function fixtures.models:tiny"
    ]
    new = invoke("why", "tiny", *TINY, "--function", "fixtures.models:tiny")
    assert new.exit_code == 0 and new.stderr == "", new.output


def test_why_target_usage_errors(invoke: Invoke) -> None:
    invoke("compile", "fixtures.models:tiny", "--name", "tiny", *TINY)
    unknown = invoke("why", "tiny", *TINY, "--target", "tpu:v5e:3x3")
    assert unknown.exit_code == 2 and "unknown target 'tpu:v5e:3x3'; known: tpu:v4:{" in unknown.stderr
    both = invoke("why", "tiny", *TINY, "--function", "fixtures.models:tiny", "--target", "fixtures.models:tiny")
    assert both.exit_code == 2, both.output
    assert "expected a device target such as tpu:v5e:1x1, got 'fixtures.models:tiny'" in both.stderr
