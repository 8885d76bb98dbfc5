"""A serving process for the Prometheus scrape test: builds a small cache, serves
``tiny`` with its metrics on $AOT_METRICS_PORT (started by aot.load, no code), calls it
CALLS times, says READY and stays up until its stdin closes; each line ``miss`` on its
stdin makes one call of a signature never compiled (answered ``MISSED``).

Usage: python metrics_serving_script.py CACHE_DIR CALLS
"""

from __future__ import annotations

import sys

import numpy as np

import aot
from fixtures import models

cache_dir, calls = sys.argv[1], int(sys.argv[2])
builder = aot.Cache(cache_dir)
builder.compile(models.tiny, *models.tiny_specs(), name="tiny")
builder.close()
fn = aot.load("tiny", cache=aot.Cache(cache_dir))
inputs = models.tiny_inputs()
for _ in range(calls):
    np.asarray(fn(*inputs))
print("READY", flush=True)
for line in sys.stdin:
    if line.strip() == "miss":
        try:
            fn(np.zeros(4, np.float32), np.zeros(4, np.float32))
        except aot.SignatureNotFoundError:
            print("MISSED", flush=True)
