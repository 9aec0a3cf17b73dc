"""The offline front end: generate for a list of prompts, keeping the batch full.

It owns the prompts' tokens (``origin.chat.prompt_ids``) and hands the core token ids; it also
seeds the speculative suffix index with known answers as text (``seed_answers``).
Used by the nightly batch job and the benchmarks. With the engine's loop running, the requests
join it; otherwise this thread steps the engine itself until every request has finished.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from origin.chat import Prompt, prompt_ids
from origin.engine.core import Engine
from origin.engine.request import RequestOutput
from origin.sampling import SamplingParams


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
    # the tokens the engine generated, an end-of-sequence token included (``token_ids`` are the
    # text's): what an OpenAI-compatible server reports as ``usage.completion_tokens``
    completion_tokens: int = 0


def generate_many(
    engine: Engine,
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
                completion_tokens=output.completion_tokens,
            )
            bar.update(1)
            if len(results) == len(prompts):
                done.set()

    encoded = [prompt_ids(engine.tokenizer, prompt) for prompt in prompts]  # before any is queued
    ids = []
    for prompt, p in zip(encoded, per_prompt, strict=True):
        request_id = engine.new_request_id("batch")
        texts[request_id], tokens[request_id] = [], []
        ids.append(engine.add_request(prompt, p, collect, request_id).request_id)
    if not prompts:
        done.set()
    if engine.loop_running:
        done.wait()
    else:
        while not done.is_set():
            engine.step()
    bar.close()
    return [results[i] for i in ids]


def seed_answers(
    engine: Engine, answers: Sequence[str], questions: Sequence[Prompt] | None = None
) -> int:
    """Add known answers (a release's, say) to ``engine``'s suffix index; returns how many.

    With ``questions``, later requests similar to one of them follow its answer first."""
    tokenizer = engine.tokenizer
    answer_ids = [tokenizer.encode(text, add_special_tokens=False) for text in answers]
    prompts = None if questions is None else [prompt_ids(tokenizer, q) for q in questions]
    return engine.seed_answers(answer_ids, prompts)
