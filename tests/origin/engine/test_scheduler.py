"""Scheduler tests that drive schedule()/update() by hand, sampling a fixed token."""

from __future__ import annotations

import random

import pytest
import torch

from origin.engine.config import SchedulerConfig
from origin.engine.kv_cache import SlotKVCache
from origin.engine.request import Request, Status
from origin.engine.scheduler import Scheduler, SchedulerOutput
from origin.sampling import SamplingParams

TOKEN = 42  # what the fake model always samples; never EOS


def _scheduler(share_prefixes: bool = False, **config: int) -> Scheduler:
    cfg = SchedulerConfig(**config)  # type: ignore[arg-type]
    cache = SlotKVCache(1, cfg.max_num_seqs, 1, cfg.max_model_len, 1, torch.float32, "cpu")
    return Scheduler(cfg, cache, share_prefixes=share_prefixes)


def _request(tokenizer, name: str, prompt_len: int, max_tokens: int = 8) -> Request:  # type: ignore[no-untyped-def]
    return Request(name, [7] * prompt_len, SamplingParams(max_tokens=max_tokens), tokenizer, {2})


def _step(scheduler: Scheduler) -> tuple[SchedulerOutput, list[Request]]:
    out = scheduler.schedule()
    scheduler.check_invariants(out)
    for item in out.scheduled:  # what the runner does: the slot now holds these positions
        scheduler.cache.lengths[item.request.slot] = item.request.num_computed + item.num_tokens  # type: ignore[index]
    sampled = {s.request.request_id: [TOKEN] for s in out.scheduled if s.completes_known_tokens}
    finished = scheduler.update(out, sampled)
    scheduler.check_invariants()
    return out, finished


@pytest.fixture()
def tokenizer(embedded_model):  # type: ignore[no-untyped-def]
    return embedded_model[1]


@pytest.mark.parametrize("share_prefixes", [False, True])
def test_random_workload_keeps_invariants_and_finishes_everything(
    tokenizer, share_prefixes
) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(0)
    scheduler = _scheduler(
        share_prefixes, max_num_seqs=4, token_budget=64, prefill_chunk=32, max_model_len=256,
        kv_cache_tokens=400,
    )  # fmt: skip
    requests, done, cancelled = [], [], set()
    for step in range(2000):
        if step < 300 and rng.random() < 0.5:
            length, shared = rng.randint(1, 150), rng.randint(0, 150)  # 7, 7, ...: repeated
            prompt = [7] * min(length, shared) + [
                rng.randint(3, 999) for _ in range(length - shared)
            ]
            params = SamplingParams(max_tokens=rng.randint(1, 40))
            r = Request(f"r{step}", prompt, params, tokenizer, {2})
            scheduler.add(r)
            requests.append(r)
        if requests and rng.random() < 0.03:
            victim = rng.choice(requests)
            if not victim.finished:
                victim.cancelled = True
                cancelled.add(victim.request_id)
        out, finished = _step(scheduler)
        done.extend(finished)
        done.extend(out.aborted)
        if step > 300 and not scheduler.has_work:
            break
    assert not scheduler.has_work
    assert scheduler.cache.num_free == 4
    assert {r.request_id for r in done} == {r.request_id for r in requests}
    for r in done:
        if r.finish_reason == "length":
            assert len(r.output_ids) == r.params.max_tokens
        else:
            assert r.finish_reason == "abort" and r.request_id in cancelled
    assert scheduler.num_preemptions > 0  # the small KV budget forced some
    assert (scheduler.prefix_tokens_shared > 0) == share_prefixes


