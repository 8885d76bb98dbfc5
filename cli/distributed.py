"""``--distributed`` for ``aot warmup`` and ``aot compile``: the command as one process
of a multi-process job (a slice's hosts, a SLURM or Kubernetes job).

Every process joins ``jax.distributed`` (:func:`aot.distributed_job.join`) before its
backend starts, then lowers and compiles what the command names: a program whose mesh
spans the processes needs every process's devices to be known, and each process checks
that it lowers what process 0 lowers. Process 0 alone compiles, writes the cache and
prints the report; the others open the cache read-only once process 0 has it open (one
shared by the slice's hosts: a folder or a PostgreSQL index), load what it stores, and
print nothing unless the job failed. At the end every process publishes its outcome and
reads everyone's (bounded waits): a failure anywhere is exit status 1 everywhere,
process 0 naming who failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import click

from aot.cli.common import State

DISTRIBUTED_HELP = (
    "Run as one process of a multi-process job (jax.distributed; also AOT_DISTRIBUTED=1): "
    "start the command in every process; JAX's cluster detection (SLURM, Open MPI, "
    "Kubernetes, Cloud TPU) or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and "
    "JAX_PROCESS_ID connect them. Process 0 compiles, writes the cache and reports; the "
    "others lower the same programs and load its entries from the shared cache; a failure "
    "in any process fails all (waits bounded by AOT_DISTRIBUTED_TIMEOUT seconds). For TPU "
    "slices from a CPU-only CI runner, use --target (e.g. tpu:v5e:4x4) instead: deviceless, "
    "one process."
)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, click.exceptions.Exit):
        return f"exit status {exc.exit_code}"
    if isinstance(exc, click.ClickException):
        return exc.format_message()
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


@dataclass
class JobRole:
    """What the command's body learns from :func:`job_command`, and tells it back."""

    #: This process prints the report (always, outside a job; process 0 in one).
    reports: bool = True
    #: Why this process fails, in one line, for the other processes' messages (a
    #: warm-up whose entries failed exits 1 after printing them here only).
    failure: str | None = None


@contextmanager
def job_command(state: State, flag: bool, step: str) -> Iterator[JobRole]:
    """Runs the command's body as one process of a job when ``--distributed`` (or
    ``AOT_DISTRIBUTED``) asks; yields its :class:`JobRole`. Must be entered before
    JAX's backend starts."""
    from aot.distributed_job import join, requested
    from aot.errors import DistributedJobError

    if not requested(flag):
        yield JobRole()
        return
    try:
        job = join()
    except DistributedJobError as exc:
        raise click.ClickException(str(exc)) from None
    ctx = click.get_current_context()
    state.job = job
    own: BaseException | None = None
    role = JobRole(reports=job.primary)
    try:
        yield role
    except click.exceptions.Exit as exc:
        if exc.exit_code == 0:
            own = None
        else:
            own = exc
    except BaseException as exc:  # noqa: BLE001 - published, then raised again below
        own = exc
    ok = own is None
    # The others may wait for a cache process 0 never opened (it failed first).
    if own is not None:
        state.tell_job_cache(False, f"it failed first: {role.failure or _one_line(own)}")
    else:
        state.tell_job_cache(False, "it ended without opening it")
    try:
        job.publish(step, ok, "" if ok else role.failure or _one_line(own))  # type: ignore[arg-type]
        outcomes = job.gather(step)
    except Exception as exc:  # noqa: BLE001 - the coordinator itself is gone
        outcomes = []
        click.echo(f"Error: {job.describe()}: the job's coordinator is unreachable: {_one_line(exc)}", err=True)
        ok = False
    others = [o for o in outcomes if not o.ok and o.process_id != job.process_id]
    if job.primary:
        for outcome in others:
            click.echo(f"Error: {outcome.describe()}", err=True)
    elif others and own is None:
        failed = ", ".join(str(o.process_id) for o in others)
        click.echo(f"Error: {job.describe()}: the job failed in process {failed}", err=True)
    if own is not None:
        raise own
    if others or not ok:
        ctx.exit(1)
