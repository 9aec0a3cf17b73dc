"""Batch answer generation through the engine's offline interface, partitioned and checkpointed.

The mined questions are split into fixed partitions (``partition_size`` clusters each, in ranking
order). Each partition's answers are written as one Parquet file in the run's work area
(``workarea.py``) as soon as it is done; a rerun (after a crash, or an Airflow retry) finds the
finished ones and generates only the rest.

Reuse: when the parent release (the one current when the run mined, of the same profile: the
same model, weights, prompt and settings) already answers a cluster — its canonical phrasing, or
else another of its phrasings, which that answer was served for — with an answer younger than
``reuse_ttl_fraction`` of the TTL that passes today's checks, that answer and its
``generated_at`` are taken instead of generating one (``reusable_answers``; ``reused_from`` names
the release). So is an answer the parent's run generated and flagged (but for an engine error):
the same profile, greedy, would give it back. Only the rest reach the engine, which is not even
built when nothing is left.

An answer is flagged, and never published, when the engine reported an error (``error``) or it
is degenerate (``policy.answers.answer_problem``): empty (``empty``), cut off by
``max_tokens`` (``truncated``), a loop (``repetitive``), only a refusal (``refusal``), or in
another language or script than the question (``language``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from base.errors import EdgeQAError
from base.languages import DEFAULT_LANGUAGE
from base.store import ObjectNotFoundError
from origin.config import EngineSettings
from origin.precision import EngineQuantization
from policy.answers import answer_problem
from precompute.workarea import WorkArea

if TYPE_CHECKING:
    import pyarrow as pa
    from transformers import PreTrainedTokenizerBase

    from origin.engine import Engine
    from origin.runtime import LoadedModel
    from precompute.questions import HotQuestion

# a mined question's prompt (system prompt, chat template, question) fits in this many tokens
PROMPT_TOKENS = 512


@dataclass(frozen=True)
class Profile:
    """What an answer depends on; answers of different profiles never mix."""

    name: str
    inputs: dict[str, Any]


def make_profile(
    settings: EngineSettings,
    quantization: EngineQuantization,
    tokenizer: PreTrainedTokenizerBase | None,
    language: str = DEFAULT_LANGUAGE,
    checkpoint: Mapping[str, str] | None = None,
) -> Profile:
    """The profile of ``language``'s releases: the model, its prompt and settings, the language
    and the embedder its questions are matched with (``<model>-<language>-<digest>``). The
    model is the project engine's (``tokenizer``: its vocabulary and chat template), or another
    engine's ``checkpoint`` (``fleet.llm.checkpoint``: vLLM's, which names its own)."""
    inputs: dict[str, Any] = {
        "language": language,
        "embedder": settings.embedders[language],
        "system_prompt": settings.system_prompt,
        "max_tokens": settings.max_tokens,
        "temperature": 0.0,
    }
    if checkpoint is not None:
        inputs.update(checkpoint)
        model = checkpoint["model"]
    else:
        assert tokenizer is not None, "the project engine's profile names its tokenizer"
        template = str(getattr(tokenizer, "chat_template", "") or "")
        inputs["model"] = model = settings.model
        inputs["vocab_size"] = len(tokenizer)
        inputs["chat_template_sha256"] = hashlib.sha256(template.encode()).hexdigest()
        inputs["quantization"] = quantization
        if settings.dtype not in ("auto", "float32"):  # quantized from (float32 if auto)
            inputs["dtype"] = settings.dtype
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:10]
    slug = "smollm2-135m" if model == "embedded" else model
    slug = re.sub(r"[^a-z0-9]+", "-", slug.lower().rsplit("/", 1)[-1]).strip("-")[:40] or "model"
    return Profile(f"{slug}-{language}-{digest}", inputs)


class RunDigest:
    """``run_id`` taken a question at a time (``add``), so the questions are read once, beside
    what else reads them."""

    def __init__(self, profile: Profile) -> None:
        self._digest = hashlib.sha256(profile.name.encode())

    def add(self, question: str) -> None:
        self._digest.update(b"\0" + question.encode())

    def run_id(self, parent: str | None = None, curated: str = "") -> str:
        digest = self._digest.copy()
        if parent:
            digest.update(b"\1" + parent.encode())
        if curated:
            digest.update(b"\2" + curated.encode())
        return digest.hexdigest()[:16]


def run_id(
    profile: Profile, questions: Iterable[str], parent: str | None = None, curated: str = ""
) -> str:
    """The run's work area: the profile, the mined questions, the release they build on (its
    evidence and answers are carried forward, so the next night is another run) and the curated
    answers file's digest (``curated.py``)."""
    digest = RunDigest(profile)
    for question in questions:
        digest.add(question)
    return digest.run_id(parent, curated)


