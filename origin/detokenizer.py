"""Incremental detokenization: token ids in, text deltas out, in O(1) per token."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class IncrementalDetokenizer:
    """Decode only a short window of recent ids (vLLM's prefix/read offsets).

    Decoding a token alone loses context (leading spaces, multi-token UTF-8 characters), so each
    push decodes ``ids[prefix:]`` and compares with ``ids[prefix:read]``; text ending in U+FFFD is
    an incomplete character and is held back until the next token completes it.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int] | None = None):
        self.tokenizer = tokenizer
        # a few prompt tokens of context so that the first output token decodes as it would inline
        self.ids: list[int] = list(prompt_ids[-4:]) if prompt_ids else []
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        current = self._decode(self.ids[self.prefix_offset :])
        if len(current) <= len(prefix) or current.endswith("\ufffd"):
            return ""
        delta = current[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += delta
        return delta
