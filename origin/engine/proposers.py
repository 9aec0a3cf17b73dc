"""Proposers for speculative decoding: where the proposed tokens come from.

- ``ngram``: prompt lookup. The last n tokens of the request are searched for earlier in its own
  prompt and output; the tokens that followed are proposed.
- ``suffix``: the same lookup in answers generated before (the engine indexes every finished
  answer and can be seeded with a release's answers): near-duplicate questions get near-duplicate
  answers.
- ``draft``: a smaller causal LM with the same tokenizer proposes greedily.

Which requests speculate, and how a proposal is verified, is ``speculative.py``'s part.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from origin.engine.request import Request
    from origin.engine.runner import Runner, Segment


class Proposer(Protocol):
    name: str

    def propose(self, requests: Sequence[Request], k: Sequence[int]) -> list[list[int]]: ...


def find_continuation(
    context: Sequence[int], haystack: Sequence[int], sizes: Sequence[int], k: int
) -> list[int]:
    """Tokens that followed the latest earlier occurrence of ``context``'s last n tokens."""
    for n in sizes:
        if len(context) <= n:
            continue
        tail = list(context[-n:])
        # search backwards, skipping the tail itself
        for start in range(len(haystack) - n - 1, -1, -1):
            if haystack[start] == tail[0] and list(haystack[start : start + n]) == tail:
                follow = list(haystack[start + n : start + n + k])
                if follow:
                    return follow
    return []


class NgramProposer:
    """Prompt lookup decoding: propose from the request's own prompt and output."""

    name = "ngram"

    def __init__(self, sizes: Sequence[int] = (4, 3, 2)) -> None:
        self.sizes = tuple(sizes)

    def propose(self, requests: Sequence[Request], k: Sequence[int]) -> list[list[int]]:
        return [
            find_continuation(r.token_ids, r.token_ids, self.sizes, n)
            for r, n in zip(requests, k, strict=True)
        ]


class SuffixIndex:
    """An n-gram index over past answers: n tokens -> where they last occurred.

    Each n-gram maps to its latest occurrence (answer id, position after it). Old answers are
    dropped first once ``max_tokens`` is exceeded; the index is then rebuilt from what is kept.
    Answers stored with their question can also be looked up by question similarity: a request
    first follows the answers of the most similar earlier questions (near-duplicate questions get
    near-duplicate answers), then falls back to the n-gram index over all answers.
    """

    def __init__(self, sizes: Sequence[int] = (4, 3, 2), max_tokens: int = 500_000) -> None:
        self.sizes = tuple(sorted(sizes, reverse=True))
        self.max_tokens = max_tokens
        self._answers: OrderedDict[int, list[int]] = OrderedDict()
        self._questions: dict[int, frozenset[int]] = {}
        # tokens every prompt shares (the chat template): they say nothing about similarity
        self.template_tokens: frozenset[int] = frozenset()
        self._index: dict[tuple[int, ...], tuple[int, int]] = {}
        self._next_id = 0
        self.num_tokens = 0

    def __len__(self) -> int:
        return len(self._answers)

    def add(self, tokens: Sequence[int], question: Sequence[int] | None = None) -> None:
        """Index an answer; ``question``: the prompt token ids it answered, if known."""
        tokens = list(tokens)
        if len(tokens) < 2:
            return
        answer_id = self._next_id
        self._next_id += 1
        self._answers[answer_id] = tokens
        if question:
            self._questions[answer_id] = frozenset(question) - self.template_tokens
        self.num_tokens += len(tokens)
        self._index_answer(answer_id, tokens)
        if self.num_tokens > self.max_tokens:
            while self.num_tokens > self.max_tokens // 2 and self._answers:
                dropped_id, dropped = self._answers.popitem(last=False)
                self._questions.pop(dropped_id, None)
                self.num_tokens -= len(dropped)
            self._index.clear()
            for kept_id, kept in self._answers.items():
                self._index_answer(kept_id, kept)

    def _index_answer(self, answer_id: int, tokens: list[int]) -> None:
        for n in self.sizes:
            for end in range(n, len(tokens)):
                self._index[tuple(tokens[end - n : end])] = (answer_id, end)

    def neighbors(
        self, question: Sequence[int], top: int = 2, min_similarity: float = 0.5
    ) -> list[int]:
        """Answer ids of the most similar stored questions (Jaccard over token sets)."""
        asked = frozenset(question) - self.template_tokens
        scored = []
        for answer_id, known in self._questions.items():
            similarity = len(asked & known) / max(len(asked | known), 1)
            if similarity >= min_similarity:
                scored.append((similarity, answer_id))
        scored.sort(reverse=True)
        return [answer_id for _, answer_id in scored[:top]]

    def lookup(
        self,
        context: Sequence[int],
        k: int,
        neighbors: Sequence[int] = (),
        output_len: int | None = None,
    ) -> list[int]:
        """Up to ``k`` tokens likely to follow ``context``; the neighbours' answers first."""
        for answer_id in neighbors:
            answer = self._answers.get(answer_id)
            if answer is None:
                continue
            if output_len == 0:
                return answer[:k]  # nothing generated yet: propose the answer's opening
            follow = find_continuation(context, answer, (*self.sizes, 1), k)
            if follow:
                return follow
        for n in self.sizes:
            if len(context) < n:
                continue
            hit = self._index.get(tuple(context[-n:]))
            if hit is None:
                continue
            answer = self._answers.get(hit[0])
            if answer is not None and hit[1] < len(answer):
                return answer[hit[1] : hit[1] + k]
        return []


