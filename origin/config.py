"""Configuration of the origin, read once from ``EDGEQA_*`` environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge_index.config import (
    ConfigError,
    default_cache_dir,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_str,
)

if TYPE_CHECKING:
    from origin.engine import EngineConfig


# the instruction both the nightly job and the origin put before a question (EDGEQA_SYSTEM_PROMPT),
# so that a published answer and a generated one come from the same prompt
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly, in one to three sentences."


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


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP server's settings (the engine's are in ``OriginConfig``)."""

    store_uri: str
    profile: str  # "" = the store's only profile, once one is published
    poll_s: float
    embedder: str
    served_model_name: str  # "" = derived from EDGEQA_MODEL
    system_prompt: str
    api_keys: tuple[str, ...]
    max_queued_requests: int
    max_queued_tokens: int
    max_in_flight_per_user: int  # 0 = no per-user bound
    request_timeout_s: float
    max_body_bytes: int
    cache_ttl_s: float
    cache_jitter: float
    cache_max_bytes: int
    shutdown_grace_s: float
    tiers: bool
    log_requests: bool
    cdn_url: str  # where browsers read releases (CloudFront); "" = no CDN tier in the web client
    edge_url: str  # the edge index service, for the web client; "" = none
    web_dir: str  # the web client and demo page served at /

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServerConfig:
        env = os.environ if environ is None else environ
        keys = tuple(k.strip() for k in env.get("EDGEQA_API_KEYS", "").split(",") if k.strip())
        if any(len(k) < 16 for k in keys):
            raise ConfigError("EDGEQA_API_KEYS: every key must have at least 16 characters")
        jitter = env_float(env, "EDGEQA_CACHE_JITTER", 0.1, minimum=0.0)
        if jitter >= 1:
            raise ConfigError(f"EDGEQA_CACHE_JITTER must be below 1, got {jitter}")
        return cls(
            store_uri=env_str(env, "EDGEQA_STORE", "file://./var/store"),
            profile=env_str(env, "EDGEQA_PROFILE", ""),
            poll_s=env_float(env, "EDGEQA_POLL_S", 30.0, minimum=0.1),
            embedder=env_str(env, "EDGEQA_EMBEDDER", "embedded"),
            served_model_name=env_str(env, "EDGEQA_SERVED_MODEL_NAME", ""),
            system_prompt=env_str(env, "EDGEQA_SYSTEM_PROMPT", DEFAULT_SYSTEM_PROMPT),
            api_keys=keys,
            max_queued_requests=env_int(env, "EDGEQA_MAX_QUEUED_REQUESTS", 64, minimum=1),
            max_queued_tokens=env_int(env, "EDGEQA_MAX_QUEUED_TOKENS", 16384, minimum=1),
            max_in_flight_per_user=env_int(env, "EDGEQA_MAX_IN_FLIGHT_PER_USER", 0, minimum=0),
            request_timeout_s=env_float(env, "EDGEQA_REQUEST_TIMEOUT_S", 120.0, minimum=0.1),
            max_body_bytes=env_int(env, "EDGEQA_MAX_BODY_BYTES", 1 << 20, minimum=1024),
            cache_ttl_s=env_float(env, "EDGEQA_CACHE_TTL_S", 3600.0, minimum=0.0),
            cache_jitter=jitter,
            cache_max_bytes=env_int(env, "EDGEQA_CACHE_MAX_BYTES", 64 << 20, minimum=0),
            shutdown_grace_s=env_float(env, "EDGEQA_SHUTDOWN_GRACE_S", 30.0, minimum=0.0),
            tiers=env_bool(env, "EDGEQA_ORIGIN_TIERS", True),
            log_requests=env_bool(env, "EDGEQA_LOG_REQUESTS", True),
            cdn_url=env_str(env, "EDGEQA_CDN_URL", "").rstrip("/"),
            edge_url=env_str(env, "EDGEQA_EDGE_URL", "").rstrip("/"),
            web_dir=env_str(
                env, "EDGEQA_WEB_DIR", str(Path(__file__).resolve().parents[1] / "web")
            ),
        )
