"""The engine's settings: the scheduler's limits, then weights and speculative decoding.

A leaf module: it imports nothing else of the engine, so anything may read a config. Building a
config from ``EDGEQA_*`` variables is the deployable's job (``origin/config.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from base.errors import EdgeQAError
from origin.precision import EngineQuantization, Needs, choose_auto, lookup

if TYPE_CHECKING:
    import torch


class EngineConfigError(EdgeQAError, ValueError):
    """An engine setting out of range, or settings that contradict each other."""


class RequestTooLongError(EdgeQAError, ValueError):
    """A prompt and its ``max_tokens`` that cannot fit in one slot (``max_model_len``)."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 32  # requests running at once (one KV slot each)
    token_budget: int = 512  # tokens computed per step, prefill and decode together
    prefill_chunk: int = 256  # most prompt tokens one request prefills in one step
    max_model_len: int = 2048  # prompt + output tokens of one request (a slot's length)
    kv_cache_tokens: int | None = None  # KV positions held at once; None: every slot full

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "token_budget", "prefill_chunk", "max_model_len"):
            if getattr(self, name) < 1:
                raise EngineConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.token_budget < self.max_num_seqs:
            raise EngineConfigError("token_budget must be at least max_num_seqs (one token each)")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.max_model_len:
            raise EngineConfigError("kv_cache_tokens must hold at least one max_model_len request")

    def room(self, prompt_tokens: int) -> int:
        """Tokens an answer may have after a prompt of ``prompt_tokens`` (one slot's length)."""
        return self.max_model_len - prompt_tokens

    @property
    def kv_capacity(self) -> int:
        if self.kv_cache_tokens is None:
            return self.max_num_seqs * self.max_model_len
        return self.kv_cache_tokens


@dataclass(frozen=True)
class EngineConfig(SchedulerConfig):
    quantization: EngineQuantization = "none"  # "none": the weights as loaded (origin/precision.py)
    # a request's tokens never depend on the rest of the step (docs/engine.md, "Batch invariance")
    batch_invariant: bool = True
    speculative: str | None = None  # None, "ngram", "suffix", "draft", or "+"-joined
    num_speculative_tokens: int = 5
    spec_max_batch: int = 2  # speculate only while at most this many requests decode
    # start a request from a prefix of its tokens already in the KV cache (a shared system
    # prompt, a repeated question): where the runner supports it (scheduler.py, docs/engine.md)
    prefix_caching: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            lookup(self.quantization)
        except ValueError as error:
            raise EngineConfigError(str(error)) from None


def default_quantization(device: torch.device | str) -> EngineQuantization:
    """The weights the origin serves with when not told, for no model in particular: ``auto``'s
    choice among what the device alone can meet (``origin/precision.py``): bf16 on CPUs with
    native bf16 dot products (2x the fp32 throughput at 0.99 greedy agreement), else the model
    as loaded."""
    return choose_auto(str(device), lambda need: device_meets(need, device)).name


def device_meets(need: Needs, device: torch.device | str) -> bool:
    """Whether ``device`` meets ``need`` by itself (a need of the model's it does not)."""
    import torch

    if need is Needs.NATIVE_BF16:
        return torch.device(device).type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return False
