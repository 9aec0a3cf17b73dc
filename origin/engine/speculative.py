"""Speculative decoding: cheap proposals verified by the target model in one forward.

The proposers (``ngram``, ``suffix``, ``draft``) are in ``proposers.py``; this module decides
which requests speculate and how far, verifies proposals, and keeps the counters.

Only greedy requests speculate, and verification accepts the longest prefix of the proposal that
equals the target's argmax, plus the target's own next token: the output is the output without
speculation. Rejected tokens cost nothing to undo: the slot's length moves back.

Speculation backs off by itself: not at all when more than ``max_batch`` requests decode (the step
is then compute-bound and verifying k extra tokens per request costs more than it saves), and per
request when its recent mean of accepted tokens per draft falls below ``min_accepted`` (it pauses,
then probes again). A request's back-off state is ``request.spec``.

The engine core calls three things: ``make_speculator`` once, ``Speculator.verify`` on the logits
of each proposal, and ``Speculator.remember`` with each step's finished requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from origin.chat import prompt_ids
from origin.engine.config import EngineConfigError
from origin.engine.proposers import (
    DraftProposer,
    NgramProposer,
    Proposer,
    SuffixIndex,
    SuffixProposer,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from origin.engine.config import EngineConfig
    from origin.engine.request import Request
    from origin.engine.scheduler import ScheduledRequest

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
            raise EngineConfigError(
                f"speculative method must be one of {METHODS} or a '+' join of them"
            )
        if self.num_speculative_tokens < 1:
            raise EngineConfigError("num_speculative_tokens must be at least 1")

    @property
    def methods(self) -> list[str]:
        return self.method.split("+")


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

    def metrics(self) -> dict[str, Any]:
        """vLLM's spec_decode_* counters, plus acceptance per proposer."""
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.accepted_per_position),
            "acceptance_rate": self.acceptance_rate,
            "acceptance_rate_by_proposer": self.acceptance_by_proposer(),
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
            if request.spec.cooldown > 0:
                request.spec.cooldown -= 1
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

    def verify(self, item: ScheduledRequest, logits: torch.Tensor) -> list[int]:
        """Greedy verification: the accepted proposal prefix, then the target's next token."""
        # logits: [1 + k, vocab]; row i predicts the token after proposal[:i]
        targets = logits.argmax(dim=-1).tolist()
        accepted = 0
        for proposed, target in zip(item.proposal, targets, strict=False):
            if proposed != target:
                break
            accepted += 1
        self.observe(item.request, item.proposer, len(item.proposal), accepted)
        return [*item.proposal[:accepted], targets[accepted]]

    def observe(self, request: Request, proposer: str, proposed: int, accepted: int) -> None:
        """Record a verification and update the request's accepted-per-draft EMA (the back-off)."""
        self.stats.record(proposer, proposed, accepted)
        spec = request.spec
        spec.ema = 0.7 * spec.ema + 0.3 * accepted
        if spec.ema < self.config.min_accepted:
            spec.cooldown = self.config.cooldown_steps
            spec.ema = 2 * self.config.min_accepted  # probe again after the pause

    @property
    def suffix_index(self) -> SuffixIndex | None:
        """The index of past answers, when a suffix proposer is in use."""
        for proposer in self.proposers:
            if isinstance(proposer, SuffixProposer):
                return proposer.index
        return None

    def remember(self, finished: Sequence[Request]) -> None:
        """Index the answers of finished requests for the suffix proposer (not cut-off ones)."""
        index = self.suffix_index
        if index is None:
            return
        for request in finished:
            if request.finish_reason in ("stop", "length"):
                index.add(request.output_ids, request.prompt_ids)


def make_speculator(
    config: EngineConfig,
    tokenizer: PreTrainedTokenizerBase,
    draft: tuple[PreTrainedModel, PreTrainedTokenizerBase] | None = None,
) -> Speculator:
    """The speculator for ``config.speculative`` (the suffix index ignores the chat template's
    tokens when comparing questions)."""
    spec = SpecConfig(
        method=config.speculative or "",
        num_speculative_tokens=config.num_speculative_tokens,
        max_batch=config.spec_max_batch,
    )
    proposers: list[Proposer] = []
    for method in spec.methods:
        if method == "ngram":
            proposers.append(NgramProposer(spec.ngram_sizes))
        elif method == "suffix":
            index = SuffixIndex(spec.ngram_sizes, spec.suffix_max_tokens)
            index.template_tokens = frozenset(prompt_ids(tokenizer, ""))
            proposers.append(SuffixProposer(index))
        else:
            if draft is None:
                raise ValueError("speculative 'draft' needs a draft model (draft=(model, tok))")
            proposers.append(
                DraftProposer(
                    draft[0],
                    draft[1],
                    tokenizer,
                    config.max_num_seqs,
                    config.max_model_len,
                    config.quantization,
                    config.batch_invariant,
                )
            )
    return Speculator(spec, proposers)
