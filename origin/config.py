"""Configuration of the origin, read once from ``EDGEQA_*`` environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge_index.config import default_cache_dir, env_choice, env_float, env_int, env_str

if TYPE_CHECKING:
    from origin.engine import EngineConfig


@dataclass(frozen=True)
class OriginConfig:
    model: str
    device: str
    dtype: str
    cache_dir: Path
    max_tokens: int
    temperature: float
    quantization: str
    max_num_seqs: int
    token_budget: int
    prefill_chunk: int
    max_model_len: int
    kv_cache_tokens: int
    speculative: str
    num_speculative_tokens: int

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
            quantization=env_choice(
                env, "EDGEQA_QUANTIZATION", "auto", ("auto", "none", "bf16", "int8")
            ),
            max_num_seqs=env_int(env, "EDGEQA_MAX_NUM_SEQS", 32, minimum=1),
            token_budget=env_int(env, "EDGEQA_TOKEN_BUDGET", 512, minimum=1),
            prefill_chunk=env_int(env, "EDGEQA_PREFILL_CHUNK", 256, minimum=1),
            max_model_len=env_int(env, "EDGEQA_MAX_MODEL_LEN", 2048, minimum=16),
            kv_cache_tokens=env_int(env, "EDGEQA_KV_CACHE_TOKENS", 0, minimum=0),
            speculative=env_choice(
                env,
                "EDGEQA_SPECULATIVE",
                "none",
                ("none", "ngram", "suffix", "ngram+suffix", "suffix+ngram"),
            ),
            num_speculative_tokens=env_int(env, "EDGEQA_NUM_SPECULATIVE_TOKENS", 5, minimum=1),
        )

    def engine_config(self, device: str) -> EngineConfig:
        """The engine settings; ``auto`` quantization picks what suits ``device``."""
        from origin.engine import EngineConfig
        from origin.engine.engine import default_quantization

        quantization: str | None = self.quantization
        if quantization == "auto":
            quantization = default_quantization(device)
        elif quantization == "none":
            quantization = None
        return EngineConfig(
            max_num_seqs=self.max_num_seqs,
            token_budget=max(self.token_budget, self.max_num_seqs),
            prefill_chunk=self.prefill_chunk,
            max_model_len=self.max_model_len,
            kv_cache_tokens=self.kv_cache_tokens or None,
            quantization=quantization,
            speculative=None if self.speculative == "none" else self.speculative,
            num_speculative_tokens=self.num_speculative_tokens,
        )
