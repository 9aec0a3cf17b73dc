"""What every command that loads a model does first."""

from __future__ import annotations

import os


def quiet_libraries() -> None:
    """No hub access, no progress bars, no library chatter on a command's output."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


# libgomp's spin at a barrier before a futex sleep, for the origin server's engine threads
OPENMP_SPIN = "1000000"


def spin_openmp_threads() -> bool:
    """Let the engine's OpenMP threads spin longer before sleeping (``GOMP_SPINCOUNT``, kept if
    set). The kernels run in torch's libgomp pool; a fused step meets at ~360 barriers, and with
    libgomp's default (300,000) beside the HTTP server on 2 cores most waits slept and woke again
    (28,000 context switches per thread in 5 s at 16 req/s): 298 output tok/s, 395 with this
    (``docs/engine.md``). Only for the origin server: where other processes share the cores (an
    edge service beside it, a benchmark's baseline), threads spinning after every parallel region
    took the CPU they needed. libgomp reads it once, when torch loads it: returns whether that
    is still to come (torch not imported yet)."""
    import sys

    os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN)
    return "torch" not in sys.modules