def partitions(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def nightly_engine(
    settings: EngineSettings, quantization: EngineQuantization, model: LoadedModel | None = None
) -> Engine:
    """The engine the nightly job answers with: the origin's, sized for short questions, greedy,
    without speculation (it pays only at batch 1-2), in the run's precision — quantized from
    float32 weights unless ``EDGEQA_DTYPE`` names another dtype, which the release's profile
    then names too. On CUDA the dtype must be named (``bfloat16``; ``float16`` for int8, as
    ``origin.runtime.load_dtype`` says): the weights are loaded in it straight onto the device
    (a 7B in fp32 fits neither an A10G nor the host), and ``auto`` would leave the profile
    saying float32 for answers made from bf16 weights."""
    from origin.model import resolve_device
    from origin.runtime import build_engine, load_dtype

    on_cuda = model is None and resolve_device(settings.device).startswith("cuda")
    if on_cuda and settings.dtype == "auto":
        serving = load_dtype(settings.replace(quantization=quantization), "cuda")
        raise EdgeQAError(
            f"the nightly engine on CUDA needs EDGEQA_DTYPE named ({serving} for {quantization}):"
            " its weights are loaded in it on the device, and the release's profile names it"
        )
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
            ("reused_from", pa.string()),  # the release the answer was taken from; null: generated
        ]
    )


def flag_of(question: str, text: str, finish_reason: str | None, error: str | None) -> str:
    if error:
        return "error"
    # links are judged where an answer is published (``build.py``) or cached, under the
    # deployment's EDGEQA_ALLOW_ANSWER_LINKS: a partition stays good whichever it is
    return answer_problem(question, text, finish_reason, allow_links=True) or ""


@dataclass
class GenerationReport:
    partitions: int = 0
    partitions_reused: int = 0
    answers: int = 0
    generated: int = 0
    reused: int = 0  # taken from the parent release instead of generated
    tokens: int = 0
    seconds: float = 0.0
    flagged: dict[str, int] = field(default_factory=dict)
    ran_on: str = "this process"  # or the fleet (``fleet.Fleet.where``)
    redone: list[int] = field(default_factory=list)  # partitions started again (a lost worker)

    def as_dict(self) -> dict[str, Any]:
        result = dict(self.__dict__)
        result["answers_per_s"] = round(self.generated / self.seconds, 3) if self.seconds else None
        result["tokens_per_s"] = round(self.tokens / self.seconds, 2) if self.seconds else None
        result["seconds"] = round(self.seconds, 2)
        # what generating the reused answers would have cost at this run's measured seconds per
        # answer (None when this run generated none: nothing was measured)
        per_answer = self.seconds / self.generated if self.generated else None
        result["seconds_saved"] = round(self.reused * per_answer, 2) if per_answer else None
        return result

    def count_flags(self, rows: Sequence[dict[str, Any]]) -> None:
        self.answers += len(rows)
        for row in rows:
            if row["flag"]:
                self.flagged[row["flag"]] = self.flagged.get(row["flag"], 0) + 1


