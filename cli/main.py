"""The ``aot`` command: a click group over the library (see docs/cli.md).

Every command parses its options, makes one library call and renders the value the
library returns; a library error (:class:`aot.AotError`) becomes ``Error: <message>``
and exit status 1, a usage error exit status 2. ``--debug`` shows the traceback.

The global options (``--cache``, ``--blobs``, ``--local``, ``--read-only``, ``--json``, ``--debug``)
are accepted before or after the subcommand: :class:`AotGroup` gives every command
registered on it, or on a group it holds, the same options.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

import click

from aot.cli.common import State, configure_logging, global_options
from aot.cli.group import AotGroup, error_message, stdout_closed  # noqa: F401 - error_message re-exported
from aot.jaxcompat.runtime import distributed_client_active


CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group("aot", cls=AotGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="jax-aot", prog_name="aot")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Ahead-of-time compilation of JAX programs into a fingerprint-keyed cache.

    Compile in CI (`aot warmup manifest.toml`), ship the cache or a bundle, and serve
    with `aot.load(name)` without tracing or compiling.

    The options --cache, --blobs, --local, --read-only, --json, --debug and -v go before
    or after the command. Settings come from flags, then the environment (AOT_CACHE,
    AOT_BLOBS, AOT_LOCAL, AOT_SIGNING_KEY[_FILE], AOT_MANIFEST), then [tool.aot] in
    pyproject.toml.
    """
    configure_logging(ctx.ensure_object(State).verbose)  # -v after the command raises it


# The group's own copies of the global options (-v among them), before --version.
cli.params[:0] = global_options()


def _register() -> None:
    from aot.cli import bundle, compile, doctor, listing, maintenance, releases, repair, stats, targets, transfer, warmup

    cli.add_command(compile.compile_command)
    cli.add_command(warmup.warmup_command)
    cli.add_command(listing.ls_command)
    cli.add_command(listing.show_command)
    cli.add_command(maintenance.verify_command)
    cli.add_command(maintenance.gc_command)
    cli.add_command(maintenance.rm_command)
    cli.add_command(repair.repair_command)
    cli.add_command(bundle.bundle_group)
    cli.add_command(transfer.push_command)
    cli.add_command(transfer.pull_command)
    cli.add_command(stats.stats_command)
    cli.add_command(compile.why_command)
    cli.add_command(doctor.doctor_command)
    cli.add_command(releases.release_group)
    cli.add_command(releases.history_command)
    cli.add_command(targets.target_group)


_register()


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point (``aot``) and ``python -m aot``."""
    from aot.libtpu_log import quiet_jax_import

    quiet_jax_import()  # JAX's CUDA plugin's start-up noise on a host without a GPU
    try:
        cli.main(args=argv, prog_name="aot", obj=State(owns_process=True))
    except SystemExit as exc:
        leave(exc.code)
    leave(0)


def leave(code: object) -> NoReturn:
    """Ends the process once the command is done, skipping the interpreter's teardown.

    When a command returns, what it wrote is committed and closed: its context closed
    the cache (the SQL index's connections, which checkpoints SQLite's write-ahead log;
    the statistics; background loads). An exit would then run the atexit handlers
    (JAX's, logging's, the user's: they still run here) and free every object of every
    module, which once JAX is loaded takes longer than many commands do. That
    freeing is skipped. The normal exit runs instead whenever something may still need
    it: another non-daemon thread alive, or JAX's distributed runtime started by the
    user's code (a manifest's module)."""
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)  # CPython's own exit step
    # A reader that left early (`aot ls | head`) leaves the last of the output unwritten:
    # written nowhere, so that no exit path reports it (Python's own exit would).
    stdout_closed()
    if run_exit_handlers is None or _teardown_needed():
        sys.exit(code if code is None or isinstance(code, (int, str)) else str(code))
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): printed, status 1, as Python does
        print(code, file=sys.stderr)
        status = 1
    run_exit_handlers()  # logging's among them: the log is flushed
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`aot ls | head`): nothing to do
            pass
    os._exit(status)


def _teardown_needed() -> bool:
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return True
    return distributed_client_active()


if __name__ == "__main__":  # pragma: no cover
    main()
