"""The answers as a Ray Data job: the partitions not in the run's work area yet, one per batch,
one nightly engine per actor (``generate.generate_partition``). The job is handed partition
numbers only: each actor reads its partition's questions and reused answers from the work area
(``workarea.PartitionReader``: a part of ``hot/`` and of ``reused/`` at a time) and writes the
partition there as soon as it is answered (the checkpoint), so no question and no answer passes
through the driver, a lost worker (Ray restarts its actor and retries the batch) or a rerun redoes
only the partitions not written yet. Every attempt is recorded (``WorkArea.attempt``): the report
names the partitions redone."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from precompute.fleet import (
    Fleet,
    FleetError,
    bound_class,
    last_line,
    map_batches,
    pool_size,
    reserve_gpus,
    worker_name,
)
from precompute.fleet.generation_job import Generated, Job

if TYPE_CHECKING:
    from precompute.generate import GenerationReport
    from precompute.workarea import WorkArea


class _Answerer:
    """One engine per actor (the nightly engine: ``generate.nightly_engine``), built when its
    first partition needs generating; a batch is partition numbers, each read from the work area,
    answered and written there before the next (the checkpoint)."""

    def __init__(self, job: Job) -> None:
        from base.store import open_store
        from precompute.workarea import PartitionReader, WorkArea

        self.job = job
        if job.own_cache:  # the driver's cache folder is on the driver's machine
            from origin.config import EngineSettings

            own = EngineSettings.from_env().cache_dir
            self.job = dataclasses.replace(
                job, settings=job.settings.model_copy(update={"cache_dir": own})
            )
        self.work = WorkArea(open_store(job.out_uri), job.profile, job.run)
        self.reader = PartitionReader(self.work, job.partition_size, job.questions)
        self.engine: Any = None

    def _engine(self) -> Any:
        from precompute.generate import nightly_engine

        if self.engine is None:
            self.engine = nightly_engine(self.job.settings, self.job.quantization)
        return self.engine

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, list[Any]]:
        from precompute.generate import generate_partition

        fields = ("partition", "generated", "tokens", "started", "ended", "worker", "flags")
        done: dict[str, list[Any]] = {k: [] for k in fields}
        for index in batch["partition"]:
            names, texts = self.reader.questions(int(index))
            self.work.attempt(int(index), worker_name())
            reused = self.reader.reused(int(index), names)
            todo = len(names) - len(reused)
            if todo:
                self._engine()  # built before the clock starts: the answers are timed
            started = time.time()
            table, tokens = generate_partition(
                self._engine,
                names,
                texts,
                self.job.settings.max_tokens,
                self.job.settings.system_prompt,
                self.job.generated_at,
                reused,
            )
            self.work.put_table(self.work.partition(int(index)), table)  # the checkpoint
            flags = Counter(f for f in table.column("flag").to_pylist() if f)
            values = (int(index), todo, tokens, started, time.time(), worker_name(), flags)
            for name, value in zip(fields, values, strict=True):
                done[name].append(json.dumps(value) if name == "flags" else value)
        return done


def generate_partitions(
    fleet: Fleet, job: Job, todo: Sequence[int], progress: bool = False
) -> Generated:
    """Answer partitions ``todo`` of ``job``'s run on the fleet, each read from the work area and
    written there by the actor that answers it; returns what each did (``progress``: a bar of
    the answers as their partitions come back)."""
    import ray.data
    from tqdm import tqdm

    if not todo:
        return Generated([], "")
    pool = fleet.actors(len(todo))
    reserve_gpus(fleet, pool_size(pool), cpu_worker=True)  # the build's CPU worker kept up
    dataset = map_batches(
        ray.data.from_items([{"partition": i} for i in todo], override_num_blocks=len(todo)),
        bound_class(_Answerer, job=job),
        batch_size=1,  # a partition per call: each is checkpointed before the next starts
        **pool,
    )
    size = job.partition_size
    answers = {i: min(size, job.questions - i * size) for i in todo}  # by partition
    bar = tqdm(total=sum(answers.values()), desc="generating", unit="answer", disable=not progress)
    rows: list[dict[str, Any]] = []
    try:
        for row in dataset.iter_rows():
            rows.append(dict(row))
            bar.update(answers[row["partition"]])
    except Exception as error:  # a partition failed past Ray's retries: the rest are kept
        where = fleet.where(pool_size(pool))
        raise FleetError(f"generation on {where} failed: {last_line(error)}") from error
    finally:
        bar.close()
        reserve_gpus(fleet, 0)
    workers = len({r["worker"] for r in rows})
    return Generated(rows, fleet.where(workers))


def generate_on_fleet(
    fleet: Fleet, job: Job, work: WorkArea, progress: bool = False
) -> GenerationReport:
    """``generate.generate_all`` on the fleet: the partitions of ``job``'s run not in the work
    area yet are one Ray Data job, each read and written there by the actor that answers it;
    those whose every answer is reused are written by this process, with no actor. What this
    process holds is a part of ``hot/`` and of ``reused/`` at a time and a row per partition.
    The report's ``seconds`` run from the first generated partition's start to the last one's
    end."""
    from base.store import ObjectNotFoundError
    from precompute.generate import GenerationReport

    report = GenerationReport()
    copier = _Answerer(job)
    reader = copier.reader
    report.partitions = reader.partitions
    written = set(work.store.list(work.partition(0).rsplit("/", 1)[0]))  # one listing
    todo: list[int] = []
    for index in range(reader.partitions):
        if work.partition(index) not in written:
            todo.append(index)
            continue
        try:  # answered by an earlier attempt at this run: counted as it is
            report.count_flags(work.get_table(work.partition(index), ["flag"]).to_pylist())
            report.partitions_reused += 1
        except ObjectNotFoundError:
            todo.append(index)
    # a partition whose every answer the run reuses (a rerun, last night's hot questions) is
    # written here first, as an actor would write it: no actor, engine or GPU starts for it
    whole = []
    for index in todo:
        keys, _ = reader.questions(index)
        if len(reader.reused(index, keys)) == len(keys):
            whole.append(index)
    copied = copier({"partition": whole}) if whole else {}
    skipped = set(whole)
    rest = [i for i in todo if i not in skipped]
    if job.llm is not None:  # vLLM or a server, through Ray Data's LLM API
        from precompute.fleet.llm import generate_streamed

        done = generate_streamed(fleet, job, job.llm, rest, progress)
    else:
        done = generate_partitions(fleet, job, rest, progress)
    if copied:
        rows = zip(*copied.values(), strict=True)
        done.rows += [dict(zip(copied, values, strict=True)) for values in rows]
        done.where = done.where or "this process (every answer reused)"
    for row in done.rows:  # what each partition's actor counted as it wrote it
        answers = min(job.partition_size, job.questions - row["partition"] * job.partition_size)
        report.answers += answers
        for flag, n in json.loads(row["flags"]).items():
            report.flagged[flag] = report.flagged.get(flag, 0) + n
        report.generated += row["generated"]
        report.reused += answers - row["generated"]
        report.tokens += row["tokens"]
    missing = sorted(set(todo) - {row["partition"] for row in done.rows})
    if missing:
        raise FleetError(f"partitions {missing} came back from no worker")
    report.seconds = done.seconds
    report.ran_on = done.where or "nothing to generate"
    tried = Counter(work.attempted())
    report.redone = sorted(i for i in todo if tried[i] > 1)
    return report