class SuffixProposer:
    """Propose from answers generated before (and answers seeded from a release)."""

    name = "suffix"

    def __init__(self, index: SuffixIndex) -> None:
        self.index = index

    def propose(self, requests: Sequence[Request], k: Sequence[int]) -> list[list[int]]:
        proposals = []
        for request, n in zip(requests, k, strict=True):
            spec = request.spec
            if spec.neighbors is None:  # once per request: similar earlier questions
                spec.neighbors = self.index.neighbors(request.prompt_ids)
            proposals.append(
                self.index.lookup(request.token_ids, n, spec.neighbors, len(request.output_ids))
            )
        return proposals


class DraftProposer:
    """A small causal LM with the target's tokenizer, one slot per target slot."""

    name = "draft"

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        target_tokenizer: PreTrainedTokenizerBase,
        num_slots: int,
        max_len: int,
        quantization: str = "none",
        batch_invariant: bool = True,
    ) -> None:
        from origin.engine.runner import make_runner

        if tokenizer.get_vocab() != target_tokenizer.get_vocab():
            raise ValueError(
                "the draft model's tokenizer differs from the target's: speculative decoding "
                "needs the same vocabulary (token ids) in both"
            )
        # calibrated like the target's (INT8, W8A8): the same model drafts with the same weights
        self.runner: Runner = make_runner(
            model, num_slots, max_len, quantization, tokenizer, batch_invariant
        )
        self._owner: dict[int, str] = {}  # draft slot -> request id whose tokens it holds

    def propose(self, requests: Sequence[Request], k: Sequence[int]) -> list[list[int]]:
        import torch

        from origin.engine.runner import Segment

        cache = self.runner.cache
        steps: list[list[Segment]] = []  # per request: what the next forward computes for it
        for request in requests:
            slot = request.slot
            assert slot is not None
            if self._owner.get(slot) != request.request_id:
                self._owner[slot] = request.request_id
                cache.lengths[slot] = 0
            # the draft's cache may hold rejected tokens: keep only the verified prefix
            valid = min(cache.lengths[slot], request.num_computed)
            cache.truncate(slot, valid)
            steps.append(_catch_up(slot, request.token_ids, len(request.prompt_ids), valid))
        proposals: list[list[int]] = [[] for _ in requests]
        active = list(range(len(requests)))
        for _ in range(max(k, default=0)):
            logits = self.runner.forward([seg for i in active for seg in steps[i]])
            last = list(itertools.accumulate(len(steps[i]) for i in active))
            tokens = torch.stack([logits[n - 1][-1] for n in last]).argmax(dim=-1).tolist()
            still = []
            for i, token in zip(active, tokens, strict=True):
                proposals[i].append(token)
                if len(proposals[i]) < k[i]:
                    still.append(i)
                    seg = steps[i][-1]
                    steps[i] = [Segment(seg.slot, [token], seg.start + seg.num_tokens)]
            active = still
            if not active:
                break
        return proposals


def _catch_up(slot: int, token_ids: list[int], prompt_len: int, valid: int) -> list[Segment]:
    """The draft's segments from ``valid`` to the end of ``token_ids``, computed as the target
    computed them: the prompt as a prefill, every later token query by query (``all_logits``),
    so that a self-draft at the target's weights reproduces the target's numbers exactly."""
    from origin.engine.runner import Segment

    segments = []
    if valid < prompt_len:
        segments.append(Segment(slot, token_ids[valid:prompt_len], valid))
    start = max(valid, prompt_len)
    if start < len(token_ids):
        segments.append(Segment(slot, token_ids[start:], start, all_logits=True))
    return segments
