"""The scheduler: which requests compute how many tokens in the next step.

A step reads top to bottom (vLLM's shape): set the token budget; serve running requests in arrival
order (a decode token each, or the next prefill chunk), preempting the newest running request when
the KV cache has no room; admit waiting requests while budget, slots and cache room remain; check
the invariants; return one ``SchedulerOutput``. ``update`` then commits what the step computed.

Every request that leaves its slot (finished, cancelled, aborted or preempted) leaves through
``_free_slot``, which also tells the runner (``release``) so it can drop what it holds for the slot.

Prefix sharing (``share_prefixes``; vLLM's automatic prefix caching, llama.cpp's slot prompt
cache): a request admitted with tokens that begin like those of a running request, or like those
a free slot still holds from its last owner, starts with that prefix's keys and values (copied, or
the free slot taken as it is) instead of computing them: a chat template's system prompt is
computed once, not once per request. Only where every row's numbers depend on its own tokens
alone (the batch-invariant kernels) is a copied prefix what the request would have computed.
A request shares only with requests of its ``prefix_scope`` (the server's tenant): a first token
that comes sooner would tell it that another scope sent a prompt beginning like its own.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from origin.engine.config import RequestTooLongError, SchedulerConfig
from origin.engine.kv_cache import SlotKVCache
from origin.engine.request import Request, Status


class Proposals(Protocol):
    """What the scheduler asks of speculative decoding (``speculative.Speculator``)."""

    def propose(
        self, requests: Sequence[Request], room: Sequence[int], num_decoding: int
    ) -> list[tuple[str, list[int]]]:
        """(proposer name, tokens) per request; empty tokens where it does not speculate."""
        ...


SHARED_PREFIX_MIN = 8  # the fewest shared tokens a request starts from instead of computing


def _shared(tokens: list[int], other: list[int], limit: int) -> int:
    """How many leading tokens ``tokens`` and ``other[:limit]`` have in common."""
    n = min(len(tokens), len(other), limit)
    i = 0
    while i < n and tokens[i] == other[i]:
        i += 1
    return i


@dataclass
class ScheduledRequest:
    request: Request
    num_tokens: int  # tokens computed this step, speculative proposal included
    proposal: list[int] = field(default_factory=list)
    proposer: str = ""

    @property
    def completes_known_tokens(self) -> bool:
        """True when this chunk reaches the last known token, so a new token is sampled."""
        known = self.num_tokens - len(self.proposal)
        return self.request.num_computed + known == self.request.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    aborted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        cache: SlotKVCache,
        speculator: Proposals | None = None,
        release: Callable[[int], None] | None = None,
        share_prefixes: bool = False,
    ) -> None:
        """``release(slot)`` is called whenever a request leaves ``slot`` (``Runner.release``);
        ``share_prefixes``: start requests from a prefix already in ``cache`` (the module's
        docstring), for runners whose keys and values live there."""
        if cache.num_slots < config.max_num_seqs or cache.max_len < config.max_model_len:
            raise ValueError("the KV cache is smaller than the scheduler's config")
        self.config = config
        self.cache = cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in arrival order: the newest is preempted first
        self.num_preemptions = 0
        self.speculator = speculator
        self.release = release
        self.share_prefixes = share_prefixes
        self.prefix_tokens_shared = 0  # tokens admitted requests did not compute
        # free slot -> the prefix scope of the request that left what it holds (cache.kept)
        self._kept_scopes: dict[int, str] = {}

    # -- intake ---------------------------------------------------------------------------------

    def check_fits(self, request: Request) -> None:
        """Refuse a request that could not fit in one slot, with a message naming the limit."""
        if request.params.max_tokens > self.config.room(len(request.prompt_ids)):
            raise RequestTooLongError(
                f"prompt ({len(request.prompt_ids)} tokens) + max_tokens "
                f"({request.params.max_tokens}) exceeds max_model_len {self.config.max_model_len}"
            )

    def add(self, request: Request) -> None:
        self.check_fits(request)
        self.waiting.append(request)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def kv_tokens_used(self) -> int:
        return sum(r.num_computed for r in self.running)

    # -- one step -------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._drop_cancelled(out)
        budget = self.config.token_budget
        kv_free = self.config.kv_capacity - self.kv_tokens_used

        for request in list(self.running):
            if request.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            if budget == 0:
                break
            n = self._chunk(request, budget)
            while n > kv_free and self._preempt_newest(out, keep=request):
                kv_free = self.config.kv_capacity - self.kv_tokens_used - self._reserved(out)
            if n > kv_free:
                self._preempt(request, out)
                continue
            out.scheduled.append(ScheduledRequest(request, n))
            budget -= n
            kv_free -= n

        if self.speculator is not None and budget > 0:
            budget, kv_free = self._speculate(out, budget, kv_free)

        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            # admit only when the whole request fits beside the others, so that admitting it
            # never forces a preemption of someone already running
            need = request.num_tokens + request.params.max_tokens - len(request.output_ids)
            if out.preempted or need > kv_free:
                break
            request.slot = self._allocate(request)  # before leaving the queue: if it fails
            self.waiting.popleft()
            n = self._chunk(request, budget)
            request.status = Status.RUNNING
            if request.times.scheduled is None:
                request.times.scheduled = time.monotonic()
            self.running.append(request)
            out.scheduled.append(ScheduledRequest(request, n))
            budget -= n
            kv_free -= need
        return out

    def update(self, out: SchedulerOutput, sampled: dict[str, list[int]]) -> list[Request]:
        """Commit a computed step: advance positions, append sampled tokens, retire the done.

        ``sampled`` holds one token per request, or for a verified proposal the accepted
        proposal tokens followed by the target's own next token.
        """
        now = time.monotonic()
        finished = []
        for item in out.scheduled:
            request = item.request
            tokens = sampled.get(request.request_id)
            if not tokens:
                request.num_computed += item.num_tokens  # a prefill chunk short of the prompt end
                continue
            # valid K/V: the known tokens computed, plus the accepted proposal tokens
            base = request.num_computed + item.num_tokens - len(item.proposal)
            appended = 0
            for token in tokens:
                request.append_token(token, now)
                appended += 1
                if request.finish_reason is not None:
                    break
            request.num_computed = base + appended - 1
            if request.finish_reason is not None:
                self._finish(request, now)
                finished.append(request)
            elif item.proposal:
                assert request.slot is not None
                self.cache.truncate(request.slot, request.num_computed)  # drop rejected tokens
        return finished

    def abort_all(self, reason: str, error: str | None = None) -> list[Request]:
        now = time.monotonic()
        victims = [*self.running, *self.waiting]
        for request in victims:
            request.finish_reason = reason
            request.error = error
            self._finish(request, now)
        self.waiting.clear()
        return victims

    def check_invariants(self, out: SchedulerOutput | None = None) -> None:
        """Internal consistency, asserted by the tests after every step."""
        slots = [r.slot for r in self.running]
        assert len(slots) == len(set(slots)), "two running requests share a slot"
        assert len(self.running) <= self.config.max_num_seqs
        assert sorted(s for s in slots if s is not None) == self.cache.used_slots, "leaked slot"
        assert all(r.status is Status.RUNNING for r in self.running)
        assert all(r.status is Status.WAITING and r.slot is None for r in self.waiting)
        assert self.kv_tokens_used <= self.config.kv_capacity
        assert not set(self.cache.kept) & set(self.cache.used_slots), "a taken slot still kept"
        for request in self.running:
            assert request.num_computed <= request.num_tokens
        if out is not None:
            assert out.num_tokens <= self.config.token_budget, "token budget exceeded"
            ids = [s.request.request_id for s in out.scheduled]
            assert len(ids) == len(set(ids)), "a request scheduled twice in one step"

    # -- helpers --------------------------------------------------------------------------------

    def _speculate(self, out: SchedulerOutput, budget: int, kv_free: int) -> tuple[int, int]:
        """Extend decode items with proposals, within the leftover budget and cache room."""
        assert self.speculator is not None
        decoding = [s for s in out.scheduled if s.num_tokens == 1 and s.request.num_uncomputed == 1]
        if not decoding:
            return budget, kv_free
        share = min(budget, kv_free) // len(decoding)
        room = [min(share, self.config.max_model_len - s.request.num_tokens - 1) for s in decoding]
        proposals = self.speculator.propose([s.request for s in decoding], room, len(self.running))
        for item, (proposer, tokens) in zip(decoding, proposals, strict=True):
            if tokens:
                item.proposal, item.proposer = tokens, proposer
                item.num_tokens += len(tokens)
                budget -= len(tokens)
                kv_free -= len(tokens)
        return budget, kv_free

    def _allocate(self, request: Request) -> int:
        """A slot for ``request``; with prefix sharing, one holding the longest prefix of its
        tokens found in a running request or a free slot of its prefix scope (at most all but
        its last token: that one is computed to sample from), with ``num_computed`` set past it."""
        if not self.share_prefixes:
            return self.cache.allocate()
        tokens, limit, scope = request.token_ids, request.num_tokens - 1, request.prefix_scope
        best, source, free = 0, -1, False
        for slot, held in self.cache.kept.items():  # a free slot needs no copy: first on ties
            if self._kept_scopes.get(slot) != scope:
                continue
            n = _shared(tokens, held, limit)
            if n > best:
                best, source, free = n, slot, True
        for other in self.running:
            if other.prefix_scope != scope:
                continue
            n = _shared(tokens, other.token_ids, min(limit, other.num_computed))
            if n > best and other.slot is not None:
                best, source, free = n, other.slot, False
        if best < SHARED_PREFIX_MIN:
            return self.cache.allocate()
        if free:
            slot = source
            self.cache.take(slot, best)
        else:
            slot = self.cache.allocate()
            self.cache.copy_prefix(source, slot, best)
        request.num_computed = best
        self.prefix_tokens_shared += best
        return slot

    def _chunk(self, request: Request, budget: int) -> int:
        remaining = request.num_uncomputed
        if remaining == 1:
            return 1
        return min(remaining, budget, self.config.prefill_chunk)

    def _reserved(self, out: SchedulerOutput) -> int:
        return sum(s.num_tokens for s in out.scheduled)

    def _preempt_newest(self, out: SchedulerOutput, keep: Request) -> bool:
        """Preempt the newest running request other than ``keep``; False when there is none."""
        for victim in reversed(self.running):
            if victim is keep:
                return False
            if victim.status is Status.RUNNING:
                out.scheduled = [s for s in out.scheduled if s.request is not victim]
                self._preempt(victim, out)
                return True
        return False

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Recompute preemption: free the slot, keep the tokens, queue it first."""
        self._free_slot(request)
        self.running.remove(request)
        request.num_computed = 0
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        out.preempted.append(request)

    def _drop_cancelled(self, out: SchedulerOutput) -> None:
        now = time.monotonic()
        for request in [r for r in (*self.running, *self.waiting) if r.cancelled]:
            if request.status is Status.WAITING:
                self.waiting.remove(request)
            request.finish_reason = "abort"
            self._finish(request, now)
            out.aborted.append(request)

    def _finish(self, request: Request, now: float) -> None:
        if request.status is Status.RUNNING:
            self._free_slot(request)
            self.running.remove(request)
        request.slot = None
        request.status = Status.FINISHED
        request.times.finished = now

    def _free_slot(self, request: Request) -> None:
        slot = request.slot
        assert slot is not None
        # with prefix sharing, what its positions hold until the slot's next owner
        holds = request.token_ids[: request.num_computed] if self.share_prefixes else None
        self.cache.free(slot, holds)
        self._kept_scopes[slot] = request.prefix_scope
        request.slot = None
        if self.release is not None:
            self.release(slot)
