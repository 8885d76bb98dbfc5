"""Loading and calling a stored CPU executable writes nothing to stderr, on every
supported release (aot.libtpu_log.quiet_cpu_load): jaxlib 0.9.x's CPU loader writes a
warning and, on a CPU whose compile carries LLVM tuning features (AMD Zen with AVX-512),
an "E ... SIGILL" line per such feature on every load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import aot
from aot.libtpu_log import XLA_CPU_LOAD_NOISE, filter_libtpu_stderr

pytestmark = pytest.mark.version_suite  # the lines differ by jaxlib release

REPO = Path(__file__).resolve().parents[2]

SERVE = """
import sys
import numpy as np
import aot
from fixtures import models

fn = aot.load("tiny", cache=sys.argv[1], strict=True)
print(float(np.asarray(fn(*models.tiny_inputs())).sum()))
"""

FEATURES = "[+64bit,+avx512f,+prefer-no-gather] vs host machine features: [64bit,avx512f]"
#: As jaxlib 0.9.2 writes them (quoted from an AMD EPYC host, features shortened).
LINES_092 = (
    "W1207 02:54:01.957622   21101 pjrt_executable.cc:642] Assume version compatibility. PjRt-IFRT does not "
    "track XLA executable versions.\n"
    "E1207 02:54:01.962017   21100 cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target machine feature "
    "+prefer-no-gather is not  supported on the host machine. Machine type used for XLA:CPU compilation doesn't "
    f"match the machine type for execution. Compile machine features: {FEATURES}. This could lead to execution "
    "errors such as SIGILL.\n"
)


def test_a_fresh_process_loading_and_calling_a_stored_entry_writes_nothing_to_stderr(tmp_path: Path) -> None:
    from fixtures import models

    with aot.Cache(tmp_path / "c") as cache:
        cache.compile(models.tiny, *models.tiny_specs(), name="tiny")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOT_")}
    for _ in range(2):  # the second process reads bytecode, the first may have compiled it
        done = subprocess.run([sys.executable, "-c", SERVE, str(tmp_path / "c")], cwd=REPO, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout.strip() == str(float(models.tiny(*models.tiny_inputs()).sum()))
    verified = subprocess.run([sys.executable, "-m", "aot", "--cache", str(tmp_path / "c"), "verify"], cwd=REPO,
                              env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert (verified.returncode, verified.stderr) == (0, "")


def test_only_the_known_lines_are_caught_and_a_missing_hardware_feature_is_still_written() -> None:
    kept, dropped = filter_libtpu_stderr(LINES_092, XLA_CPU_LOAD_NOISE)
    assert (kept, len(dropped)) == ("", 2)
    as_warning = LINES_092.splitlines(keepends=True)[1].replace("E1207", "W1207")
    assert filter_libtpu_stderr(as_warning, XLA_CPU_LOAD_NOISE)[0] == ""
    real = LINES_092.splitlines(keepends=True)[1].replace("+prefer-no-gather is", "+avx512f is")
    other = "E1207 02:54:01.962017   21100 cpu_client.cc:1] something else\n"
    assert filter_libtpu_stderr(real + other, XLA_CPU_LOAD_NOISE) == (real + other, [])
