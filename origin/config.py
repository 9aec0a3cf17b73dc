"""The origin's settings: the model, the engine's sizes and the HTTP server (``EDGEQA_*``).

A leaf module: it declares values and checks them, and imports nothing of the origin. The
variables shared with the edge service (store, profile, embedder, device, cache folder, salt) are
declared in ``base/config.py``; see there for how the classes build on each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from base.config import SharedSettings, lowercase
from origin.precision import Quantization

# the instruction both the nightly job and the origin put before a question (EDGEQA_SYSTEM_PROMPT),
# so that a published answer and a generated one come from the same prompt
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly, in one to three sentences."
EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
WEB_DIR = Path(__file__).resolve().parents[1] / "web"

Speculative = Literal["none", "ngram", "suffix", "ngram+suffix", "suffix+ngram"]


class ModelSettings(SharedSettings):
    """The LLM, how it is loaded, and what every answer's prompt and length default to."""

    model: str = "embedded"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT

    @field_validator("dtype", mode="before")
    @classmethod
    def _lower_dtype(cls, value: Any) -> Any:
        return lowercase(value)

    @property
    def model_name(self) -> str:
        """The model's name in the API (``EDGEQA_SERVED_MODEL_NAME`` can override it)."""
        if self.model == "embedded":
            return EMBEDDED_MODEL_NAME
        spec = self.model.rstrip("/")
        return spec.rsplit("/", 1)[-1] if "/" in spec else spec


class EngineSettings(ModelSettings):
    """The engine's precision and sizes (``docs/engine.md``)."""

    quantization: Quantization = "auto"
    batch_invariant: bool = True  # the same greedy answer at any load (docs/engine.md)
    # a request starts from a prefix already in the KV cache (docs/engine.md, docs/security.md)
    prefix_caching: bool = True
    max_num_seqs: int = Field(32, ge=1)
    token_budget: int = Field(512, ge=1)
    prefill_chunk: int = Field(256, ge=1)
    max_model_len: int = Field(2048, ge=16)
    kv_cache_tokens: int = Field(0, ge=0)  # 0: every slot full, never preempt
    speculative: Speculative = "none"
    num_speculative_tokens: int = Field(5, ge=1)

    @field_validator("quantization", "speculative", mode="before")
    @classmethod
    def _lower_words(cls, value: Any) -> Any:
        return lowercase(value)


class OriginSettings(EngineSettings):
    """The origin server: its engine, its API, its tiers and its logs."""

    served_model_name: str = ""  # "" = derived from EDGEQA_MODEL
    api_keys: Annotated[tuple[str, ...], NoDecode] = ()
    max_queued_requests: int = Field(64, ge=1)
    max_queued_tokens: int = Field(16384, ge=1)
    # one asker's share (a signed user, else an address with its API key, if any:
    # base/users.py); 0 = none
    max_in_flight_per_user: int = Field(8, ge=0)
    # every request's network (its viewer's /24 or /48, signed users' too: base/users.py);
    # 0 = none
    max_in_flight_per_network: int = Field(32, ge=0)
    max_tokens_per_minute_per_user: int = Field(20_000, ge=0)
    # prompts waiting for the one tokenizer (origin/server/prompts.py), and for how long at most
    max_tokenize_queue: int = Field(64, ge=1)
    max_tokenize_wait_s: float = Field(10.0, gt=0.0)
    request_timeout_s: float = Field(120.0, ge=0.1)
    max_body_bytes: int = Field(1 << 20, ge=1024)
    cache_ttl_s: float = Field(3600.0, ge=0.0)
    cache_jitter: float = Field(0.1, ge=0.0, lt=1.0)
    cache_max_bytes: int = Field(64 << 20, ge=0)
    # distinct askers before a cached answer is served (as k is before one is published)
    cache_min_users: int = Field(5, ge=1)
    # whose KV prefixes a request may start from: its tenant's (API key and x-edgeqa-tenant), or
    # anyone's (docs/security.md: what a prompt's first-token time tells)
    prefix_caching_scope: Literal["tenant", "global"] = "tenant"
    shutdown_grace_s: float = Field(30.0, ge=0.0)
    origin_tiers: bool = True
    log_requests: bool = True
    cdn_url: str = ""  # where browsers read releases (CloudFront); "" = no CDN tier
    edge_url: str = ""  # the edge index service, for the web client; "" = none
    web_dir: Path = WEB_DIR

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [k.strip() for k in value.split(",") if k.strip()]
        if any(len(k) < 16 for k in value):
            raise ValueError("every key must have at least 16 characters")
        return tuple(value)

    @field_validator("prefix_caching_scope", mode="before")
    @classmethod
    def _lower_scope(cls, value: Any) -> Any:
        return lowercase(value)

    @field_validator("cdn_url", "edge_url", mode="after")
    @classmethod
    def _no_trailing_slash(cls, value: str) -> str:
        return value.rstrip("/")

    @property
    def api_model_name(self) -> str:
        return self.served_model_name or self.model_name
