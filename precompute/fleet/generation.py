"""The answers as a Ray Data job: the partitions not in the run's work area yet, one per batch,
one nightly engine per actor (``generate.generate_partition``); each actor writes a partition to
the work area as soon as it is answered (the checkpoint), so a lost worker (Ray restarts its
actor and retries the batch) or a rerun redoes only the partitions not written yet. Every
attempt is recorded (``WorkArea.attempt``): the report names the partitions redone."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from precompute.fleet import Fleet, FleetError, bound_class, pool_size, shipped, worker_name

if TYPE_CHECKING:
    from origin.config import EngineSettings
    from origin.precision import EngineQuantization
    from precompute.config import PrecomputeSettings
    from precompute.generate import GenerationReport
    from precompute.workarea import WorkArea


@dataclass(frozen=True)
class Job:
    """One run's generation, as its actors need it: where its work area is and how to answer."""

    out_uri: str
    profile: str
    run: str
    settings: EngineSettings
    quantization: EngineQuantization
    generated_at: datetime

    @classmethod
    def of(
        cls,
        settings: PrecomputeSettings,
        quantization: EngineQuantization,
        out_uri: str,
        work: WorkArea,
        generated_at: datetime,
    ) -> Job:
        """The job of ``work``'s run, its settings without a secret (``shipped``)."""
        return cls(out_uri, work.profile, work.run, shipped(settings), quantization, generated_at)


class _Answerer:
    """One engine per actor (the nightly engine: ``generate.nightly_engine``), built when its
    first partition needs generating; a batch is partitions, each answered and written to the
    work area before the next (the checkpoint)."""

    def __init__(self, job: Job) -> None:
        from edge_index.store import ObjectNotFoundError, open_store
        from precompute.workarea import WorkArea

        self.job = job
        self.work = WorkArea(open_store(job.out_uri), job.profile, job.run)
        try:
            rows = self.work.get_table(self.work.reused).to_pylist()
        except ObjectNotFoundError:
            rows = []
        self.reused = {row["key"]: row for row in rows}
        self.engine: Any = None

    def _engine(self) -> Any:
        from precompute.generate import nightly_engine

        if self.engine is None:
            self.engine = nightly_engine(self.job.settings, self.job.quantization)
        return self.engine

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, list[Any]]:
        from precompute.generate import generate_partition

        done: dict[str, list[Any]] = {
            k: [] for k in ("partition", "generated", "tokens", "started", "ended", "worker")
        }
        for index, keys, questions in zip(
            batch["partition"], batch["keys"], batch["questions"], strict=True
        ):
            names, texts = [str(k) for k in keys], [str(q) for q in questions]
            self.work.attempt(int(index), worker_name())
            todo = sum(1 for k in names if k not in self.reused)
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
                self.reused,
            )
            self.work.put_table(self.work.partition(int(index)), table)  # the checkpoint
            for name, value in zip(
                done,
                (int(index), todo, tokens, started, time.time(), worker_name()),
                strict=True,
            ):
                done[name].append(value)
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
) -> Generated:
    """Answer partitions ``todo`` (``keys[i]``, ``questions[i]`` each) on the fleet, each
    written to the work area as it is done; returns what each did."""
    import ray.data

    if not todo:
        return Generated([], "")
    items = [
        {"partition": i, "keys": list(keys[n]), "questions": list(questions[n])}
        for n, i in enumerate(todo)
    ]
    pool = fleet.actors(len(items))
    dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        bound_class(_Answerer, job=job),
        batch_size=1,  # a partition per call: each is checkpointed before the next starts
        **pool,
    )
    try:
        rows = dataset.take_all()
    except Exception as error:  # a partition failed past Ray's retries: the rest are kept
        where = fleet.where(pool_size(pool))
        raise FleetError(f"generation on {where} failed: {error}") from error
    workers = len({r["worker"] for r in rows})
    return Generated(rows, fleet.where(workers))


def generate_on_fleet(
    fleet: Fleet,
    job: Job,
    work: WorkArea,
    keys: Sequence[str],
    questions: Sequence[str],
    partition_size: int,
) -> GenerationReport:
    """``generate.generate_all`` on the fleet: the partitions not in the work area yet
    are one Ray Data job, each written there by the actor that answered it (taking the run's
    reused answers from the work area, as ``generate_stage`` does). The report's ``seconds``
    run from the first generated partition's start to the last one's end."""
    from edge_index.store import ObjectNotFoundError
    from precompute.generate import GenerationReport, partitions

    report = GenerationReport()
    key_parts = partitions(keys, partition_size)
    question_parts = partitions(questions, partition_size)
    report.partitions = len(key_parts)
    todo: list[int] = []
    for index in range(len(key_parts)):
        try:
            report.count_flags(work.get_table(work.partition(index)).to_pylist())
            report.partitions_reused += 1
        except ObjectNotFoundError:
            todo.append(index)
    done = generate_partitions(
        fleet,
        job,
        todo,
        [key_parts[i] for i in todo],
        [question_parts[i] for i in todo],
    )
    for row in done.rows:
        table = work.get_table(work.partition(row["partition"]))
        report.count_flags(table.to_pylist())
        report.generated += row["generated"]
        report.reused += table.num_rows - row["generated"]
        report.tokens += row["tokens"]
    missing = sorted(set(todo) - {row["partition"] for row in done.rows})
    if missing:
        raise FleetError(f"partitions {missing} came back from no worker")
    report.seconds = done.seconds
    report.ran_on = done.where or "nothing to generate"
    attempts = work.attempts()
    report.redone = sorted(i for i in todo if len(attempts.get(i, ())) > 1)
    return report
