"""How many compiles a warm-up runs at once: ``--jobs N`` and ``--jobs auto``.

``--jobs auto`` is::

    min(usable cores // CORES_PER_JOB, available memory // JOB_MEMORY, entries), at least 1

- *usable cores*: the CPUs this process may run on (its affinity mask, e.g. a
  container's or ``taskset``'s cpuset), else ``os.cpu_count()``;
- *available memory*: the smaller of the system's ``MemAvailable`` and what the
  process's cgroup still allows (``memory.max - memory.current``, cgroup v2; or v1's
  ``limit_in_bytes - usage_in_bytes``); unknown counts as plenty;
- ``JOB_MEMORY`` (2 GiB): what one job (a compile, and the worker process around it)
  is budgeted. The 12-layer transformer of the fixtures peaks at about 0.4 GiB with
  JAX loaded; large models take several.

- *entries*: the number of entries to warm, when known: a job more than there are
  entries only starts a process that compiles nothing.

``CORES_PER_JOB`` (3): XLA compiles one program on several threads, so one job keeps
more than one core busy; a job per core oversubscribes them. Measured with
``JAX_PLATFORMS=cpu`` on a 13-core host, ``aot warmup benchmarks/heavy.toml`` (8
transformer compiles, 8 small ones): ``--jobs 1`` 9.9 s wall and 41 CPU seconds (about
4 cores busy), ``--jobs 4`` 7.9 s / 49, ``--jobs 8`` 9.0 s / 55, ``--jobs 13`` (the old
one-per-core rule) 9.6 s / 71. ``13 // 3 = 4`` is the fastest of those; on 2 cores the
rule gives 1 job, where ``--jobs 2`` won nothing on a manifest of small compiles.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["AUTO", "CORES_PER_JOB", "JOB_MEMORY", "auto_jobs", "available_cores", "available_memory", "resolve_jobs"]

AUTO = "auto"
JOB_MEMORY = 2 * 2**30
CORES_PER_JOB = 3


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where there is one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def cgroup_room(
    root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup"),
) -> int | None:
    """Bytes this process's cgroup may still allocate (None: no limit found)."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        relative = path.lstrip("/")
        if controllers == "":  # cgroup v2
            folder = root / relative
            limit, used = _read_int(folder / "memory.max"), _read_int(folder / "memory.current")
        elif "memory" in controllers.split(","):  # cgroup v1
            folder = root / "memory" / relative
            limit = _read_int(folder / "memory.limit_in_bytes")
            used = _read_int(folder / "memory.usage_in_bytes")
            if limit is not None and limit >= 2**60:  # v1's "unlimited"
                limit = None
        else:
            continue
        if limit is not None:
            rooms.append(max(0, limit - (used or 0)))
    return min(rooms) if rooms else None


def _mem_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory() -> int | None:
    """Bytes this process may still allocate (the system's and its cgroup's room,
    whichever is smaller); None when neither is known."""
    known = [m for m in (_mem_available(), cgroup_room()) if m is not None]
    return min(known) if known else None


def auto_jobs(cores: int | None = None, memory: int | None = None, entries: int | None = None) -> int:
    """``--jobs auto``: ``min(cores // CORES_PER_JOB, memory // JOB_MEMORY, entries)``, at
    least 1.

    ``cores`` and ``memory`` (bytes) default to :func:`available_cores` and
    :func:`available_memory` (unknown memory does not limit); ``entries`` (the number of
    entries to warm) limits only when given."""
    cores = available_cores() if cores is None else cores
    memory = available_memory() if memory is None else memory
    jobs = max(1, cores // CORES_PER_JOB)
    if memory is not None:
        jobs = min(jobs, memory // JOB_MEMORY)
    if entries is not None:
        jobs = min(jobs, entries)
    return max(1, int(jobs))


def resolve_jobs(jobs: int | str, entries: int | None = None) -> int:
    """``"auto"`` -> :func:`auto_jobs` (capped by ``entries`` when given); a count >= 1 as
    it is; anything else: ValueError."""
    if isinstance(jobs, str):
        text = jobs.strip().lower()
        if text == AUTO:
            return auto_jobs(entries=entries)
        if not text.isdigit():
            raise ValueError(f"jobs must be a number >= 1 or 'auto', got {jobs!r}")
        jobs = int(text)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be >= 1 or 'auto', got {jobs!r}")
    return jobs
