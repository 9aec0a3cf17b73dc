"""A request inside the engine, the one object the scheduler moves between its queues.

``Request`` holds what the scheduler reads: identity, prompt and tokens, status, slot and how many
of its tokens the slot holds, timings. The rest is in named parts: ``spec`` (speculative back-off,
read and written by ``speculative.py``), ``output`` (detokenized text, stop strings and what has
been sent) and ``generator`` (its own RNG when seeded, from ``origin.sampling``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from origin.detokenizer import IncrementalDetokenizer
from origin.sampling import SamplingParams, find_stop, make_generator

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestTimes:
    """Monotonic seconds. TTFT = queue (arrival -> scheduled) + compute (scheduled -> first)."""

    arrival: float
    scheduled: float | None = None
    first_token: float | None = None
    tokens: list[float] = field(default_factory=list)
    finished: float | None = None

    @property
    def queue_s(self) -> float | None:
        return None if self.scheduled is None else self.scheduled - self.arrival

    @property
    def ttft_compute_s(self) -> float | None:
        if self.first_token is None or self.scheduled is None:
            return None
        return self.first_token - self.scheduled

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival


@dataclass
class RequestOutput:
    """What a request has produced since its last output; ``finished`` on the last one."""

    request_id: str
    delta_text: str
    delta_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    times: RequestTimes
    error: str | None = None


OutputCallback = Callable[[RequestOutput], None]


@dataclass
class SpecState:
    """A request's speculative back-off (``Speculator.observe``) and suffix-lookup neighbours."""

    ema: float = 2.0  # recent mean of accepted tokens per draft
    cooldown: int = 0  # steps left without speculation
    neighbors: list[int] | None = None  # similar earlier answers; None until looked up


class OutputState:
    """The output's text and what of it has been sent.

    Text is cut at the first stop string; until the request finishes, its last ``hold``
    characters are held back because they may be the beginning of a stop string.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int], stop: tuple[str, ...]
    ) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
        self.stop = stop
        self.text = ""
        self.hold = max((len(s) for s in stop), default=1) - 1
        self._sent_chars = 0
        self._unsent_tokens: list[int] = []

    def push(self, token_id: int) -> bool:
        """Add an output token (not EOS); True when its text completes a stop string."""
        self._unsent_tokens.append(token_id)
        delta = self.detokenizer.push(token_id)
        if not delta:
            return False
        previous = len(self.text)
        self.text += delta
        if self.stop:
            at = find_stop(self.text, self.stop, max(0, previous - self.hold))
            if at >= 0:
                self.text = self.text[:at]
                return True
        return False

    def take(self, finished: bool) -> tuple[str, list[int]]:
        """The text and token ids not yet sent; all the text once ``finished``."""
        end = len(self.text) if finished else max(self._sent_chars, len(self.text) - self.hold)
        delta = self.text[self._sent_chars : end]
        self._sent_chars = end
        tokens, self._unsent_tokens = self._unsent_tokens, []
        return delta, tokens


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        tokenizer: PreTrainedTokenizerBase,
        eos_ids: set[int],
        on_output: OutputCallback | None = None,
        prefix_scope: str = "",
    ) -> None:
        self.request_id = request_id
        self.prompt_ids = list(prompt_ids)
        self.token_ids = list(prompt_ids)  # prompt + output, the tokens the cache must hold
        self.params = params
        self.eos_ids = set() if params.ignore_eos else eos_ids
        self.on_output = on_output
        self.status = Status.WAITING
        self.slot: int | None = None
        self.num_computed = 0  # tokens of token_ids whose K/V are in the slot
        self.prefix_scope = prefix_scope  # shares KV prefixes with requests of this scope only
        self.num_preemptions = 0
        self.cancelled = False
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.times = RequestTimes(arrival=time.monotonic())
        self.generator = make_generator(params)
        self.spec = SpecState()
        self.output = OutputState(tokenizer, self.prompt_ids, params.stop)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids) :]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def append_token(self, token_id: int, now: float) -> None:
        """Add a sampled token; decide whether the request is done (EOS, stop string, length)."""
        self.token_ids.append(token_id)
        self.times.tokens.append(now)
        if self.times.first_token is None:
            self.times.first_token = now
        if token_id in self.eos_ids:
            self.finish_reason = "stop"
            return
        if self.output.push(token_id):
            self.finish_reason = "stop"
            return
        if len(self.output_ids) >= self.params.max_tokens:
            self.finish_reason = "length"

    def take_output(self) -> RequestOutput:
        """What is new since the last output, as one ``RequestOutput``."""
        done = self.finish_reason is not None
        delta, tokens = self.output.take(done)
        return RequestOutput(
            request_id=self.request_id,
            delta_text=delta,
            delta_token_ids=tokens,
            finished=done,
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(self.output_ids),
            times=self.times,
            error=self.error,
        )
