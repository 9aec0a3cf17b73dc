"""The origin engine: continuous batching over a slot KV cache, INT8 weights, one step loop.

The core (``Engine``) takes token ids; its front ends own the prompt's tokens: ``open_stream``
(async, the server's) and ``generate_many`` (offline, the nightly job's). Everything a caller
needs is importable from here; see docs/engine.md for the modules.
"""

from __future__ import annotations

from origin.engine.config import EngineConfig, SchedulerConfig, default_quantization
from origin.engine.core import Engine
from origin.engine.offline import Completion, generate_many, seed_answers
from origin.engine.request import RequestOutput
from origin.engine.stream import OutputStream, open_stream

__all__ = [
    "Completion",
    "Engine",
    "EngineConfig",
    "OutputStream",
    "RequestOutput",
    "SchedulerConfig",
    "default_quantization",
    "generate_many",
    "open_stream",
    "seed_answers",
]
