"""The origin engine: continuous batching over a slot KV cache, INT8 weights, one step loop.

Everything a caller needs is importable from here; see docs/engine.md for the modules.
"""

from __future__ import annotations

from origin.engine.config import EngineConfig, SchedulerConfig, default_quantization
from origin.engine.core import Engine
from origin.engine.offline import Completion
from origin.engine.request import RequestOutput
from origin.engine.stream import OutputStream

__all__ = [
    "Completion",
    "Engine",
    "EngineConfig",
    "OutputStream",
    "RequestOutput",
    "SchedulerConfig",
    "default_quantization",
]
