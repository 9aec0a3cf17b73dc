"""The answers as a Ray Data job: the partitions not in the run's work area yet, one per batch,
one nightly engine per actor (``generate.generate_partition``); each actor writes a partition to
the work area as soon as it is answered (the checkpoint), so a lost worker (Ray restarts its
actor and retries the batch) or a rerun redoes only the partitions not written yet. Every
attempt is recorded (``WorkArea.attempt``): the report names the partitions redone."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from precompute.fleet import (
    Fleet,
    FleetError,
    bound_class,
    last_line,
    map_batches,
    pool_size,
    reserve_gpus,
    shipped,
    worker_name,
)
from precompute.generate import answer_schema

if TYPE_CHECKING:
    from origin.config import EngineSettings
    from origin.precision import EngineQuantization
    from precompute.config import PrecomputeSettings
    from precompute.generate import GenerationReport
    from precompute.workarea import WorkArea


@dataclass(frozen=True)
class Job:
    """One run's generation, as its actors need it: where its work area is and how to answer."""

    out_uri: str  # the store's absolute URI: an actor's working folder is not the driver's
    profile: str
    run: str
    settings: EngineSettings
    quantization: EngineQuantization
    generated_at: datetime
    own_cache: bool = False  # the actors use their own EDGEQA_CACHE_DIR (a fleet's machines)

    @classmethod
    def of(
        cls,
        fleet: Fleet,
        settings: PrecomputeSettings,
        quantization: EngineQuantization,
        work: WorkArea,
        generated_at: datetime,
    ) -> Job:
        """The job of ``work``'s run on ``fleet``, its settings without a secret
        (``shipped``)."""
        engine = shipped(settings)
        return cls(
            work.store.uri,
            work.profile,
            work.run,
            engine,
            quantization,
            generated_at,
            not fleet.local,
        )


class _Answerer:
    """One engine per actor (the nightly engine: ``generate.nightly_engine``), built when its
    first partition needs generating; a batch is partitions, each answered and written to the
    work area before the next (the checkpoint)."""

    def __init__(self, job: Job) -> None:
        from base.store import ObjectNotFoundError, open_store
        from precompute.workarea import WorkArea

        self.job = job
        if job.own_cache:  # the driver's cache folder is on the driver's machine
            from origin.config import EngineSettings

            own = EngineSettings.from_env().cache_dir
            self.job = dataclasses.replace(
                job, settings=job.settings.model_copy(update={"cache_dir": own})
            )
        self.work = WorkArea(open_store(job.out_uri), job.profile, job.run)
        # the run's reused answers as one Arrow table (a million answers' text is held once,
        # not as a dict per row); a partition takes its own rows from it
        try:
            self.reused = self.work.get_table(self.work.reused)
        except ObjectNotFoundError:
            self.reused = answer_schema().empty_table()
        self.reused_at = {k: i for i, k in enumerate(self.reused.column("key").to_pylist())}
        self.engine: Any = None

    def _engine(self) -> Any:
        from precompute.generate import nightly_engine

        if self.engine is None:
            self.engine = nightly_engine(self.job.settings, self.job.quantization)
        return self.engine

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, list[Any]]:
        import pyarrow as pa

        from precompute.generate import generate_partition

        fields = ("partition", "generated", "tokens", "started", "ended", "worker", "flags")
        done: dict[str, list[Any]] = {k: [] for k in fields}
        for index, keys, questions in zip(
            batch["partition"], batch["keys"], batch["questions"], strict=True
        ):
            names, texts = [str(k) for k in keys], [str(q) for q in questions]
            self.work.attempt(int(index), worker_name())
            taken = [self.reused_at[k] for k in names if k in self.reused_at]
            rows = self.reused.take(pa.array(taken, pa.int64())).to_pylist()
            reused = {r["key"]: r for r in rows}
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


