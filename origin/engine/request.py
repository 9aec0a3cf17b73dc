"""A request inside the engine: its tokens, its slot, its timings and what it has sent."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from origin.detokenizer import IncrementalDetokenizer
from origin.sampling import SamplingParams, find_stop

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


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        tokenizer: PreTrainedTokenizerBase,
        eos_ids: set[int],
        on_output: OutputCallback | None = None,
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
        self.num_preemptions = 0
        self.spec_ema = 2.0  # recent mean of accepted tokens per draft (speculative back-off)
        self.spec_cooldown = 0  # steps left without speculation
        self.spec_neighbors: list[int] | None = None  # similar earlier answers (suffix proposer)
        self.cancelled = False
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.times = RequestTimes(arrival=time.monotonic())
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.detokenizer = IncrementalDetokenizer(tokenizer, self.prompt_ids)
        self.text = ""
        self._sent_chars = 0
        self._unsent_tokens: list[int] = []
        self._hold = max((len(s) for s in params.stop), default=1) - 1

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
        self._unsent_tokens.append(token_id)
        delta = self.detokenizer.push(token_id)
        if delta:
            previous = len(self.text)
            self.text += delta
            if self.params.stop:
                at = find_stop(self.text, self.params.stop, max(0, previous - self._hold))
                if at >= 0:
                    self.text = self.text[:at]
                    self.finish_reason = "stop"
                    return
        if len(self.output_ids) >= self.params.max_tokens:
            self.finish_reason = "length"

    def take_output(self) -> RequestOutput:
        """The text and tokens not yet sent; text that may begin a stop string is held back."""
        done = self.finish_reason is not None
        end = len(self.text) if done else max(self._sent_chars, len(self.text) - self._hold)
        delta = self.text[self._sent_chars : end]
        self._sent_chars = end
        tokens, self._unsent_tokens = self._unsent_tokens, []
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
