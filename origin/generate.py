"""Engine-free generation: one request, one KV cache, tokens streamed as text deltas.

The prompt helpers every path uses (``chat_messages``, ``encode_chat``, ``eos_token_ids``), and the
simplest correct path from a question to a streamed answer (``stream_chat``, ``answer``): the
reference the engine is tested against (``tests/``, ``benchmarks/model_load.py``). The engine
(continuous batching, ``origin/engine/``) serves every request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from origin.detokenizer import IncrementalDetokenizer
from origin.sampling import SamplingParams, sample_next

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Message = dict[str, Any]


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


def chat_messages(question: str, system: str | None = None) -> list[Message]:
    messages: list[Message] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": question})
    return messages


def encode_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> list[int]:
    """Token ids of ``messages`` in the model's chat template, ready for the assistant's turn."""
    encoded: Any = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=True, return_dict=True
    )
    return [int(i) for i in encoded["input_ids"]]


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids: set[int] = set()
    configured = model.generation_config.eos_token_id
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


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
