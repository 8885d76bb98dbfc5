"""One process of a job started by :mod:`tests.distributed.harness`.

``python -m tests.distributed.worker MODULE:FUNCTION PROCESS_ID NUM_PROCESSES PORT DIR``:
joins the job (gloo collectives, ``jax.distributed.initialize`` on loopback, bounded
waits), calls ``FUNCTION(payload)`` with ``DIR/payload.json``, and writes
``{"value": ...}`` or ``{"error": {"type", "message", "aot": bool}}`` to
``DIR/result-PROCESS_ID.json``. The environment (2 CPU devices) is the harness's.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from pathlib import Path

#: Bounds for JAX's own waits: joining the job, declaring a silent process dead,
#: the end-of-job barrier (a test's job is over in well under a minute). A test that
#: expects a process to hang shortens the first and the last.
INIT_SECONDS = int(os.environ.get("AOT_TEST_INIT_SECONDS", "20"))
HEARTBEAT_SECONDS = 10
BARRIER_MS = int(float(os.environ.get("AOT_TEST_BARRIER_SECONDS", "15")) * 1000)


def main() -> int:
    target, process_id, num_processes, port, folder = sys.argv[1:6]
    process_id, num_processes, work = int(process_id), int(num_processes), Path(folder)
    payload = json.loads((work / "payload.json").read_text())
    payload.setdefault("work", str(work))
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    out: dict
    try:
        jax.distributed.initialize(
            f"127.0.0.1:{port}", num_processes=num_processes, process_id=process_id,
            initialization_timeout=INIT_SECONDS, heartbeat_timeout_seconds=HEARTBEAT_SECONDS,
            shutdown_timeout_seconds=5,
        )
        module, _, name = target.partition(":")
        fn = getattr(importlib.import_module(module), name)
        out = {"value": fn(payload)}
    except BaseException as exc:  # the test reads it: every process's error is the point
        from aot.errors import AotError

        out = {"error": {"type": type(exc).__name__, "message": str(exc), "aot": isinstance(exc, AotError)}}
        traceback.print_exc()
    (work / f"result-{process_id}.json.tmp").write_text(json.dumps(out))
    os.replace(work / f"result-{process_id}.json.tmp", work / f"result-{process_id}.json")
    sys.stderr.flush()
    # Process 0 hosts the coordination service: the others must be done with it before
    # it goes. A barrier (bounded) and then a hard exit: JAX's shutdown must not turn a
    # failed job into a hang.
    try:
        from jax._src import distributed

        if distributed.global_state.client is not None:
            distributed.global_state.client.wait_at_barrier("aot-test-done", BARRIER_MS)
    except Exception:  # a process already gone: nothing to wait for
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
