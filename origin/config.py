"""Configuration of the origin, read once from ``EDGEQA_*`` environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edge_index.config import default_cache_dir, env_choice, env_float, env_int, env_str


@dataclass(frozen=True)
class OriginConfig:
    model: str
    device: str
    dtype: str
    cache_dir: Path
    max_tokens: int
    temperature: float

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OriginConfig:
        env = os.environ if environ is None else environ
        return cls(
            model=env_str(env, "EDGEQA_MODEL", "embedded"),
            device=env_choice(env, "EDGEQA_DEVICE", "auto", ("auto", "cpu", "cuda")),
            dtype=env_choice(
                env, "EDGEQA_DTYPE", "auto", ("auto", "float32", "float16", "bfloat16")
            ),
            cache_dir=default_cache_dir(env),
            max_tokens=env_int(env, "EDGEQA_MAX_TOKENS", 256, minimum=1),
            temperature=env_float(env, "EDGEQA_TEMPERATURE", 0.0, minimum=0.0),
        )
