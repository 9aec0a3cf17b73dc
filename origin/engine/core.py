"""The engine core: requests in, one step loop of schedule -> execute -> update, outputs out.

Requests join and leave between steps (iteration-level continuous batching); long prompts are
prefilled in chunks beside running decodes; a cancelled request leaves at the next step and its
slot is free for the next waiting one. ``step()`` can be called by hand; ``start()`` runs it on a
background thread.

The core takes token ids (vLLM v1's ``EngineCore``): chat templates and tokenizing belong to the
front ends that wrap it, ``stream.py`` (async, for the server) and ``offline.py``
(``generate_many``, the nightly job's); another front end plugs in at ``add_request``. The
tokenizer it holds turns output tokens back into text (stop strings end a request here) and
names the tokens that end one. See docs/engine.md.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from origin.chat import eos_token_ids
from origin.engine.config import EngineConfig
from origin.engine.proposers import SuffixIndex
from origin.engine.queue_load import QueueLoad
from origin.engine.request import OutputCallback, Request
from origin.engine.runner import Runner, Segment, make_runner
from origin.engine.scheduler import ScheduledRequest, Scheduler, SchedulerOutput
from origin.engine.speculative import Speculator, make_speculator
from origin.sampling import SamplingParams, sample_rows

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from origin.model_folder import ModelFolder

log = logging.getLogger(__name__)


@dataclass
class EngineStats:
    """Counters since start (for /metrics) and the state of the last step."""

    steps: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    requests_finished: dict[str, int] = field(default_factory=dict)
    last_step_tokens: int = 0
    last_step_seqs: int = 0
    busy_s: float = 0.0
    # busy_s by part of the step (where a step's time goes: docs/engine.md, "Where a step's time
    # goes"): schedule, the forward, sampling and verifying, then update and the outputs
    phase_s: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("schedule", "forward", "sample", "update"), 0.0)
    )


class Engine:
    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: EngineConfig | None = None,
        runner: Runner | None = None,
        draft: tuple[PreTrainedModel, PreTrainedTokenizerBase] | None = None,
        folder: ModelFolder | None = None,
    ) -> None:
        """``folder``: where the model was read from (``ModelFolder.of``, the default), where
        the runner keeps what it derives from the weights (calibration, packed GGUF blocks)."""
        self.config = config or EngineConfig()
        self.model = model
        self.tokenizer = tokenizer
        self.runner = runner or make_runner(
            model,
            self.config.max_num_seqs,
            self.config.max_model_len,
            self.config.quantization,
            tokenizer,
            self.config.batch_invariant,
            folder,
        )
        self.speculator: Speculator | None = None
        if self.config.speculative:
            self.speculator = make_speculator(self.config, tokenizer, draft)
        elif draft is not None:
            raise ValueError("a draft model was given but speculative does not include 'draft'")
        self.suffix_index: SuffixIndex | None = None
        if self.speculator is not None:
            self.suffix_index = self.speculator.suffix_index
        shares = self.config.prefix_caching and getattr(self.runner, "shares_prefixes", False)
        self.scheduler = Scheduler(
            self.config,
            self.runner.cache,
            self.speculator,
            release=self.runner.release,
            share_prefixes=shares,
        )
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.vocab_size = len(tokenizer)  # the token ids a prompt may hold
        self.stats = EngineStats()
        self.queued = QueueLoad()
        self._ids = itertools.count()
        self._incoming: list[Request] = []  # added since the last step; guarded by _lock
        self._by_id: dict[str, Request] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.loop_error: BaseException | None = None
        self.step_hooks: list[Callable[[SchedulerOutput], None]] = []

    def seed_answers(
        self,
        answer_ids: Sequence[Sequence[int]],
        prompt_ids: Sequence[Sequence[int]] | None = None,
    ) -> int:
        """Add known answers' tokens (a release's, say) to the suffix index; returns how many.

        With their questions' ``prompt_ids``, later requests similar to one of them follow its
        answer first (``offline.seed_answers`` takes text).
        """
        if self.suffix_index is None:
            raise ValueError("seed_answers needs speculative='suffix'")
        if prompt_ids is not None and len(prompt_ids) != len(answer_ids):
            raise ValueError("questions and answers must have the same length")
        for i, answer in enumerate(answer_ids):
            prompt = list(prompt_ids[i]) if prompt_ids is not None else None
            self.suffix_index.add(list(answer), prompt)
        return len(answer_ids)

    # -- requests -------------------------------------------------------------------------------

    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._ids)}"

    def add_request(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        on_output: OutputCallback | None = None,
        request_id: str | None = None,
        arrival: float | None = None,
        prefix_scope: str = "",
    ) -> Request:
        """Queue a request for ``prompt_ids`` (the front end's tokens, chat template applied);
        ``on_output`` is called from the engine thread with each output.

        ``arrival`` (``time.monotonic()``) is when the request reached the caller, say the HTTP
        server, so that the queue part of the TTFT counts from there. ``prefix_scope``: the
        request starts only from prefixes computed by requests of the same scope (a tenant:
        prefix sharing's timing tells whether someone sent a prompt beginning like it)."""
        params = params or SamplingParams()
        request = Request(
            request_id or self.new_request_id(),
            _token_ids(prompt_ids, self.vocab_size),
            params,
            self.tokenizer,
            self.eos_ids,
            on_output,
            prefix_scope,
        )
        if arrival is not None:
            request.times.arrival = arrival
        self.scheduler.check_fits(request)  # here, so the caller gets the error, not the loop
        with self._wake:
            if request.request_id in self._by_id:
                raise ValueError(f"request id {request.request_id!r} is already in use")
            self._by_id[request.request_id] = request
            self.queued.add(request)
            self._incoming.append(request)
            self._wake.notify()
        return request

    def cancel(self, request_id: str) -> bool:
        """Cancel a request; its slot is freed at the next step. False if unknown or done."""
        with self._wake:
            request = self._by_id.get(request_id)
            if request is None or request.finished:
                return False
            request.cancelled = True
            self._wake.notify()
            return True

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self._incoming)

    def queue_load(self) -> tuple[int, int]:
        """Requests waiting for their first slot, and their prompt tokens (thread-safe)."""
        return self.queued.snapshot()

    # -- the step -------------------------------------------------------------------------------

    def step(self) -> SchedulerOutput:
        """One schedule -> execute -> update. Safe to call by hand when the loop is not running."""
        started = time.perf_counter()
        self._add_incoming()
        out = self.scheduler.schedule()
        self.queued.remove([s.request for s in out.scheduled] + out.aborted)
        for request in out.aborted:
            self._emit(request)
        scheduled = time.perf_counter()
        self.stats.phase_s["schedule"] += scheduled - started
        if out.scheduled:
            self.stats.prompt_tokens += _prefill_tokens(out)
            sampled = self._execute(out)
            executed = time.perf_counter()
            finished = self.scheduler.update(out, sampled)
            if self.speculator is not None:
                self.speculator.remember(finished)
            for item in out.scheduled:
                if item.request.request_id in sampled or item.request.finished:
                    self._emit(item.request)
            self.stats.generation_tokens += sum(len(t) for t in sampled.values())
            self.stats.phase_s["update"] += time.perf_counter() - executed
        self._record_step(out, time.perf_counter() - started)
        for hook in self.step_hooks:
            hook(out)
        return out

    def _add_incoming(self) -> None:
        with self._lock:
            for request in self._incoming:
                self.scheduler.add(request)
            self._incoming.clear()

    def _execute(self, out: SchedulerOutput) -> dict[str, list[int]]:
        """Run the step's forward; the new tokens of each request that completed its known ones
        (a verified proposal yields several)."""
        started = time.perf_counter()
        logits = self.runner.forward([_segment(item) for item in out.scheduled])
        forwarded = time.perf_counter()
        self.stats.phase_s["forward"] += forwarded - started
        sampled: dict[str, list[int]] = {}
        plain = []
        for i, item in enumerate(out.scheduled):
            if item.proposal:
                assert self.speculator is not None
                sampled[item.request.request_id] = self.speculator.verify(item, logits[i])
            elif item.completes_known_tokens:
                plain.append(i)
        if plain:
            stacked = torch.stack([logits[i][-1] for i in plain]).cpu()
            requests = [out.scheduled[i].request for i in plain]
            tokens = sample_rows(
                stacked, [r.params for r in requests], [r.generator for r in requests]
            )
            for request, token in zip(requests, tokens, strict=True):
                sampled[request.request_id] = [token]
        self.stats.phase_s["sample"] += time.perf_counter() - forwarded
        return sampled

    def _emit(self, request: Request) -> None:
        output = request.take_output()
        if output.finished:
            with self._lock:
                self._by_id.pop(request.request_id, None)
            reason = output.finish_reason or "unknown"
            self.stats.requests_finished[reason] = self.stats.requests_finished.get(reason, 0) + 1
        if request.on_output is not None:
            try:
                request.on_output(output)
            except Exception:  # a broken consumer must not stop the engine
                log.exception("output callback of %s failed", request.request_id)

    def _record_step(self, out: SchedulerOutput, busy_s: float) -> None:
        self.stats.preemptions = self.scheduler.num_preemptions
        self.stats.steps += 1
        self.stats.last_step_tokens = out.num_tokens
        self.stats.last_step_seqs = len(out.scheduled)
        self.stats.busy_s += busy_s

    # -- the background loop --------------------------------------------------------------------

    def start(self) -> Engine:
        if not self.loop_running:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="edgeqa-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def loop_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self.loop_running and self.loop_error is None

    def _loop(self) -> None:
        try:
            self._serve_steps()
        except BaseException as error:  # the loop is dead: /health must say so
            self.loop_error = error
            log.critical("engine loop died: %r", error)
            raise

    def _serve_steps(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._incoming and not self.scheduler.has_work:
                    self._wake.wait()
                if self._stopping:
                    break
            try:
                self.step()
            except Exception as error:
                # fail what was in flight, keep serving the next requests
                log.exception("engine step failed")
                aborted = self.scheduler.abort_all("error", f"{type(error).__name__}: {error}")
                self.queued.remove(aborted)
                for request in aborted:
                    self._emit(request)

    # -- metrics --------------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        return {
            "num_requests_running": self.num_running,
            "num_requests_waiting": self.num_waiting,
            "kv_cache_usage": self.scheduler.kv_tokens_used / self.config.kv_capacity,
            "steps": self.stats.steps,
            "prompt_tokens": self.stats.prompt_tokens,
            "generation_tokens": self.stats.generation_tokens,
            "preemptions": self.stats.preemptions,
            "prefix_tokens_shared": self.scheduler.prefix_tokens_shared,
            "requests_finished": dict(self.stats.requests_finished),
            "spec_decode": self.spec_metrics(),
            "step_seconds": dict(self.stats.phase_s),
        }

    def spec_metrics(self) -> dict[str, Any]:
        """vLLM's spec_decode_* counters, plus acceptance per proposer."""
        return {} if self.speculator is None else self.speculator.stats.metrics()


def _token_ids(prompt_ids: Sequence[int], vocab: int) -> list[int]:
    """``prompt_ids`` checked: a non-empty sequence of ints, each a token of the vocabulary."""
    if isinstance(prompt_ids, str | bytes):
        raise TypeError("the engine core takes token ids: tokenize in a front end (origin.chat)")
    ids = list(prompt_ids)
    if not ids:
        raise ValueError("prompt is empty")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"prompt token ids must be ints, got {type(t).__name__}")
        if not 0 <= t < vocab:
            raise ValueError(f"prompt token id {t} is outside the vocabulary (0..{vocab - 1})")
    return ids


def _segment(item: ScheduledRequest) -> Segment:
    """The tokens ``item`` computes: the next known ones, then its proposal (if any)."""
    request = item.request
    known = item.num_tokens - len(item.proposal)
    tokens = request.token_ids[request.num_computed : request.num_computed + known]
    return Segment(
        slot=request.slot,  # type: ignore[arg-type]
        token_ids=tokens + item.proposal,
        start=request.num_computed,
        all_logits=bool(item.proposal),
    )


def _prefill_tokens(out: SchedulerOutput) -> int:
    """Prompt tokens the step computes (recomputed ones after a preemption count too)."""
    return sum(
        s.num_tokens - len(s.proposal)
        for s in out.scheduled
        if s.request.num_uncomputed > 1  # not a decode step
    )