def reused_row(
    cluster: HotQuestion,
    answer: str,
    generated_at: datetime,
    reused_from: str,
    finish_reason: str | None = "stop",
    flag: str = "",
) -> dict[str, Any]:
    """A row (``answer_schema``) answering ``cluster`` with an answer taken, not generated, in
    this run: from the parent release, or the operator's (``curated.py``)."""
    return {
        "key": cluster.key,
        "question": cluster.question,
        "answer": answer,
        "tokens": 0,  # none generated for it in this run
        "finish_reason": finish_reason,
        "flag": flag,
        "generated_at": generated_at,
        "reused_from": reused_from,
    }


def left_out(row: Mapping[str, Any]) -> bool:
    """Whether a partition row's answer stayed out of its release and may stand for it again:
    flagged at generation (never an engine ``error``), or left out at build for sending its
    reader elsewhere (``link``, judged where answers are published)."""
    if row.get("flag"):
        return bool(row["flag"] != "error")
    return answer_problem(row["question"], row["answer"], row.get("finish_reason")) == "link"


def reusable_answers(
    hot: Iterable[HotQuestion],
    published: Iterable[Mapping[str, Any]],
    parent: str,
    now: datetime,
    max_age: timedelta,
    flagged: Iterable[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """``ParentAnswers(...).rows(hot)``: the rows (``answer_schema``) of the clusters the parent
    already answered."""
    return ParentAnswers(published, parent, now, max_age, flagged).rows(hot)


class ParentAnswers:
    """The parent release's answers a run may take instead of generating, looked up by key
    (``published``: the release's rows; ``flagged``: its run's partition rows), each at most
    ``max_age`` old at ``now``. ``rows(hot)`` gives, for each cluster, the parent's answer to
    the canonical phrasing, or else to the first other phrasing it has, when it passes today's
    checks on today's question; or else the answer its run generated for the same canonical
    phrasing and flagged, flag and all, or left out at build for sending its reader elsewhere
    (``link``, judged where answers are published), so it stays out of the release without
    being generated again: greedy decoding with the same profile gives it back. An engine
    ``error`` is never reused."""

    def __init__(
        self,
        published: Iterable[Mapping[str, Any]],
        parent: str,
        now: datetime,
        max_age: timedelta,
        flagged: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        self.parent, self.now, self.max_age = parent, now, max_age
        self.by_key = {row["key"]: row for row in published}
        self.unfit = {
            row["key"]: row
            for row in flagged
            if now - row["generated_at"] <= max_age and left_out(row)
        }

    def rows(self, hot: Iterable[HotQuestion]) -> list[dict[str, Any]]:
        by_key, unfit, now, max_age = self.by_key, self.unfit, self.now, self.max_age
        rows = []
        for cluster in hot:
            found = next((by_key[p.key] for p in cluster.phrasings if p.key in by_key), None)
            flag = ""
            if found is not None and (
                now - found["generated_at"] > max_age
                or answer_problem(cluster.question, found["answer"], None, allow_links=True)
            ):
                found = None
            if found is None and cluster.key in unfit:
                found, flag = unfit[cluster.key], unfit[cluster.key]["flag"]
            if found is None:
                continue
            rows.append(
                reused_row(
                    cluster,
                    found["answer"],
                    found["generated_at"],
                    self.parent,
                    found.get("finish_reason"),
                    flag,
                )
            )
        return rows


def answered_row(
    key: str,
    question: str,
    text: str,
    tokens: int,
    finish_reason: str | None,
    error: str | None,
    generated_at: datetime,
) -> dict[str, Any]:
    """A generated answer's row (``answer_schema``), flagged by the answer policy
    (``flag_of``) whichever engine generated it: this process's or one Ray Data's LLM API
    drives (``fleet/llm.py``)."""
    return {
        "key": key,
        "question": question,
        "answer": text.strip(),
        "tokens": tokens,
        "finish_reason": finish_reason,
        "flag": flag_of(question, text, finish_reason, error),
        "generated_at": generated_at.replace(microsecond=0),
        "reused_from": None,
    }


def generate_partition(
    engine_factory: Callable[[], Engine],
    keys: Sequence[str],
    questions: Sequence[str],
    max_tokens: int,
    system_prompt: str | None,
    generated_at: datetime,
    reused: Mapping[str, dict[str, Any]] | None = None,
) -> tuple[pa.Table, int]:
    """Answers for one partition (a Parquet-ready table) and the tokens generated: the
    ``reused`` rows (by key) as they are, the rest generated (the engine built only then)."""
    import pyarrow as pa

    from origin.chat import chat_messages
    from origin.engine.offline import generate_many
    from origin.sampling import SamplingParams

    reused = reused or {}
    todo = [(k, q) for k, q in zip(keys, questions, strict=True) if k not in reused]
    results = []
    if todo:
        prompts = [chat_messages(q, system_prompt) for _, q in todo]
        params = SamplingParams(max_tokens=max_tokens)
        results = generate_many(engine_factory(), prompts, params, progress=False)
    generated = {
        k: answered_row(k, q, r.text, r.completion_tokens, r.finish_reason, r.error, generated_at)
        for (k, q), r in zip(todo, results, strict=True)
    }
    rows = [reused[k] if k in reused else generated[k] for k in keys]
    tokens = sum(r.completion_tokens for r in results)
    return pa.Table.from_pylist(rows, schema=answer_schema()), tokens


def generate_all(
    engine_factory: Callable[[], Engine],
    work: WorkArea,
    keys: Sequence[str],
    questions: Sequence[str],
    settings: EngineSettings,
    partition_size: int,
    generated_at: datetime | None = None,
    progress: bool = True,
    reused: Mapping[str, dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], GenerationReport]:
    """Answer every question (``settings``: max_tokens, system prompt), partition by partition,
    in this process with one engine, reusing finished partitions (the nightly job's path is
    ``fleet.generation.generate_on_fleet``: the same partitions as a Ray job).
    ``generated_at``: the instant the answers are dated (the run's "as of", so that re-running a
    night builds the same release; default now). ``reused``: answers taken as they are instead
    of generated, by key (``reusable_answers``). Returns the rows of the partitions done, in
    order, and the report."""
    from tqdm import tqdm

    report = GenerationReport()
    key_parts = partitions(keys, partition_size)
    question_parts = partitions(questions, partition_size)
    report.partitions = len(key_parts)
    engine: Engine | None = None

    def built() -> Engine:
        nonlocal engine
        engine = engine or engine_factory()
        return engine

    reused = reused or {}
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(questions), desc="generating", unit="answer", disable=not progress)
    for index in range(len(key_parts)):
        path = work.partition(index)
        try:
            table = work.get_table(path)
            report.partitions_reused += 1
        except ObjectNotFoundError:
            if any(k not in reused for k in key_parts[index]):
                built()  # not timed: the answers are
            started = time.perf_counter()
            table, tokens = generate_partition(
                built,
                key_parts[index],
                question_parts[index],
                settings.max_tokens,
                settings.system_prompt,
                generated_at or datetime.now(UTC),
                reused,
            )
            taken = sum(1 for k in key_parts[index] if k in reused)
            if taken < table.num_rows:  # the seconds measured are the generated answers'
                report.seconds += time.perf_counter() - started
            report.tokens += tokens
            report.reused += taken
            report.generated += table.num_rows - taken
            work.put_table(path, table)  # checkpoint: this partition is done
        part_rows = table.to_pylist()
        report.count_flags(part_rows)
        rows.extend(part_rows)
        bar.update(len(part_rows))
    bar.close()
    return rows, report


def read_partitions(work: WorkArea, count: int | None = None) -> list[dict[str, Any]]:
    """Every generated row of the run, in order; raises ``ObjectNotFoundError`` naming a
    partition not generated yet. ``count`` None: the partitions there are."""
    paths = (
        [work.partition(index) for index in range(count)]
        if count is not None
        else work.store.list(work.partition(0).rsplit("/", 1)[0])
    )
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows.extend(work.get_table(path).to_pylist())
    return rows
