"""The reference generator: the simplest correct path from a question to a streamed answer (one
request, one ``DynamicCache``, ``transformers``' own forward), which the engine and the model
loading are tested against. Test-only: the engine (``origin/engine/``) serves every request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from origin.chat import Message, chat_messages, encode_chat, eos_token_ids
from origin.detokenizer import IncrementalDetokenizer
from origin.sampling import SamplingParams, sample_next

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    finish_reason: str = ""
    token_times_ms: list[float] = field(default_factory=list)

    @property
    def decode_tokens_per_s(self) -> float:
        decode_ms = self.total_ms - self.ttft_ms
        if self.completion_tokens < 2 or decode_ms <= 0:
            return 0.0
        return (self.completion_tokens - 1) * 1000.0 / decode_ms


def stream_chat(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    params: SamplingParams | None = None,
    stats: GenerationStats | None = None,
) -> Iterator[str]:
    """Yield the assistant's answer to ``messages`` as text deltas.

    ``stats``, when given, is filled in as generation goes (TTFT, token times, finish reason).
    """
    import torch
    from transformers import DynamicCache

    params = params or SamplingParams()
    stats = stats if stats is not None else GenerationStats()
    prompt = encode_chat(tokenizer, messages)
    stats.prompt_tokens = len(prompt)
    stop_ids = eos_token_ids(model, tokenizer)
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device="cpu").manual_seed(params.seed)
    detok = IncrementalDetokenizer(tokenizer)
    cache = DynamicCache(config=model.config)
    started = time.perf_counter()
    input_ids = torch.tensor([prompt], device=model.device)
    stats.finish_reason = "length"
    with torch.inference_mode():
        for _ in range(params.max_tokens):
            logits = model(input_ids=input_ids, cache=cache, use_cache=True).logits[0, -1]
            token = sample_next(logits.cpu(), params, generator)
            now_ms = (time.perf_counter() - started) * 1000.0
            if not stats.token_times_ms:
                stats.ttft_ms = now_ms
            stats.token_times_ms.append(now_ms)
            stats.completion_tokens += 1
            if token in stop_ids:
                stats.finish_reason = "stop"
                break
            delta = detok.push(token)
            if delta:
                yield delta
            input_ids = torch.tensor([[token]], device=model.device)
    stats.total_ms = (time.perf_counter() - started) * 1000.0


def answer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    question: str,
    params: SamplingParams | None = None,
) -> str:
    return "".join(stream_chat(model, tokenizer, chat_messages(question), params))
