"""Batch answer generation through the engine's offline interface, partitioned and checkpointed.

The mined questions are split into fixed partitions (``partition_size`` clusters each, in ranking
order). Each partition's answers are written as one Parquet file in the run's work area
(``workarea.py``) as soon as it is done; a rerun (after a crash, or an Airflow retry) finds the
finished ones and generates only the rest.

An answer is flagged, and never published, when the engine reported an error (``error``) or it
is degenerate (``edge_index.answers.answer_problem``): empty (``empty``), cut off by
``max_tokens`` (``truncated``), a loop (``repetitive``), only a refusal (``refusal``), or in
another language or script than the question (``language``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from edge_index.answers import answer_problem
from edge_index.store import ObjectNotFoundError
from origin.config import EngineSettings
from origin.precision import EngineQuantization
from precompute.workarea import WorkArea

if TYPE_CHECKING:
    import pyarrow as pa
    from transformers import PreTrainedTokenizerBase

    from origin.engine import Engine
    from origin.runtime import LoadedModel

# a mined question's prompt (system prompt, chat template, question) fits in this many tokens
PROMPT_TOKENS = 512


@dataclass(frozen=True)
class Profile:
    """What an answer depends on; answers of different profiles never mix."""

    name: str
    inputs: dict[str, Any]


def make_profile(
    settings: EngineSettings, quantization: EngineQuantization, tokenizer: PreTrainedTokenizerBase
) -> Profile:
    template = str(getattr(tokenizer, "chat_template", "") or "")
    inputs = {
        "model": settings.model,
        "vocab_size": len(tokenizer),
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
        "system_prompt": settings.system_prompt,
        "max_tokens": settings.max_tokens,
        "temperature": 0.0,
        "quantization": quantization,
    }
    if settings.dtype not in ("auto", "float32"):  # the weights quantized from (float32 if auto)
        inputs["dtype"] = settings.dtype
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:10]
    slug = "smollm2-135m" if settings.model == "embedded" else settings.model
    slug = re.sub(r"[^a-z0-9]+", "-", slug.lower().rsplit("/", 1)[-1]).strip("-")[:40] or "model"
    return Profile(f"{slug}-{digest}", inputs)


def run_id(profile: Profile, questions: Sequence[str]) -> str:
    digest = hashlib.sha256(profile.name.encode())
    for question in questions:
        digest.update(b"\0" + question.encode())
    return digest.hexdigest()[:16]


def partitions(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def nightly_engine(
    settings: EngineSettings, quantization: EngineQuantization, model: LoadedModel | None = None
) -> Engine:
    """The engine the nightly job answers with: the origin's, sized for short questions, greedy,
    without speculation (it pays only at batch 1-2), in the run's precision — quantized from
    float32 weights on every device unless ``EDGEQA_DTYPE`` says otherwise."""
    from origin.runtime import build_engine

    nightly = settings.replace(
        dtype="float32" if settings.dtype == "auto" else settings.dtype,
        quantization=quantization,
        speculative="none",
        max_model_len=min(settings.max_model_len, PROMPT_TOKENS + settings.max_tokens),
    )
    return build_engine(nightly, model)


def answer_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.string()),
            ("question", pa.string()),
            ("answer", pa.string()),
            ("tokens", pa.int32()),
            ("finish_reason", pa.string()),
            ("flag", pa.string()),
            ("generated_at", pa.timestamp("s", tz="UTC")),
        ]
    )


def flag_of(question: str, text: str, finish_reason: str | None, error: str | None) -> str:
    if error:
        return "error"
    return answer_problem(question, text, finish_reason) or ""


@dataclass
class GenerationReport:
    partitions: int = 0
    partitions_reused: int = 0
    answers: int = 0
    generated: int = 0
    tokens: int = 0
    seconds: float = 0.0
    flagged: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        result = dict(self.__dict__)
        result["answers_per_s"] = round(self.generated / self.seconds, 3) if self.seconds else None
        result["tokens_per_s"] = round(self.tokens / self.seconds, 2) if self.seconds else None
        result["seconds"] = round(self.seconds, 2)
        return result

    def count_flags(self, rows: Sequence[dict[str, Any]]) -> None:
        self.answers += len(rows)
        for row in rows:
            if row["flag"]:
                self.flagged[row["flag"]] = self.flagged.get(row["flag"], 0) + 1


def generate_partition(
    engine: Engine,
    keys: Sequence[str],
    questions: Sequence[str],
    max_tokens: int,
    system_prompt: str | None,
    generated_at: datetime,
) -> tuple[pa.Table, int]:
    """Answers for one partition (a Parquet-ready table) and the tokens generated."""
    import pyarrow as pa

    from origin.generate import chat_messages
    from origin.sampling import SamplingParams

    params = SamplingParams(max_tokens=max_tokens)
    prompts = [chat_messages(q, system_prompt) for q in questions]
    results = engine.generate_many(prompts, params, progress=False)
    rows = [
        {
            "key": k,
            "question": q,
            "answer": r.text.strip(),
            "tokens": len(r.token_ids),
            "finish_reason": r.finish_reason,
            "flag": flag_of(q, r.text, r.finish_reason, r.error),
            "generated_at": generated_at.replace(microsecond=0),
        }
        for k, q, r in zip(keys, questions, results, strict=True)
    ]
    tokens = sum(len(r.token_ids) for r in results)
    return pa.Table.from_pylist(rows, schema=answer_schema()), tokens


def generate_all(
    engine_factory: Callable[[], Engine],
    work: WorkArea,
    keys: Sequence[str],
    questions: Sequence[str],
    settings: EngineSettings,
    partition_size: int,
    generated_at: datetime | None = None,
    only: Sequence[int] | None = None,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], GenerationReport]:
    """Answer every question (``settings``: max_tokens, system prompt), partition by partition,
    reusing finished partitions; ``only``: just these partition indexes (an Airflow mapped task
    does one each). ``generated_at``: the instant the answers are dated (the run's "as of", so
    that re-running a night builds the same release; default now). Returns the rows of the
    partitions done, in order, and the report."""
    from tqdm import tqdm

    report = GenerationReport()
    key_parts = partitions(keys, partition_size)
    question_parts = partitions(questions, partition_size)
    report.partitions = len(key_parts)
    engine: Engine | None = None
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(questions), desc="generating", unit="answer", disable=not progress)
    for index in range(len(key_parts)) if only is None else only:
        path = work.partition(index)
        try:
            table = work.get_table(path)
            report.partitions_reused += 1
        except ObjectNotFoundError:
            engine = engine or engine_factory()
            started = time.perf_counter()
            table, tokens = generate_partition(
                engine,
                key_parts[index],
                question_parts[index],
                settings.max_tokens,
                settings.system_prompt,
                generated_at or datetime.now(UTC),
            )
            report.seconds += time.perf_counter() - started
            report.tokens += tokens
            report.generated += table.num_rows
            work.put_table(path, table)  # checkpoint: this partition is done
        part_rows = table.to_pylist()
        report.count_flags(part_rows)
        rows.extend(part_rows)
        bar.update(len(part_rows))
    bar.close()
    return rows, report


def read_partitions(work: WorkArea, count: int) -> list[dict[str, Any]]:
    """Every generated row of the run, in order; raises ``ObjectNotFoundError`` naming a
    partition not generated yet."""
    rows: list[dict[str, Any]] = []
    for index in range(count):
        rows.extend(work.get_table(work.partition(index)).to_pylist())
    return rows