def test_a_shared_prefix_is_copied_or_its_free_slot_taken_not_computed(tokenizer) -> None:  # type: ignore[no-untyped-def]
    scheduler = _scheduler(True, max_num_seqs=3, token_budget=64, max_model_len=64)
    cache = scheduler.cache
    template = list(range(100, 120))  # 20 tokens every prompt starts with
    ask = lambda name, tail, n=2: Request(  # noqa: E731
        name, template + tail, SamplingParams(max_tokens=n), tokenizer, {2}
    )
    first = ask("first", [1, 2, 3])
    scheduler.add(first)
    _step(scheduler)  # its prompt computed: positions 0..22 hold its keys
    cache.k[0, first.slot, 0, :23, 0] = torch.arange(23.0)  # recognisable keys
    second = ask("second", [9])
    scheduler.add(second)
    out, _ = _step(scheduler)
    item = next(s for s in out.scheduled if s.request is second)
    assert item.num_tokens == 1  # its last prompt token only: the template was copied
    assert second.slot != first.slot
    assert torch.equal(cache.k[0, second.slot, 0, :20, 0], torch.arange(20.0))
    while not first.finished:
        _step(scheduler)
    third = ask("third", [1, 2, 4])  # shares 22 tokens with what first's free slot still holds
    scheduler.add(third)
    out, _ = _step(scheduler)
    assert next(s for s in out.scheduled if s.request is third).num_tokens == 1
    assert torch.equal(cache.k[0, third.slot, 0, :22, 0], torch.arange(22.0))  # taken, no copy
    short = ask("short", [], 1)  # the template alone: its last token is computed, not shared
    scheduler.add(short)
    while not short.finished:
        _step(scheduler)
    assert scheduler.prefix_tokens_shared == 20 + 22 + 19


