"""The origin: the generating engine (``origin.engine``), its HTTP server (``origin.server``) and
what they share (settings, model loading, precisions, sampling)."""

from __future__ import annotations

import os

# The engine's kernels run in torch's OpenMP pool (libgomp: the kernels' library resolves to the
# copy torch loaded), whose threads meet at ~360 barriers a step. libgomp's default spin before a
# futex sleep (300,000) was too short beside an HTTP server on 2 cores: most barrier waits slept
# and woke again (5,700 context switches a second per thread) and served 298 output tok/s at 16
# req/s where 1,000,000 served 395 (benchmarks/peers.py; docs/engine.md). libgomp reads it once,
# when it loads: this must run before torch is imported, and a value already set is kept.
os.environ.setdefault("GOMP_SPINCOUNT", "1000000")
