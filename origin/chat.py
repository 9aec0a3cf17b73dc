"""The chat template: a question as messages, messages as the model's prompt tokens, and the
tokens that end an answer. The engine (``origin/engine/core.py``), the origin's API, the nightly
job and the benchmarks build every prompt with these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Message = dict[str, Any]


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
