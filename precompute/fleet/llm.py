"""The answers on an engine Ray Data's LLM API drives (``ray.data.llm``): vLLM on the fleet's GPUs
(``vLLMEngineProcessorConfig``), or an OpenAI-compatible server (``HttpRequestProcessorConfig``:
the project's origin on a laptop or in CI), chosen by ``EDGEQA_GENERATION_ENGINE`` (``edgeqa``,
the default, is ``generation.py``: the project's engine in each actor).

The partitions are the in-process engine's, answered in one Ray Data run (the engines start
once): ``partition numbers -> their questions, read by the workers from the work area -> the
processor -> each batch of answers kept in the work area by a worker as it comes`` (a piece per
partition: the checkpoint, ``<run>/pieces/<partition>/``, kept with the run's work area), then
each partition written from its pieces (``gen/<partition>.parquet``) by a worker. The driver
holds partition numbers and a row of counts per batch, never a question or an answer, and
nothing waits on a shuffle. A run that
fails keeps its pieces: the retry asks only the questions no piece answers, and writes the
partitions not written. Every row takes the same answer policy as the in-process engine's
(``generate.answered_row``: empty, truncated, repetitive, refusal, language, an engine error);
reused answers are taken as they are. An engine error is not kept in a piece (it is asked again
on a retry); a question no piece answers is written as an ``error`` answer, flagged, unless the
partition's every answer was one (a server refusing every request): then it is not written and
the run fails in one line.

vLLM needs no tokenizer here: Ray's processor applies the checkpoint's chat template and
tokenizes on CPU workers, the engine stage runs one vLLM engine per GPU (``concurrency``: up to
the fleet's workers; Ray's autoscaler brings the GPUs), greedy, ``max_tokens`` from the settings,
prefix caching on (every prompt starts with the system prompt). Its weights: an INT8 W8A8
checkpoint (compressed-tensors: what vLLM runs as INT8 GEMMs on Ampere) or an fp16 one, checked
against the checkpoint's ``config.json`` before anything starts (``checkpoint``); the release's
profile names the checkpoint (its config and chat template's digest), so a vLLM release never
mixes with the project engine's. vLLM itself is the fleet image's (the Dockerfile's ``gpu``
target), never installed by ``make``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from base.errors import EdgeQAError
from precompute.fleet import Fleet, FleetError, last_line, reserve_gpus, worker_name
from precompute.fleet.generation_job import Generated, Job, LLMEngine

if TYPE_CHECKING:
    import pyarrow as pa

    from origin.config import EngineSettings
    from origin.precision import EngineQuantization
    from origin.runtime import LoadedModel
    from precompute.config import PrecomputeSettings
    from precompute.generate import Profile
    from precompute.workarea import WorkArea

# a request the server refused for now (429, 503) or never answered is sent again this often,
# waiting 1, 2, 4 ... s between (the HTTP processor's backoff)
HTTP_RETRIES = 6
# rows an HTTP actor sends one after another per batch; vLLM's batches are its engine's
HTTP_BATCH = 8
VLLM_BATCH = 64
# what vLLM's engine stage may hold per GPU: sequences decoding at once, and the memory it takes
VLLM_MAX_NUM_SEQS = 256
VLLM_GPU_MEMORY = 0.90
# a sharded checkpoint's index of its weight files, digested into the profile when there is one
WEIGHTS_INDEX = "model.safetensors.index.json"
# a question's answer as the processor hands it to the partition's writer
ANSWER_FIELDS = ("partition", "position", "text", "tokens", "finish_reason", "error")


def run_profile(
    settings: PrecomputeSettings,
    quantization: EngineQuantization,
    model: LoadedModel | None,
    language: str,
) -> Profile:
    """The profile a run's answers belong to: the project engine's (the model's tokenizer, the
    run's precision: ``generate.make_profile``), which an HTTP server serving the same model at
    the same precision shares; or, for vLLM, its checkpoint's (``checkpoint``)."""
    from origin.model import load_tokenizer
    from precompute.generate import make_profile

    if settings.generation_engine == "vllm":
        found = checkpoint(settings.vllm_model, settings.vllm_quantization)
        return make_profile(settings, quantization, None, language, found)
    tokenizer = model[1] if model else load_tokenizer(settings.model, settings.cache_dir)
    return make_profile(settings, quantization, tokenizer, language)


def checkpoint(source: str, quantization: str) -> dict[str, str]:
    """What a release's profile says of vLLM's checkpoint ``source`` (``s3://…`` or a folder):
    its name, weights and the digest of its ``config.json``, ``tokenizer_config.json`` (the
    chat template) and, sharded, its weights' index; ``EdgeQAError`` when they are missing or
    the weights are not ``quantization``'s (``w8a8``: an int8 compressed-tensors checkpoint;
    ``fp16``: none)."""
    from base.store import ObjectNotFoundError, StoreError, open_store

    try:
        store = open_store(source)
        names = ("config.json", "tokenizer_config.json")
        files = {name: store.get(name, 1 << 22) for name in names}
        config = json.loads(files["config.json"])
        try:  # which weight files, of what sizes: a checkpoint quantized again differs there
            files[WEIGHTS_INDEX] = store.get(WEIGHTS_INDEX, 1 << 26)
        except ObjectNotFoundError:  # one weights file: its config and tokenizer say it
            pass
    except (StoreError, OSError, ValueError) as error:
        raise EdgeQAError(
            f"EDGEQA_VLLM_MODEL {source}: no readable config.json and tokenizer_config.json "
            f"({error})"
        ) from None
    quantized = config.get("quantization_config") or {}
    method = str(quantized.get("quant_method", "")) if isinstance(quantized, dict) else ""
    if quantization == "w8a8" and not _int8_w8a8(quantized):
        raise EdgeQAError(
            f"EDGEQA_VLLM_MODEL {source} is not an INT8 W8A8 checkpoint (config.json's "
            f"quantization_config: {method or 'none'}): quantize it with llm-compressor "
            "(W8A8, compressed-tensors), or set EDGEQA_VLLM_QUANTIZATION=fp16"
        )
    if quantization == "fp16" and method:
        raise EdgeQAError(
            f"EDGEQA_VLLM_MODEL {source} is quantized ({method}): EDGEQA_VLLM_QUANTIZATION=fp16 "
            "serves an unquantized checkpoint"
        )
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name] + b"\0")
    return {
        "engine": "vllm",
        "model": source.rstrip("/"),
        "quantization": quantization,
        "checkpoint_sha256": digest.hexdigest(),
    }


