"""Speculative decoding: cheap proposals verified by the target model in one forward.

Proposers:
- ``ngram``: prompt lookup. The last n tokens of the request are searched for earlier in its own
  prompt and output; the tokens that followed are proposed.
- ``suffix``: the same lookup in answers generated before (the engine indexes every finished
  answer and can be seeded with a release's answers): near-duplicate questions get near-duplicate
  answers.
- ``draft``: a smaller causal LM with the same tokenizer proposes greedily.

Only greedy requests speculate, and verification accepts the longest prefix of the proposal that
equals the target's argmax, plus the target's own next token: the output is the output without
speculation. Rejected tokens cost nothing to undo: the slot's length moves back.

Speculation backs off by itself: not at all when more than ``max_batch`` requests decode (the step
is then compute-bound and verifying k extra tokens per request costs more than it saves), and per
request when its recent mean of accepted tokens per draft falls below ``min_accepted`` (it pauses,
then probes again).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from origin.engine.request import Request

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from origin.engine.runner import Runner

METHODS = ("ngram", "suffix", "draft")


@dataclass(frozen=True)
class SpecConfig:
    method: str  # "ngram", "suffix", "draft", or several joined by "+" (tried in that order)
    num_speculative_tokens: int = 5
    max_batch: int = 2  # no speculation when more requests than this decode in a step
    # A request pauses when its recent mean of accepted tokens per draft falls below this. A
    # verification step yields 1 + accepted tokens and costs ~1.3x a plain step with bf16 weights
    # (~2x with fp32) on this CPU, so it pays from ~0.3 (bf16) or ~1 (fp32) accepted per draft.
    min_accepted: float = 0.4
    cooldown_steps: int = 8  # steps a paused request decodes without speculating
    ngram_sizes: tuple[int, ...] = (4, 3, 2)
    suffix_max_tokens: int = 500_000  # tokens of past answers kept in the suffix index

    def __post_init__(self) -> None:
        methods = self.method.split("+")
        if not methods or any(m not in METHODS for m in methods):
            raise ValueError(f"speculative method must be one of {METHODS} or a '+' join of them")
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be at least 1")

    @property
    def methods(self) -> list[str]:
        return self.method.split("+")


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
            if request.spec_neighbors is None:  # once per request: similar earlier questions
                request.spec_neighbors = self.index.neighbors(request.prompt_ids)
            proposals.append(
                self.index.lookup(
                    request.token_ids, n, request.spec_neighbors, len(request.output_ids)
                )
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
        quantization: str | None = None,
    ) -> None:
        from origin.engine.runner import make_runner

        if tokenizer.get_vocab() != target_tokenizer.get_vocab():
            raise ValueError(
                "the draft model's tokenizer differs from the target's: speculative decoding "
                "needs the same vocabulary (token ids) in both"
            )
        self.runner: Runner = make_runner(model, num_slots, max_len, quantization)
        self._owner: dict[int, str] = {}  # draft slot -> request id whose tokens it holds

    def propose(self, requests: Sequence[Request], k: Sequence[int]) -> list[list[int]]:
        import torch

        from origin.engine.runner import Segment

        cache = self.runner.cache
        segments = []
        for request in requests:
            slot = request.slot
            assert slot is not None
            if self._owner.get(slot) != request.request_id:
                self._owner[slot] = request.request_id
                cache.lengths[slot] = 0
            # the draft's cache may hold rejected tokens: keep only the verified prefix
            valid = min(cache.lengths[slot], request.num_computed)
            cache.truncate(slot, valid)
            segments.append(Segment(slot, request.token_ids[valid:], valid))
        proposals: list[list[int]] = [[] for _ in requests]
        active = list(range(len(requests)))
        for _ in range(max(k, default=0)):
            logits = self.runner.forward([segments[i] for i in active])
            tokens = torch.stack([lg[-1] for lg in logits]).argmax(dim=-1).tolist()
            still = []
            for i, token in zip(active, tokens, strict=True):
                proposals[i].append(token)
                if len(proposals[i]) < k[i]:
                    still.append(i)
                    seg = segments[i]
                    segments[i] = Segment(seg.slot, [token], seg.start + seg.num_tokens)
            active = still
            if not active:
                break
        return proposals


@dataclass
class SpecStats:
    """vLLM's spec_decode_* meanings: a draft is one proposal of >= 1 token for one request."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    by_proposer: dict[str, dict[str, int]] = field(default_factory=dict)

    def record(self, proposer: str, proposed: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        while len(self.accepted_per_position) < proposed:
            self.accepted_per_position.append(0)
        for position in range(accepted):
            self.accepted_per_position[position] += 1
        mine = self.by_proposer.setdefault(
            proposer, {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        )
        mine["drafts"] += 1
        mine["draft_tokens"] += proposed
        mine["accepted"] += accepted

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def acceptance_by_proposer(self) -> dict[str, float]:
        return {
            name: (s["accepted"] / s["draft_tokens"] if s["draft_tokens"] else 0.0)
            for name, s in self.by_proposer.items()
        }


class Speculator:
    """Chooses which requests speculate this step, with which proposer, and how far."""

    def __init__(self, config: SpecConfig, proposers: Sequence[Proposer]) -> None:
        self.config = config
        self.proposers = list(proposers)
        self.stats = SpecStats()

    def propose(
        self, requests: Sequence[Request], room: Sequence[int], num_decoding: int
    ) -> list[tuple[str, list[int]]]:
        """(proposer name, tokens) per request; empty tokens where it does not speculate.

        ``room``: the most tokens each request may take beyond its next one (budget, length).
        """
        empty: list[tuple[str, list[int]]] = [("", []) for _ in requests]
        if num_decoding > self.config.max_batch:
            return empty
        want = []
        for i, (request, space) in enumerate(zip(requests, room, strict=True)):
            if not request.params.greedy or space < 1:
                continue
            if request.spec_cooldown > 0:
                request.spec_cooldown -= 1
                continue
            left = request.params.max_tokens - len(request.output_ids) - 1
            k = min(self.config.num_speculative_tokens, space, left)
            if k >= 1:
                want.append((i, k))
        result = empty
        for proposer in self.proposers:
            if not want:
                break
            proposals = proposer.propose([requests[i] for i, _ in want], [k for _, k in want])
            missing = []
            for (i, k), tokens in zip(want, proposals, strict=True):
                if tokens:
                    result[i] = (proposer.name, tokens[:k])
                else:
                    missing.append((i, k))
            want = missing
        return result

    def observe(self, request: Request, proposer: str, proposed: int, accepted: int) -> None:
        """Record a verification and update the request's accepted-per-draft EMA (the back-off)."""
        self.stats.record(proposer, proposed, accepted)
        request.spec_ema = 0.7 * request.spec_ema + 0.3 * accepted
        if request.spec_ema < self.config.min_accepted:
            request.spec_cooldown = self.config.cooldown_steps
            request.spec_ema = 2 * self.config.min_accepted  # probe again after the pause
