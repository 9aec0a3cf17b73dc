"""The engine: a background loop of schedule -> execute -> update over a slot KV cache.

One engine serves both the online server (``stream``) and offline batch generation
(``generate_many``). Requests join and leave between steps (iteration-level continuous batching);
long prompts are prefilled in chunks beside running decodes; a cancelled request leaves at the
next step and its slot is free for the next waiting one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from origin.engine.request import OutputCallback, Request, RequestOutput
from origin.engine.runner import Runner, Segment, make_runner
from origin.engine.scheduler import ScheduledRequest, Scheduler, SchedulerConfig, SchedulerOutput
from origin.engine.speculative import (
    DraftProposer,
    NgramProposer,
    Proposer,
    SpecConfig,
    Speculator,
    SuffixIndex,
    SuffixProposer,
)
from origin.generate import Message, encode_chat, eos_token_ids
from origin.sampling import SamplingParams, sample_rows

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

Prompt = str | Sequence[Message] | Sequence[int]


@dataclass(frozen=True)
class EngineConfig(SchedulerConfig):
    quantization: str | None = None  # None (the model's dtype), "bf16" or "int8"
    speculative: str | None = None  # None, "ngram", "suffix", "draft", or "+"-joined
    num_speculative_tokens: int = 5
    spec_max_batch: int = 2  # speculate only while at most this many requests decode


def default_quantization(device: torch.device | str) -> str | None:
    """The weights the origin serves with when not told: bf16 on CPUs with native bf16 dot
    products (2x the fp32 throughput at 0.99 greedy agreement), else the model as loaded."""
    if torch.device(device).type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "bf16"
    return None


@dataclass
class Completion:
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None
    prompt_tokens: int
    ttft_s: float | None
    e2e_s: float | None
    error: str | None = None


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


class Engine:
    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: EngineConfig | None = None,
        runner: Runner | None = None,
        draft: tuple[PreTrainedModel, PreTrainedTokenizerBase] | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.model = model
        self.tokenizer = tokenizer
        self.runner = runner or make_runner(
            model,
            self.config.max_num_seqs,
            self.config.max_model_len,
            self.config.quantization,
            tokenizer,
        )
        self.speculator: Speculator | None = None
        self.suffix_index: SuffixIndex | None = None
        if self.config.speculative:
            self.speculator = self._make_speculator(draft)
        elif draft is not None:
            raise ValueError("a draft model was given but speculative does not include 'draft'")
        self.scheduler = Scheduler(self.config, self.runner.cache, self.speculator)
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._incoming: list[Request] = []
        self._by_id: dict[str, Request] = {}
        # requests not yet given a slot, and their prompt tokens (the server's admission bound)
        self._queued: dict[str, int] = {}
        self._queued_tokens = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.loop_error: BaseException | None = None
        self.step_hooks: list[Callable[[SchedulerOutput], None]] = []

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Engine:
        """An engine for ``EDGEQA_MODEL`` with the ``EDGEQA_*`` engine settings."""
        from origin.config import OriginConfig
        from origin.model import load_model

        settings = OriginConfig.from_env(environ)
        model, tokenizer = load_model(
            settings.model, settings.device, settings.dtype, settings.cache_dir
        )
        return cls(model, tokenizer, settings.engine_config(str(model.device)))

    def _make_speculator(
        self, draft: tuple[PreTrainedModel, PreTrainedTokenizerBase] | None
    ) -> Speculator:
        spec = SpecConfig(
            method=self.config.speculative or "",
            num_speculative_tokens=self.config.num_speculative_tokens,
            max_batch=self.config.spec_max_batch,
        )
        proposers: list[Proposer] = []
        for method in spec.methods:
            if method == "ngram":
                proposers.append(NgramProposer(spec.ngram_sizes))
            elif method == "suffix":
                self.suffix_index = SuffixIndex(spec.ngram_sizes, spec.suffix_max_tokens)
                self.suffix_index.template_tokens = frozenset(
                    self.encode([{"role": "user", "content": ""}])
                )
                proposers.append(SuffixProposer(self.suffix_index))
            else:
                if draft is None:
                    raise ValueError("speculative 'draft' needs a draft model (draft=(model, tok))")
                proposers.append(
                    DraftProposer(
                        draft[0],
                        draft[1],
                        self.tokenizer,
                        self.config.max_num_seqs,
                        self.config.max_model_len,
                        self.config.quantization,
                    )
                )
        return Speculator(spec, proposers)

    def seed_answers(self, answers: Sequence[str], questions: Sequence[str] | None = None) -> int:
        """Add known answers (a release's, say) to the suffix index; returns how many.

        With ``questions``, later requests similar to one of them follow its answer first.
        """
        if self.suffix_index is None:
            raise ValueError("seed_answers needs speculative='suffix'")
        if questions is not None and len(questions) != len(answers):
            raise ValueError("questions and answers must have the same length")
        for i, text in enumerate(answers):
            prompt = self.encode(questions[i]) if questions is not None else None
            self.suffix_index.add(self.tokenizer.encode(text, add_special_tokens=False), prompt)
        return len(answers)

    # -- requests -------------------------------------------------------------------------------

    def encode(self, prompt: Prompt) -> list[int]:
        """A question (str), chat messages, or token ids, as the prompt's token ids."""
        if isinstance(prompt, str):
            return encode_chat(self.tokenizer, [{"role": "user", "content": prompt}])
        items = list(prompt)
        if not items:
            raise ValueError("prompt is empty")
        if all(isinstance(t, int) for t in items):
            return [int(t) for t in items]  # type: ignore[call-overload]
        return encode_chat(self.tokenizer, items)  # type: ignore[arg-type]

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        on_output: OutputCallback | None = None,
        request_id: str | None = None,
        arrival: float | None = None,
    ) -> Request:
        """Queue a request; ``on_output`` is called from the engine thread with each output.

        ``arrival`` (``time.monotonic()``) is when the request reached the caller, say the HTTP
        server, so that the queue part of the TTFT counts from there."""
        params = params or SamplingParams()
        request = Request(
            request_id or f"req-{next(self._ids)}",
            self.encode(prompt),
            params,
            self.tokenizer,
            self.eos_ids,
            on_output,
        )
        if arrival is not None:
            request.times.arrival = arrival
        self.scheduler.check_fits(request)  # here, so the caller gets the error, not the loop
        with self._wake:
            if request.request_id in self._by_id:
                raise ValueError(f"request id {request.request_id!r} is already in use")
            self._by_id[request.request_id] = request
            self._queued[request.request_id] = len(request.prompt_ids)
            self._queued_tokens += len(request.prompt_ids)
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
        with self._lock:
            return len(self._queued), self._queued_tokens

    def _dequeue(self, requests: Sequence[Request]) -> None:
        with self._lock:
            for request in requests:
                tokens = self._queued.pop(request.request_id, None)
                if tokens is not None:
                    self._queued_tokens -= tokens

    # -- the step -------------------------------------------------------------------------------

    def step(self) -> SchedulerOutput:
        """One schedule -> execute -> update. Safe to call by hand when the loop is not running."""
        started = time.perf_counter()
        with self._lock:
            for request in self._incoming:
                self.scheduler.add(request)
            self._incoming.clear()
        out = self.scheduler.schedule()
        self._dequeue([s.request for s in out.scheduled] + out.aborted)
        for request in out.aborted:
            self._emit(request)
        if out.scheduled:
            # prefill work of this step (recomputed tokens after a preemption count too)
            self.stats.prompt_tokens += sum(
                s.num_tokens - len(s.proposal)
                for s in out.scheduled
                if s.request.num_uncomputed > 1  # not a decode step
            )
            sampled = self._execute(out)
            finished = self.scheduler.update(out, sampled)
            if self.suffix_index is not None:
                for request in finished:
                    if request.finish_reason in ("stop", "length"):
                        self.suffix_index.add(request.output_ids, request.prompt_ids)
            for item in out.scheduled:
                request = item.request
                if request.request_id in sampled or request.finished:
                    self._emit(request)
            self.stats.generation_tokens += sum(len(t) for t in sampled.values())
        self.stats.preemptions = self.scheduler.num_preemptions
        self.stats.steps += 1
        self.stats.last_step_tokens = out.num_tokens
        self.stats.last_step_seqs = len(out.scheduled)
        self.stats.busy_s += time.perf_counter() - started
        for hook in self.step_hooks:
            hook(out)
        return out

    def _execute(self, out: SchedulerOutput) -> dict[str, list[int]]:
        segments = []
        for item in out.scheduled:
            request = item.request
            known = item.num_tokens - len(item.proposal)
            tokens = request.token_ids[request.num_computed : request.num_computed + known]
            segments.append(
                Segment(
                    slot=request.slot,  # type: ignore[arg-type]
                    token_ids=tokens + item.proposal,
                    start=request.num_computed,
                    all_logits=bool(item.proposal),
                )
            )
        logits = self.runner.forward(segments)
        sampled: dict[str, list[int]] = {}
        plain = []
        for i, item in enumerate(out.scheduled):
            if item.proposal:
                sampled[item.request.request_id] = self._verify(item, logits[i])
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
        return sampled

    def _verify(self, item: ScheduledRequest, logits: torch.Tensor) -> list[int]:
        """Greedy verification: the accepted proposal prefix, then the target's next token."""
        # logits: [1 + k, vocab]; row i predicts the token after proposal[:i]
        targets = logits.argmax(dim=-1).tolist()
        accepted = 0
        for proposed, target in zip(item.proposal, targets, strict=False):
            if proposed != target:
                break
            accepted += 1
        assert self.speculator is not None
        self.speculator.observe(item.request, item.proposer, len(item.proposal), accepted)
        return [*item.proposal[:accepted], targets[accepted]]

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

    # -- the background loop --------------------------------------------------------------------

    def start(self) -> Engine:
        if self._thread is None or not self._thread.is_alive():
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
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.loop_error is None

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
                self._dequeue(aborted)
                for request in aborted:
                    self._emit(request)

    # -- interfaces -----------------------------------------------------------------------------

    def open_stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival: float | None = None,
        timeout_s: float | None = None,
    ) -> OutputStream:
        """Queue a request now and return its outputs as an async iterator (call from a running
        event loop). ``close()`` it when leaving early: that cancels the request.

        ``timeout_s`` bounds the whole request (from now): past it the request is cancelled and
        ``TimeoutError`` raised by the iterator."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()

        def deliver(output: RequestOutput) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, output)
            except RuntimeError:
                pass  # the consumer's event loop is gone; the request is being cancelled

        request = self.add_request(prompt, params, deliver, request_id, arrival)
        self.start()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        return OutputStream(self, request.request_id, queue, deadline)

    async def stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival: float | None = None,
        timeout_s: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield outputs as they are produced; leaving the loop early cancels the request."""
        outputs = self.open_stream(prompt, params, request_id, arrival, timeout_s)
        try:
            async for output in outputs:
                yield output
        finally:
            outputs.close()

    def generate_many(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        progress: bool = True,
        desc: str = "generating",
    ) -> list[Completion]:
        """Generate for every prompt, keeping the batch full; results in the prompts' order."""
        from tqdm import tqdm

        per_prompt = (
            list(params)
            if isinstance(params, Sequence)
            else [params or SamplingParams()] * len(prompts)
        )
        if len(per_prompt) != len(prompts):
            raise ValueError("params must be one SamplingParams or one per prompt")
        results: dict[str, Completion] = {}
        texts: dict[str, list[str]] = {}
        tokens: dict[str, list[int]] = {}
        done = threading.Event()
        bar = tqdm(total=len(prompts), desc=desc, unit="req", disable=not progress)

        def collect(output: RequestOutput) -> None:
            texts[output.request_id].append(output.delta_text)
            tokens[output.request_id].extend(output.delta_token_ids)
            if output.finished:
                times = output.times
                results[output.request_id] = Completion(
                    request_id=output.request_id,
                    text="".join(texts[output.request_id]),
                    token_ids=tokens[output.request_id],
                    finish_reason=output.finish_reason,
                    prompt_tokens=output.prompt_tokens,
                    ttft_s=times.ttft_s,
                    e2e_s=None if times.finished is None else times.finished - times.arrival,
                    error=output.error,
                )
                bar.update(1)
                if len(results) == len(prompts):
                    done.set()

        ids = []
        for prompt, p in zip(prompts, per_prompt, strict=True):
            request_id = f"batch-{next(self._ids)}"
            texts[request_id], tokens[request_id] = [], []
            ids.append(self.add_request(prompt, p, collect, request_id).request_id)
        if not prompts:
            done.set()
        if self._thread is not None and self._thread.is_alive():
            done.wait()
        else:
            while not done.is_set():
                self.step()
        bar.close()
        return [results[i] for i in ids]

    def metrics(self) -> dict[str, Any]:
        return {
            "num_requests_running": self.num_running,
            "num_requests_waiting": self.num_waiting,
            "kv_cache_usage": self.scheduler.kv_tokens_used / self.config.kv_capacity,
            "steps": self.stats.steps,
            "prompt_tokens": self.stats.prompt_tokens,
            "generation_tokens": self.stats.generation_tokens,
            "preemptions": self.stats.preemptions,
            "requests_finished": dict(self.stats.requests_finished),
            "spec_decode": self.spec_metrics(),
        }

    def spec_metrics(self) -> dict[str, Any]:
        """vLLM's spec_decode_* counters, plus acceptance per proposer."""
        if self.speculator is None:
            return {}
        stats = self.speculator.stats
        return {
            "num_drafts": stats.num_drafts,
            "num_draft_tokens": stats.num_draft_tokens,
            "num_accepted_tokens": stats.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(stats.accepted_per_position),
            "acceptance_rate": stats.acceptance_rate,
            "acceptance_rate_by_proposer": stats.acceptance_by_proposer(),
        }


class OutputStream:
    """The outputs of one request, as an async iterator (``Engine.open_stream``)."""

    def __init__(
        self,
        engine: Engine,
        request_id: str,
        queue: asyncio.Queue[RequestOutput],
        deadline: float | None,
    ) -> None:
        self.engine = engine
        self.request_id = request_id
        self.queue = queue
        self.deadline = deadline
        self.finished = False

    def __aiter__(self) -> OutputStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        if self.deadline is None:
            output = await self.queue.get()
        else:
            remaining = self.deadline - asyncio.get_running_loop().time()
            try:
                output = await asyncio.wait_for(self.queue.get(), max(0.0, remaining))
            except TimeoutError:
                self.close()
                raise
        self.finished = output.finished
        return output

    def close(self) -> None:
        """Cancel the request unless it has finished (its slot is free at the next step)."""
        if not self.finished:
            self.finished = True
            self.engine.cancel(self.request_id)