def test_a_prefix_is_shared_within_its_scope_only(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A request never starts from keys and values another scope (the server's tenant) computed,
    running or left in a free slot: its first token would come sooner, and say so."""
    scheduler = _scheduler(True, max_num_seqs=4, token_budget=64, max_model_len=64)
    prompt = list(range(100, 130))  # 30 tokens
    ask = lambda name, scope: Request(  # noqa: E731
        name, prompt, SamplingParams(max_tokens=2), tokenizer, {2}, prefix_scope=scope
    )
    first = ask("first", "tenant-a")
    scheduler.add(first)
    _step(scheduler)  # its prompt computed
    for request in (ask("other", "tenant-b"), ask("same", "tenant-a")):
        scheduler.add(request)
    out, _ = _step(scheduler)
    computed = {s.request.request_id: s.num_tokens for s in out.scheduled}
    # another scope's identical prompt is computed whole; the same scope's copies all but one
    assert computed["other"] == 30 and computed["same"] == 1
    while scheduler.has_work:
        _step(scheduler)
    assert len(scheduler.cache.kept) == 3  # a free slot each, still holding its prompt
    for name, scope, tokens in (("late", "tenant-c", 30), ("again", "tenant-b", 1)):
        request = ask(name, scope)
        scheduler.add(request)
        out, _ = _step(scheduler)
        assert next(s for s in out.scheduled if s.request is request).num_tokens == tokens, name
        while scheduler.has_work:
            _step(scheduler)
    assert scheduler.prefix_tokens_shared == 29 + 29


def test_long_prompt_first_does_not_stall_a_short_one(tokenizer) -> None:  # type: ignore[no-untyped-def]
    scheduler = _scheduler(max_num_seqs=4, token_budget=128, prefill_chunk=64, max_model_len=2048)
    long = _request(tokenizer, "long", 1500)
    scheduler.add(long)
    _step(scheduler)  # the long prompt's first chunk is in flight
    short = _request(tokenizer, "short", 12)
    scheduler.add(short)
    steps = 0
    while short.times.first_token is None:
        _step(scheduler)
        steps += 1
    assert steps <= 1  # the short prompt is prefilled beside the long one's next chunk
    assert long.num_computed < len(long.prompt_ids)  # the long one is still prefilling
    for out, _ in (_step(scheduler) for _ in range(3)):
        assert {s.request.request_id for s in out.scheduled} == {"long", "short"}


def test_token_budget_and_chunk_are_respected(tokenizer) -> None:  # type: ignore[no-untyped-def]
    scheduler = _scheduler(max_num_seqs=8, token_budget=50, prefill_chunk=20, max_model_len=256)
    for i in range(6):
        scheduler.add(_request(tokenizer, f"r{i}", 45))
    out, _ = _step(scheduler)
    assert out.num_tokens == 50
    assert [s.num_tokens for s in out.scheduled] == [20, 20, 10]


def test_cancellation_frees_the_slot_at_the_next_step(tokenizer) -> None:  # type: ignore[no-untyped-def]
    scheduler = _scheduler(max_num_seqs=1, token_budget=64, max_model_len=128)
    a, b = _request(tokenizer, "a", 5, 50), _request(tokenizer, "b", 5)
    scheduler.add(a)
    scheduler.add(b)
    _step(scheduler)
    assert a.status is Status.RUNNING and b.status is Status.WAITING
    a.cancelled = True
    out, _ = _step(scheduler)
    assert out.aborted == [a] and a.finish_reason == "abort" and a.slot is None
    assert [s.request for s in out.scheduled] == [b]  # b took the freed slot in the same step
    b.cancelled = True
    out, _ = _step(scheduler)
    assert out.aborted == [b] and scheduler.cache.num_free == 1


def test_preemption_requeues_the_newest_first_and_recomputes(tokenizer) -> None:  # type: ignore[no-untyped-def]
    scheduler = _scheduler(
        max_num_seqs=2, token_budget=64, prefill_chunk=64, max_model_len=40, kv_cache_tokens=48
    )
    old, new = _request(tokenizer, "old", 10, 20), _request(tokenizer, "new", 2, 20)
    scheduler.add(old)
    _step(scheduler)
    scheduler.add(new)  # admitted: 2 + 20 fits beside old's 10 computed tokens
    preempted_at = None
    for step in range(60):
        out, _ = _step(scheduler)
        if out.preempted and preempted_at is None:
            preempted_at = step
            assert out.preempted == [new]  # the newest goes, the oldest keeps running
            assert scheduler.waiting[0] is new and new.num_computed == 0
            kept = list(new.output_ids)
        if not scheduler.has_work:
            break
    assert preempted_at is not None
    assert old.finish_reason == new.finish_reason == "length"
    assert new.output_ids[: len(kept)] == kept and len(new.output_ids) == 20
    assert new.num_preemptions >= 1


def test_every_slot_a_request_leaves_is_released(tokenizer) -> None:  # type: ignore[no-untyped-def]
    cfg = SchedulerConfig(
        max_num_seqs=2, token_budget=64, prefill_chunk=64, max_model_len=40, kv_cache_tokens=48
    )
    cache = SlotKVCache(1, cfg.max_num_seqs, 1, cfg.max_model_len, 1, torch.float32, "cpu")
    released: list[int] = []

    def release(slot: int) -> None:
        assert slot not in cache.used_slots  # told after the slot is free, once per leave
        released.append(slot)

    scheduler = Scheduler(cfg, cache, release=release)
    old, new = _request(tokenizer, "old", 10, 20), _request(tokenizer, "new", 2, 20)
    cancelled = _request(tokenizer, "cancelled", 2, 20)
    scheduler.add(old)
    _step(scheduler)
    scheduler.add(new)
    scheduler.add(cancelled)
    for _ in range(60):
        if len(cancelled.output_ids) == 2:
            cancelled.cancelled = True
        _step(scheduler)
        if not scheduler.has_work:
            break
    assert new.num_preemptions >= 1 and cancelled.finish_reason == "abort"
    # one release per finish of a request that held a slot, and one per preemption
    leaves = 3 + new.num_preemptions + old.num_preemptions + cancelled.num_preemptions
    assert len(released) == leaves and cache.num_free == 2


def test_request_longer_than_max_model_len_is_refused(tokenizer) -> None:  # type: ignore[no-untyped-def]
    scheduler = _scheduler(max_num_seqs=1, token_budget=8, max_model_len=32)
    with pytest.raises(ValueError, match="exceeds max_model_len 32"):
        scheduler.add(_request(tokenizer, "big", 30, 8))


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="token_budget must be at least max_num_seqs"):
        SchedulerConfig(max_num_seqs=8, token_budget=4)
    with pytest.raises(ValueError, match="kv_cache_tokens must hold"):
        SchedulerConfig(max_model_len=100, kv_cache_tokens=50)
