"""The origin engine: continuous batching over a slot KV cache, INT8 weights, one step loop."""

from __future__ import annotations

from origin.engine.engine import Completion, Engine, EngineConfig
from origin.engine.request import RequestOutput
from origin.engine.scheduler import SchedulerConfig

__all__ = ["Completion", "Engine", "EngineConfig", "RequestOutput", "SchedulerConfig"]