def _int8_w8a8(quantized: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's ``quantization_config`` is compressed-tensors with 8-bit integer
    weights and activations (what llm-compressor's W8A8 writes)."""
    if not isinstance(quantized, Mapping) or quantized.get("quant_method") != "compressed-tensors":
        return False
    groups = quantized.get("config_groups") or {}
    if not isinstance(groups, Mapping) or not groups:
        return False
    for group in groups.values():
        weights = (group or {}).get("weights") or {}
        inputs = (group or {}).get("input_activations") or {}
        for part in (weights, inputs):
            if part.get("num_bits") != 8 or part.get("type", "int") != "int":
                return False
    return True


def processor_config(llm: LLMEngine, settings: EngineSettings, fleet: Fleet) -> Any:
    """Ray Data's processor config for ``llm`` on ``fleet``: what the run would run."""
    from ray.data.llm import HttpRequestProcessorConfig, vLLMEngineProcessorConfig

    from precompute.generate import PROMPT_TOKENS

    workers = max(1, fleet.workers)
    if llm.engine == "vllm":
        return vLLMEngineProcessorConfig(
            model_source=llm.model,
            engine_kwargs={
                "dtype": "float16",  # A10G/L4 (Ampere/Ada): fp16 activations, W8A8's too
                "max_model_len": PROMPT_TOKENS + settings.max_tokens,
                "max_num_seqs": VLLM_MAX_NUM_SEQS,
                "enable_prefix_caching": True,  # every prompt opens with the system prompt
                "gpu_memory_utilization": VLLM_GPU_MEMORY,
                "tensor_parallel_size": 1,  # one engine per GPU, as many as the fleet has
                "seed": 0,
            },
            concurrency=(1, workers),  # the autoscaler brings the GPUs
            batch_size=VLLM_BATCH,
            # a row vLLM fails is an "error" answer, flagged and never published
            should_continue_on_error=True,
        )
    headers = {"Authorization": f"Bearer {llm.api_key}"} if llm.api_key else None
    return HttpRequestProcessorConfig(
        url=f"{llm.url}/v1/chat/completions",
        headers=headers,
        batch_size=HTTP_BATCH,
        concurrency=workers,
        max_retries=HTTP_RETRIES,
        base_retry_wait_time_in_s=1,
        # sending is waiting on the server: a fraction of a CPU slot each (a local Ray's slots
        # are the stages' that read and write the partitions)
        http_request_stage={"concurrency": workers, "num_cpus": 0.25},
    )


def request_row(llm: LLMEngine, settings: EngineSettings, row: Mapping[str, Any]) -> dict[str, Any]:
    """The processor's input row for a question (``row``: its partition, position, key,
    question): greedy, ``max_tokens`` long, in the chat every answer is generated from."""
    from origin.chat import chat_messages

    messages = chat_messages(row["question"], settings.system_prompt)
    carried = {k: row[k] for k in ("partition", "position", "key", "question")}
    if llm.engine == "vllm":
        params = {"temperature": 0.0, "max_tokens": settings.max_tokens}
        return {**carried, "messages": messages, "sampling_params": params}
    payload = {
        "model": llm.model,
        "messages": messages,
        "temperature": 0.0,
        "max_tokens": settings.max_tokens,
        "stream": False,
    }
    return {**carried, "payload": payload}


def answer_row(llm: LLMEngine, max_tokens: int, row: Mapping[str, Any]) -> dict[str, Any]:
    """What the processor gave for a question, as the writer takes it: the text, the tokens,
    why it stopped, or the error (a row vLLM failed; a server's error body)."""
    carried = {k: row[k] for k in ("partition", "position")}
    failed = str(row.get("__inference_error__") or "")
    if failed:  # a row vLLM failed: it passed by the postprocess
        return {**carried, "text": "", "tokens": 0, "finish_reason": "", "error": failed[:500]}
    if "finish_reason" in row:  # taken already (the postprocess, then every row once more)
        return {k: row[k] for k in ANSWER_FIELDS}
    if llm.engine == "vllm":
        tokens = int(row.get("num_generated_tokens") or 0)
        # vLLM's batch rows carry no finish reason: an answer max_tokens long was cut off
        reason = "length" if tokens >= max_tokens else "stop"
        text = str(row.get("generated_text") or "")
        return {**carried, "text": text, "tokens": tokens, "finish_reason": reason, "error": ""}
    response = row.get("http_response") or {}
    try:
        choice = response["choices"][0]
        text = str(choice["message"]["content"] or "")
        reason = str(choice.get("finish_reason") or "")
        tokens = int((response.get("usage") or {}).get("completion_tokens") or 0)
    except (KeyError, IndexError, TypeError, ValueError):
        error = response.get("error", response) if isinstance(response, Mapping) else response
        said = json.dumps(error, default=str)[:500] or "no answer"
        return {**carried, "text": "", "tokens": 0, "finish_reason": "", "error": said}
    return {**carried, "text": text, "tokens": tokens, "finish_reason": reason, "error": ""}


def check_server(llm: LLMEngine, timeout_s: float = 10.0) -> None:
    """Fail the run at once, in one line, when the HTTP engine's server does not list the model
    the run's profile names (``/v1/models``): its answers would be another model's."""
    import httpx

    headers = {"Authorization": f"Bearer {llm.api_key}"} if llm.api_key else {}
    try:
        response = httpx.get(f"{llm.url}/v1/models", headers=headers, timeout=timeout_s)
        response.raise_for_status()
        served = {str(card.get("id")) for card in response.json().get("data", [])}
    except (httpx.HTTPError, ValueError, AttributeError) as error:
        raise FleetError(
            f"EDGEQA_GENERATION_URL {llm.url}: its /v1/models did not answer ({error})"
        ) from None
    if llm.model not in served:
        raise FleetError(
            f"EDGEQA_GENERATION_URL {llm.url} serves {sorted(served)}, not {llm.model!r} (the "
            "model the run's profile names: EDGEQA_MODEL)"
        )


def without_key(job: Job, llm: LLMEngine) -> tuple[Job, LLMEngine]:
    """``job`` and ``llm`` as the workers reading and writing partitions get them: without the
    server's API key (the HTTP stage's headers hold it; a pickle would carry it anywhere)."""
    bare = dataclasses.replace(llm, api_key="")
    return dataclasses.replace(job, llm=bare), bare


def _pieces(work: WorkArea, index: int) -> str:
    """Where the answers of partition ``index`` wait as they come, before it is written."""
    return f"{work.prefix}/pieces/{index:05d}/"


def _questions(row: Mapping[str, Any], job: Job) -> Iterator[dict[str, Any]]:
    """Partition ``row["partition"]``'s questions answered neither by reuse nor by a piece of an
    earlier attempt, read from the work area by the worker (the attempt recorded first)."""
    from base.store import open_store
    from precompute.workarea import PartitionReader, WorkArea

    index = int(row["partition"])
    work = WorkArea(open_store(job.out_uri), job.profile, job.run)
    reader = PartitionReader(work, job.partition_size, job.questions)
    keys, texts = reader.questions(index)
    work.attempt(index, worker_name())
    reused = reader.reused(index, keys)
    done = {a["position"] for a in _answered(work, index)}
    for position, (key, question) in enumerate(zip(keys, texts, strict=True)):
        if key not in reused and position not in done:
            yield {"partition": index, "position": position, "key": key, "question": question}


def _answered(work: WorkArea, index: int) -> list[dict[str, Any]]:
    """The answers of partition ``index`` its pieces hold (``_keep``)."""
    rows: list[dict[str, Any]] = []
    for path in work.store.list(_pieces(work, index)):
        rows += work.get_table(path).to_pylist()
    return rows


def _keep(batch: pa.Table, job: Job) -> pa.Table:
    """A batch of answers as they come out of the processor, a piece per partition in the work
    area (the checkpoint: a rerun asks only what no piece holds), but for the engine's errors,
    which are asked again; a row per partition saying how many came and the first error."""
    import uuid

    import pyarrow as pa

    from base.store import open_store
    from precompute.workarea import WorkArea

    work = WorkArea(open_store(job.out_uri), job.profile, job.run)
    by_partition: dict[int, list[dict[str, Any]]] = {}
    for answer in batch.to_pylist():
        by_partition.setdefault(int(answer["partition"]), []).append(answer)
    said = []
    for index, answers in by_partition.items():
        good = [a for a in answers if not a["error"]]
        errors = [a["error"] for a in answers if a["error"]]
        if good:
            first = min(a["position"] for a in good)
            name = f"{_pieces(work, index)}{first:05d}-{uuid.uuid4().hex[:12]}.parquet"
            work.put_table(name, pa.Table.from_pylist(good))
        said.append(
            {"partition": index, "answers": len(answers), "errors": len(errors),
             "error": errors[0][:300] if errors else ""}
        )  # fmt: skip
    return pa.Table.from_pylist(said)


def _write(row: dict[str, Any], job: Job, started: float) -> dict[str, Any]:
    """Partition ``row["partition"]`` from its pieces: generated rows and reused ones in the
    questions' order, written to the work area; a question no piece answers is an engine
    ``error`` (flagged); a row saying what it did."""
    import pyarrow as pa

    from base.store import open_store
    from precompute.generate import answer_schema, answered_row
    from precompute.workarea import PartitionReader, WorkArea

    index = int(row["partition"])
    work = WorkArea(open_store(job.out_uri), job.profile, job.run)
    reader = PartitionReader(work, job.partition_size, job.questions)
    keys, texts = reader.questions(index)
    reused = reader.reused(index, keys)
    by_position = {a["position"]: a for a in _answered(work, index)}
    asked = len(keys) - len(reused)
    if asked and not by_position:
        raise FleetError(f"partition {index}: no answer came back, not written")
    rows, flags, tokens = [], Counter[str](), 0
    for position, (key, question) in enumerate(zip(keys, texts, strict=True)):
        if key in reused:
            rows.append(reused[key])
            continue
        got = by_position.get(position) or {"text": "", "tokens": 0, "finish_reason": ""}
        error = None if position in by_position else "the engine answered with an error"
        reason, text, count = got["finish_reason"] or None, got["text"], int(got["tokens"])
        rows.append(answered_row(key, question, text, count, reason, error, job.generated_at))
        tokens += count
    flags.update(r["flag"] for r in rows if r["flag"])
    # its pieces stay with the run's work area (prune removes it): the GPU workers' role, where
    # this runs, may write a work area but not delete in it
    work.put_table(work.partition(index), pa.Table.from_pylist(rows, schema=answer_schema()))
    return {
        "partition": index,
        "generated": asked,
        "tokens": tokens,
        "started": started,
        "ended": time.time(),
        "worker": worker_name(),
        "flags": json.dumps(dict(flags)),
    }


def generate_streamed(
    fleet: Fleet, job: Job, llm: LLMEngine, todo: Sequence[int], progress: bool = False
) -> Generated:
    """Answer partitions ``todo`` of ``job``'s run with ``llm`` on ``fleet``: one Ray Data run
    over them all (the engines start once), each batch of answers kept in the work area as it
    comes (``_keep``), then each partition written from its pieces (``_write``); a partition
    whose every answer is an error is not written and fails the run in one line (a server
    refusing every request: the retry asks again). Returns what each partition's writer did."""
    import ray.data
    from ray.data.llm import build_processor
    from tqdm import tqdm

    if not todo:
        return Generated([], "")
    if llm.engine == "http":
        check_server(llm)
    config = processor_config(llm, job.settings, fleet)  # the key: in the HTTP stage's headers
    job, llm = without_key(job, llm)  # and nowhere else handed to Ray
    settings, max_tokens = job.settings, job.settings.max_tokens
    processor = build_processor(
        config,
        preprocess=lambda row: request_row(llm, settings, row),
        postprocess=lambda row: answer_row(llm, max_tokens, row),
    )
    size = job.partition_size
    answers = {i: min(size, job.questions - i * size) for i in todo}
    bar = tqdm(total=sum(answers.values()), desc="generating", unit="answer", disable=not progress)
    asked: Counter[int] = Counter()
    failed: Counter[int] = Counter()
    first_error: dict[int, str] = {}
    if llm.engine == "vllm":
        reserve_gpus(fleet, fleet.workers, cpu_worker=True)  # the build's CPU worker kept up
    started = time.time()
    try:
        parts = ray.data.from_items([{"partition": i} for i in todo], override_num_blocks=len(todo))
        kept = (
            processor(parts.flat_map(_questions, fn_kwargs={"job": job}))
            .map(lambda row: answer_row(llm, max_tokens, row))
            .map_batches(_keep, fn_kwargs={"job": job}, batch_format="pyarrow")
        )
        for said in kept.iter_rows():  # a row a batch and partition: counts, never answers
            asked[said["partition"]] += said["answers"]
            failed[said["partition"]] += said["errors"]
            if said["error"]:
                first_error.setdefault(said["partition"], said["error"])
            bar.update(said["answers"])
        refused = sorted(i for i in asked if failed[i] == asked[i])
        whole = [i for i in todo if i not in refused]
        written = ray.data.from_items([{"partition": i} for i in whole]).map(
            _write, fn_kwargs={"job": job, "started": started}
        )
        rows = [dict(row) for row in written.iter_rows()] if whole else []
    except Exception as error:  # past Ray's retries: the pieces and partitions written are kept
        raise FleetError(f"generation with {llm.describe()} failed: {last_line(error)}") from error
    finally:
        bar.close()
        if llm.engine == "vllm":
            reserve_gpus(fleet, 0)
    if refused:
        raise FleetError(
            f"partition {refused[0]}: every answer asked for was an engine error, not written "
            f"({len(refused)} partition(s); the first error: {first_error[refused[0]][:200]})"
        )
    workers = len({r["worker"] for r in rows})
    return Generated(rows, f"{fleet.where(workers)}; {llm.describe()}")