@dataclass
class Generated:
    """What the fleet's generation job did: per partition generated, its answers, tokens, the
    seconds it took and the worker; ``where`` it ran."""

    rows: list[dict[str, Any]]
    where: str

    @property
    def seconds(self) -> float:
        """From the first generating partition's start to the last one's end, across the
        workers (the engines' builds before it are not counted, as in-process)."""
        timed = [r for r in self.rows if r["generated"]]
        if not timed:
            return 0.0
        return max(r["ended"] for r in timed) - min(r["started"] for r in timed)


def generate_partitions(
    fleet: Fleet,
    job: Job,
    todo: Sequence[int],
    keys: Sequence[Sequence[str]],
    questions: Sequence[Sequence[str]],
    progress: bool = False,
) -> Generated:
    """Answer partitions ``todo`` (``keys[i]``, ``questions[i]`` each) on the fleet, each
    written to the work area as it is done; returns what each did (``progress``: a bar of the
    answers as their partitions come back)."""
    import ray.data
    from tqdm import tqdm

    if not todo:
        return Generated([], "")
    items = [
        {"partition": i, "keys": list(keys[n]), "questions": list(questions[n])}
        for n, i in enumerate(todo)
    ]
    pool = fleet.actors(len(items))
    reserve_gpus(fleet, pool_size(pool))
    dataset = map_batches(
        ray.data.from_items(items, override_num_blocks=len(items)),
        bound_class(_Answerer, job=job),
        batch_size=1,  # a partition per call: each is checkpointed before the next starts
        **pool,
    )
    answers = {i: len(keys[n]) for n, i in enumerate(todo)}  # by partition
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
    fleet: Fleet,
    job: Job,
    work: WorkArea,
    keys: Sequence[str],
    questions: Sequence[str],
    partition_size: int,
    progress: bool = False,
) -> GenerationReport:
    """``generate.generate_all`` on the fleet: the partitions not in the work area yet
    are one Ray Data job, each written there by the actor that answered it (taking the run's
    reused answers from the work area, as ``generate_stage`` does); those whose every answer is
    reused are written by this process, with no actor. The report's ``seconds`` run from the
    first generated partition's start to the last one's end."""
    from base.store import ObjectNotFoundError
    from precompute.generate import GenerationReport, partitions

    report = GenerationReport()
    key_parts = partitions(keys, partition_size)
    question_parts = partitions(questions, partition_size)
    report.partitions = len(key_parts)
    written = set(work.store.list(work.partition(0).rsplit("/", 1)[0]))  # one listing
    todo: list[int] = []
    for index in range(len(key_parts)):
        if work.partition(index) not in written:
            todo.append(index)
            continue
        try:  # answered by an earlier attempt at this run: counted as it is
            report.count_flags(work.get_table(work.partition(index)).to_pylist())
            report.partitions_reused += 1
        except ObjectNotFoundError:
            todo.append(index)
    # a partition whose every answer the run reuses (a rerun, last night's hot questions) is
    # written here first, as an actor would write it: no actor, engine or GPU starts for it
    copied: dict[str, list[Any]] = {}
    if todo:
        copier = _Answerer(job)
        whole = {i for i in todo if all(k in copier.reused_at for k in key_parts[i])}
        if whole:
            todo = [i for i in todo if i not in whole]
            copied = copier(
                {
                    "partition": sorted(whole),
                    "keys": [key_parts[i] for i in sorted(whole)],
                    "questions": [question_parts[i] for i in sorted(whole)],
                }
            )
    done = generate_partitions(
        fleet,
        job,
        todo,
        [key_parts[i] for i in todo],
        [question_parts[i] for i in todo],
        progress,
    )
    if copied:
        rows = zip(*copied.values(), strict=True)
        done.rows += [dict(zip(copied, values, strict=True)) for values in rows]
        done.where = done.where or "this process (every answer reused)"
    for row in done.rows:  # what each partition's actor counted as it wrote it
        answers = len(key_parts[row["partition"]])
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
