"""The chat template: a question as messages, messages as the model's prompt tokens, and the
tokens that end an answer. The engine's front ends (``origin/engine/stream.py``, ``offline.py``),
the origin's API, the nightly job and the benchmarks build every prompt with these; the engine
core takes token ids only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Message = dict[str, Any]
# what a front end accepts: a question, chat messages, or the prompt's token ids
Prompt = str | Sequence[Message] | Sequence[int]


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


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: Prompt) -> list[int]:
    """A question (``str``: one user turn), chat messages, or token ids, as the prompt's token ids
    in the model's chat template (token ids as they are)."""
    if isinstance(prompt, str):
        return encode_chat(tokenizer, chat_messages(prompt))
    items = list(prompt)
    if not items:
        raise ValueError("prompt is empty")
    if all(isinstance(t, int) for t in items):
        return [int(t) for t in items]  # type: ignore[call-overload]
    if all(isinstance(m, dict) for m in items):
        return encode_chat(tokenizer, items)  # type: ignore[arg-type]
    raise TypeError("a prompt is a str, chat messages (dicts) or token ids (ints), not a mix")


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
