"""Batch answer generation through the engine's offline interface, partitioned and checkpointed.

The mined questions are split into fixed partitions (``partition_size`` clusters each, in ranking
order). Each partition's answers are written as one Parquet file under the run's work area in the
output store (``<profile>/work/<run_id>/gen/<nnnnn>.parquet``) as soon as it is done; a rerun (after
a crash, or an Airflow retry) finds the finished ones and generates only the rest. ``run_id`` is a
hash of the profile and the mined questions, so the same input always maps to the same work area.

An answer is flagged, and never published, when it is empty (``empty``), was cut off by
``max_tokens`` (``truncated``), or the engine reported an error (``error``).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from edge_index.store import ObjectNotFoundError, Store
from origin.config import DEFAULT_SYSTEM_PROMPT

if TYPE_CHECKING:
    import pyarrow as pa
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from origin.engine import Engine


@dataclass(frozen=True)
class GenerationConfig:
    model: str = "embedded"
    quantization: str = "int8"  # the nightly job's default: "int8", "bf16" or "none"
    max_tokens: int = 256
    partition_size: int = 64
    max_num_seqs: int = 32
    # short answers end with EOS instead of running into max_tokens (and get flagged)
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT

    def __post_init__(self) -> None:
        if self.quantization not in ("int8", "bf16", "none"):
            raise ValueError("quantization must be 'int8', 'bf16' or 'none'")
        if self.max_tokens < 1 or self.partition_size < 1 or self.max_num_seqs < 1:
            raise ValueError("max_tokens, partition_size and max_num_seqs must be at least 1")


@dataclass(frozen=True)
class Profile:
    """What an answer depends on; answers of different profiles never mix."""

    name: str
    inputs: dict[str, Any]


def make_profile(config: GenerationConfig, tokenizer: PreTrainedTokenizerBase) -> Profile:
    template = str(getattr(tokenizer, "chat_template", "") or "")
    inputs = {
        "model": config.model,
        "vocab_size": len(tokenizer),
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
        "system_prompt": config.system_prompt,
        "max_tokens": config.max_tokens,
        "temperature": 0.0,
        "quantization": config.quantization,
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:10]
    slug = "smollm2-135m" if config.model == "embedded" else config.model
    slug = re.sub(r"[^a-z0-9]+", "-", slug.lower().rsplit("/", 1)[-1]).strip("-")[:40] or "model"
    return Profile(f"{slug}-{digest}", inputs)


def run_id(profile: Profile, questions: Sequence[str]) -> str:
    digest = hashlib.sha256(profile.name.encode())
    for question in questions:
        digest.update(b"\0" + question.encode())
    return digest.hexdigest()[:16]


def work_prefix(profile: str, run: str) -> str:
    return f"{profile}/work/{run}"


def partition_path(profile: str, run: str, index: int) -> str:
    return f"{work_prefix(profile, run)}/gen/{index:05d}.parquet"


def partitions(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


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


def flag_of(text: str, finish_reason: str | None, error: str | None) -> str:
    if error:
        return "error"
    if not text.strip():
        return "empty"
    if finish_reason == "length":
        return "truncated"
    return ""


@dataclass
class GenerationReport:
    partitions: int = 0
    partitions_reused: int = 0
    answers: int = 0
    generated: int = 0
    tokens: int = 0
    seconds: float = 0.0
    flagged: dict[str, int] = field(default_factory=dict)
    sequential_sample: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        result = dict(self.__dict__)
        result["answers_per_s"] = round(self.generated / self.seconds, 3) if self.seconds else None
        result["tokens_per_s"] = round(self.tokens / self.seconds, 2) if self.seconds else None
        result["seconds"] = round(self.seconds, 2)
        return result


def make_engine(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: GenerationConfig
) -> Engine:
    from origin.engine import Engine, EngineConfig

    quantization = None if config.quantization == "none" else config.quantization
    return Engine(
        model,
        tokenizer,
        EngineConfig(
            max_num_seqs=config.max_num_seqs,
            token_budget=max(512, config.max_num_seqs),
            max_model_len=min(2048, 512 + config.max_tokens),
            quantization=quantization,
        ),
    )


def _messages(question: str, config: GenerationConfig) -> list[dict[str, str]]:
    from origin.generate import chat_messages

    return chat_messages(question, config.system_prompt)  # type: ignore[return-value]


def generate_partition(
    engine: Engine, keys: Sequence[str], questions: Sequence[str], config: GenerationConfig
) -> tuple[pa.Table, int]:
    """Answers for one partition (a Parquet-ready table) and the tokens generated."""
    import pyarrow as pa

    from origin.sampling import SamplingParams

    params = SamplingParams(max_tokens=config.max_tokens)
    prompts = [_messages(q, config) for q in questions]
    results = engine.generate_many(prompts, params, progress=False)  # type: ignore[arg-type]
    now = datetime.now(UTC).replace(microsecond=0)
    rows = [
        {
            "key": k,
            "question": q,
            "answer": r.text.strip(),
            "tokens": len(r.token_ids),
            "finish_reason": r.finish_reason,
            "flag": flag_of(r.text, r.finish_reason, r.error),
            "generated_at": now,
        }
        for k, q, r in zip(keys, questions, results, strict=True)
    ]
    tokens = sum(len(r.token_ids) for r in results)
    return pa.Table.from_pylist(rows, schema=answer_schema()), tokens


def generate_all(
    engine_factory: Callable[[], Engine],
    store: Store,
    profile: str,
    run: str,
    keys: Sequence[str],
    questions: Sequence[str],
    config: GenerationConfig,
    report: GenerationReport | None = None,
    only: Sequence[int] | None = None,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], GenerationReport]:
    """Answer every question, partition by partition, reusing finished partitions.

    ``only``: generate just these partition indexes (an Airflow mapped task does one each).
    Returns the rows of every finished partition in order (all of them unless ``only``).
    """
    import pyarrow.parquet as pq
    from tqdm import tqdm

    report = report or GenerationReport()
    key_parts = partitions(keys, config.partition_size)
    question_parts = partitions(questions, config.partition_size)
    report.partitions = len(key_parts)
    wanted = range(len(key_parts)) if only is None else only
    engine: Engine | None = None
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(questions), desc="generating", unit="answer", disable=not progress)
    for index in wanted:
        path = partition_path(profile, run, index)
        try:
            table = pq.read_table(io.BytesIO(store.get(path)))
            report.partitions_reused += 1
        except ObjectNotFoundError:
            engine = engine or engine_factory()
            started = time.perf_counter()
            table, tokens = generate_partition(
                engine, key_parts[index], question_parts[index], config
            )
            report.seconds += time.perf_counter() - started
            report.tokens += tokens
            report.generated += table.num_rows
            buffer = io.BytesIO()
            pq.write_table(table, buffer)
            store.put(path, buffer.getvalue())  # checkpoint: this partition is done
        part_rows = table.to_pylist()
        for row in part_rows:
            if row["flag"]:
                report.flagged[row["flag"]] = report.flagged.get(row["flag"], 0) + 1
        report.answers += len(part_rows)
        rows.extend(part_rows)
        bar.update(len(part_rows))
    bar.close()
    return rows, report


def sequential_baseline(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: Sequence[str],
    config: GenerationConfig,
) -> dict[str, Any]:
    """One-at-a-time transformers ``generate`` on the same questions (greedy, same max_tokens)."""
    import torch

    from origin.generate import encode_chat, eos_token_ids

    eos = sorted(eos_token_ids(model, tokenizer))
    tokens = 0
    started = time.perf_counter()
    for question in questions:
        ids = encode_chat(tokenizer, _messages(question, config))  # type: ignore[arg-type]
        input_ids = torch.tensor([ids], device=model.device)
        with torch.inference_mode():
            out = model.generate(  # type: ignore[operator]
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=config.max_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
        tokens += int(out.shape[1] - input_ids.shape[1])
    seconds = time.perf_counter() - started
    return {
        "questions": len(questions),
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "answers_per_s": round(len(questions) / seconds, 3) if seconds else None,
        "tokens_per_s": round(tokens / seconds, 2) if seconds else None,
        "system": "transformers generate, one question at a time, fp32",
    }
