"""The nightly pipeline, defined once:

    mine -> generate (per partition) -> build -> validate -> publish -> prune

``run_pipeline`` runs the stages in this order in one process: it is what ``edgeqa precompute run``
and the demo call. The Airflow DAG (``dags/nightly_edge_release.py``) runs each stage as one task,
maybe on different workers (a test checks that its tasks are these stages in this order). A stage
reads what the previous ones left in the run's work area (``workarea.py``) and returns a small
typed result (``results.py``), passed on as JSON (XCom): every path runs the same code, the
quality gate included.

- ``mine_stage``: read the logs of the window, mine the hot questions with the evidence carried
  from the parent release's run (the current one, verified: ``parent.night_parent``), decide the
  profile, the run id (a digest of the profile, the questions and the parent) and which of the
  parent's answers are reused (``generate.ParentAnswers``), save them; the partitions to
  generate. The questions and the cluster report wait on local disk (``spill.py``).
- ``generate_stage``: answer one partition (or all), checkpointed in the store.
- ``build_stage``: the release from the generated partitions, written where it is served
  (``publish.upload_release``: only the answer objects the parent lacks), noted in ``built.json``.
- ``validate_stage``: the release checked where it is, and the quality gate; ``QualityGateError``
  marks it refused (never published, pruned) and keeps the previous release live.
- ``publish_stage``: sign it and flip the pointer (never above a store below the high-water mark).
- ``prune_stage``: old and refused releases, and the answer objects no kept release holds.

A run is built "as of" the end of its last log day, or of the moment the run started when that is
earlier (a window that ends today): ``RunParams.as_of``, fixed once per run (the DAG passes its data
interval's end), so every stage dates the release alike and re-running a window that has ended
yields the same version and content.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from base.config import peak_rss_mb
from base.errors import EdgeQAError
from base.languages import DEFAULT_LANGUAGE, LANGUAGES
from base.logreader import LogDays, LogReadStats
from base.release import ReleaseError, read_manifest, read_pointer, release_prefix
from base.release_check import check_release
from base.store import ObjectNotFoundError, open_store, sha256_hex
from precompute.config import STAGES, PipelineConfig
from precompute.curated import curated_rows, read_curated
from precompute.fleet import ask_ahead, handed_back, ran_on
from precompute.generate import (
    ParentAnswers,
    RunDigest,
    answer_schema,
    generate_all,
    nightly_engine,
)
from precompute.incremental import NightCaches
from precompute.mining import drop_clusters, mine_to
from precompute.parent import night_parent, parent_flagged, parent_phrasings, parent_rows
from precompute.prune import mark_checked, mark_refused, prune
from precompute.publish import PublishConflictError, publish_uploaded, same_release, upload_release
from precompute.questions import HotQuestion, Phrasing
from precompute.results import (
    Built,
    BuiltRelease,
    Generated,
    LogsRead,
    Mined,
    Pruned,
    Published,
    StageResult,
    Validated,
    excluded_rows,
)
from precompute.revocations import is_revoked, nightly_revocations
from precompute.workarea import WorkArea, empty_answers, parse_run

if TYPE_CHECKING:
    from base.release import LoadedRelease
    from origin.runtime import LoadedModel

log = logging.getLogger(__name__)

Result = TypeVar("Result", bound=StageResult)
MINED = "mined.json"  # mine_stage's result, in the run's work area
BUILT = "built.json"  # build_stage's: the release built (version, manifest sha256, rows)
# the mining settings a release's manifest records
MANIFEST_MINING = ("k", "top_n", "half_life_days", "carry_half_lives", "cluster_threshold")


class QualityGateError(EdgeQAError, RuntimeError):
    """The built release must not be published; the previous one stays live. ``report``: the
    run report up to the refusal (``run_pipeline``)."""

    report: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunParams:
    """One run of the pipeline: where the logs are, where releases go, the log window, the
    configuration, and who runs it (recorded in the manifest: ``cli``, ``airflow``, ``demo``)."""

    logs_uri: str
    out_uri: str
    since: date
    until: date
    config: PipelineConfig
    runner: str = "cli"
    # when the run started (the DAG: its data interval's end); fixed for every stage of the run
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    # the language profile built: only the questions of this language are mined (``languages``)
    language: str = DEFAULT_LANGUAGE

    def __post_init__(self) -> None:
        if self.language not in LANGUAGES:
            raise EdgeQAError(f"unknown language {self.language!r} (known: {', '.join(LANGUAGES)})")
        if self.since > self.until:
            raise EdgeQAError(f"the log window starts ({self.since}) after it ends ({self.until})")

    @property
    def now(self) -> datetime:
        """The release is built as of the end of the last log day (or the run's start if sooner)."""
        end = datetime(self.until.year, self.until.month, self.until.day, 23, 59, 59, tzinfo=UTC)
        return min(end, self.started.astimezone(UTC).replace(microsecond=0))


def _work(params: RunParams, mined: Mined) -> WorkArea:
    return WorkArea(open_store(params.out_uri), mined.profile, mined.run)


def _answered(
    work: WorkArea, partitions: list[str]
) -> Iterator[tuple[HotQuestion, dict[str, Any] | None]]:
    """The run's mined questions, in order, each with its generated row: ``hot/`` and the
    generated partitions read side by side, a part of each at a time (a partition's rows are
    its questions' answers, in their order)."""

    def answers() -> Iterator[dict[str, Any]]:
        for path in partitions:
            yield from work.get_table(path).to_pylist()

    rows = answers()
    for cluster in work.hot(askers=False):  # a release names no asker
        row = next(rows, None)
        if row is None or row["key"] != cluster.key:
            raise EdgeQAError(
                f"{work.prefix}: the generated partitions do not answer hot/ in order "
                f"(at {cluster.key}): run generate again"
            )
        yield cluster, row


def scaled(config: PipelineConfig, spec: str) -> PipelineConfig:
    """``config`` with the thresholds it leaves open (None) set to embedder ``spec``'s measured
    scale (``semantic.embedder.score_scale``); an embedder without one keeps them open."""
    from semantic.embedder import score_scale

    scale = score_scale(spec)
    if scale is None:
        return config
    mining = {"cluster_threshold": scale.cluster_threshold}
    build = {"threshold": scale.threshold, "margin": scale.margin}
    return config.replace(
        mining={k: v for k, v in mining.items() if getattr(config.mining, k) is None},
        build={k: v for k, v in build.items() if getattr(config.build, k) is None},
    )


def mine_stage(
    params: RunParams, model: LoadedModel | None = None, progress: bool = False
) -> Mined:
    from precompute.fleet.embedding import wordings_encoder
    from precompute.fleet.llm import run_profile

    config, settings = params.config, params.config.settings
    # the operator's answers before anything else: a file that is not the pinned one
    # (EDGEQA_CURATED_ANSWERS_SHA256) stops the run before hours of mining, nothing published
    answers, pinned = config.generation.curated_answers, settings.curated_answers_sha256
    curated, curated_sha = read_curated(answers, pinned) if answers else ({}, "")
    profile = run_profile(settings, config.generation.quantization, model, params.language)
    stats = LogReadStats()
    # each day's rows read and reduced once: a day a night before reduced is taken from the store
    tables = LogDays.of(open_store(params.logs_uri), params.since, params.until, stats)
    out = open_store(params.out_uri)
    parent = night_parent(out, profile.name, settings)  # HighWaterError: the night stops
    read = 0  # the parent's wordings read, a part of its ``hot/`` at a time

    def carried() -> Iterator[Phrasing]:
        nonlocal read
        for phrasing in parent_phrasings(out, parent):
            read += 1
            yield phrasing

    spec = settings.embedders[params.language]

    # this run's language only: every other language's questions are another profile's; a
    # language without two wordings tonight needs no embedder (loaded only when one is needed);
    # the questions and the cluster report are kept on local disk, not in this process
    settings_mining = scaled(config, spec).mining
    spill = Path(tempfile.mkdtemp(prefix="edgeqa-mine-"))
    try:
        hot, mining = mine_to(
            spill,
            tables,
            None,
            settings_mining,
            params.now,
            carried(),
            language=params.language,
            progress=progress,
            # on Ray; here when the run was handed a model loaded here (a test, a benchmark)
            encoder=lambda: wordings_encoder(settings, spec, here=model is not None),
            ahead=partial(ask_ahead, settings),  # a fleet's GPU pools asked for early
            # what the nights before judged, embedded and clustered is not done again
            caches=NightCaches.of_night(
                out,
                profile.name,
                params.language,
                spec,
                params.since,
                params.until,
                settings_mining,
            ),
        )
        mining.carried_from = parent.version if read and parent else None
        # a cluster holding a revoked phrasing stays out until it is unrevoked
        revoked = is_revoked(nightly_revocations(out, profile.name, settings, parent))
        digest = RunDigest(profile)  # the run id, from the same pass
        dropped = drop_clusters(
            hot.questions(askers=False),  # counted, not named: ~6× as fast a read
            lambda h: any(revoked({"key": p.key, "cluster": h.key}) for p in h.phrasings),
            mining,
            "revoked",
            kept=lambda h: digest.add(h.question),
        )
        run = digest.run_id(parent.version if parent else None, curated_sha)
        work = WorkArea(out, profile.name, run)
        # the mined questions read once more: ``hot/`` and ``reused/`` beside it, a part at a time
        reuse = _Reuse(params, work, curated, parent)
        questions = work.put_hot_tables(hot.tables(dropped), reuse.part)  # no Python objects
        clusters = work.put_clusters(mining.cluster_rows)
        work.put_json("profile.json", profile.inputs)
        reused, answered = reuse.written, reuse.operator
        mining.peak_rss_mb["hot_and_reused"] = peak_rss_mb()
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    count = -(-questions // config.generation.partition_size)
    mined = Mined(
        profile=profile.name,
        run=run,
        parent=parent.version if parent else None,
        questions=questions,
        reusable=reused,
        curated=answered,
        partitions=count,
        logs=LogsRead.of(stats, mining.rows),
        excluded_rows=excluded_rows(stats, mining),
        # the run report's ``mining`` (docs/precompute.md#curated-answers: ``mining.curated``)
        mining={**mining.as_dict(), "curated": answered, "cluster_report": clusters},
    )
    # what the stages after this one read when they run in another process (``run_stage``)
    work.put_json(MINED, mined.as_json())
    return mined


class _Reuse:
    """Into ``reused/``, a part beside each part of ``hot/`` (``part``: handed the mined
    questions of each, in their order; what was there is removed first): the answers taken as
    they are, the operator's first, then the parent's still fresh ones. ``written``: the rows
    written; ``operator``: how many of them are the operator's."""

    def __init__(
        self,
        params: RunParams,
        work: WorkArea,
        curated: dict[str, str],
        parent: LoadedRelease | None,
    ) -> None:
        config = params.config
        self._work, self._curated, self._now = work, curated, params.now
        self._answers = None
        if parent is not None and config.generation.reuse_ttl_fraction > 0:
            max_age = timedelta(days=config.build.ttl_days * config.generation.reuse_ttl_fraction)
            self._answers = ParentAnswers(
                (r for shard in parent.shards for r in shard.rows.to_pylist()),
                parent.version,
                params.now,
                max_age,
                parent_flagged(work.store, parent),
            )
        self.written = self.operator = 0
        work.put_reused(())  # none yet: an earlier attempt's parts are removed

    def part(self, index: int, questions: list[HotQuestion]) -> None:
        import pyarrow as pa

        rows = curated_rows(questions, self._curated, self._now)
        self.operator += len(rows)
        if self._answers is not None:
            done = {row["key"] for row in rows}
            rows += [row for row in self._answers.rows(questions) if row["key"] not in done]
        self.written += self._work.put_reused_part(
            index, pa.Table.from_pylist(rows, schema=answer_schema())
        )


def generate_stage(
    params: RunParams, mined: Mined, model: LoadedModel | None = None, progress: bool = False
) -> Generated:
    """Answer every partition not answered yet: on Ray (``precompute/fleet/``: a local Ray, or
    the cluster ``EDGEQA_RAY_ADDRESS`` names), one engine per actor; or, given a ``model``
    loaded in this process, here with it (one engine for every partition)."""

    from precompute.fleet import connect
    from precompute.fleet.generation import Job, generate_on_fleet

    config, settings = params.config, params.config.settings
    work = _work(params, mined)
    size = config.generation.partition_size
    if model is None or settings.generation_engine != "edgeqa":  # on Ray: workers read it
        fleet = connect(settings)
        job = Job.of(
            fleet,
            settings,
            config.generation.quantization,
            work,
            params.now,
            size,
            mined.questions,
        )
        return Generated.of(generate_on_fleet(fleet, job, work, progress).as_dict())
    keys: list[str] = []
    questions: list[str] = []
    for table in work.hot_tables(["key", "question"]):  # what generation needs of each
        keys += table.column("key").to_pylist()
        questions += table.column("question").to_pylist()
    reused = {r["key"]: r for part in work.reused_parts() for r in part.to_pylist()}
    _, report = generate_all(
        lambda: nightly_engine(settings, config.generation.quantization, model),
        work,
        keys,
        questions,
        settings,
        size,
        generated_at=params.now,
        progress=progress,
        reused=reused,
    )
    return Generated.of(report.as_dict())


def build_stage(params: RunParams, mined: Mined) -> Built:
    from precompute.build import build_release, finetuned_embedder
    from precompute.fleet.embedding import release_encoder
    from semantic.loading import load_embedder

    config, settings = params.config, params.config.settings
    work = _work(params, mined)
    partitions = [work.partition(index) for index in range(mined.partitions)]
    written = set(work.store.list(work.partition(0).rsplit("/", 1)[0]))  # one listing
    missing = [path for path in partitions if path not in written]
    if missing:
        raise EdgeQAError(f"a partition is not generated: run generate first ({missing[0]})")
    pointer, _ = read_pointer(work.store, work.profile)
    parent = pointer.version if pointer else None
    spec = settings.embedders[params.language]
    embedder = load_embedder(spec, cache_dir=settings.cache_dir)
    config = scaled(config, spec)
    with tempfile.TemporaryDirectory(prefix="edgeqa-build-") as tmp:
        embedder_dir, embedder_info = None, None
        # the rows on the fleet's GPUs where it has them; a tuned embedder's here
        encode = None if config.finetune_steps else release_encoder(settings, spec)
        if config.finetune_steps:  # tuned on every published wording: all of them held
            embedder, embedder_dir, embedder_info = finetuned_embedder(
                embedder, spec, list(work.hot()), config.finetune_steps, Path(tmp) / "embedder"
            )
        manifest, report = build_release(
            Path(tmp) / "release",
            partial(_answered, work, partitions),
            embedder,
            spec,
            work.profile,
            work.get_json("profile.json"),
            config.build,
            extra={
                "parent": parent,
                "run_id": work.run,
                "runner": params.runner,
                "log_range": {"since": params.since.isoformat(), "until": params.until.isoformat()},
                "excluded_rows": dict(sorted(mined.excluded_rows.items())),
                "revoked": nightly_revocations(work.store, work.profile, settings),
                "mining": {name: getattr(config.mining, name) for name in MANIFEST_MINING},
            },
            now=params.now,
            embedder_dir=embedder_dir,
            embedder_info=embedder_info,
            encode=encode,
        )
        sha = sha256_hex((Path(tmp) / "release" / "manifest.json").read_bytes())
        upload = {}
        if manifest.counts.rows:  # an empty release is never published: nothing to write
            try:
                upload = upload_release(work.store, Path(tmp) / "release").as_dict()
            except PublishConflictError:  # built before by another run? then go on with it
                sha = same_release(work.store, manifest)
        built = BuiltRelease(
            version=manifest.version, manifest_sha256=sha, rows=manifest.counts.rows
        )
        work.put_json(BUILT, built.as_json())
    return Built(
        version=manifest.version,
        parent=parent,
        semantic=manifest.threshold.semantic,
        semantic_off_reason=manifest.threshold.semantic_off_reason,
        **report.as_dict(),
        upload=upload,
    )


def validate_stage(params: RunParams, mined: Mined) -> Validated:
    """The quality gate, and the release checked where it is served: raise ``QualityGateError``
    naming every failed check (the release is then marked refused: never published, pruned).
    A release with no rows is not refused: there is nothing to publish, and the previous
    release stays."""
    gate, work = params.config.gate, _work(params, mined)
    built = BuiltRelease.of(work.get_json(BUILT))
    if built.rows == 0:
        return Validated(version=built.version, rows=0, precision=None, status="nothing_to_publish")
    store, version = work.store, built.version
    manifest, sha = read_manifest(store, work.profile, version)
    if sha != built.manifest_sha256:
        raise EdgeQAError(f"release {work.profile}/{version} is not the one this run built")
    rows, threshold, prefix = (
        manifest.counts.rows,
        manifest.threshold,
        release_prefix(work.profile, version),
    )
    failures: list[str] = []
    try:
        check_release(store, work.profile, version, sha)
    except ReleaseError as error:
        failures.append(f"the release does not verify where it is served: {error}")
    if rows < gate.min_rows:
        failures.append(f"the release has {rows} rows (at least {gate.min_rows} required)")
    empty = empty_answers(store, prefix, manifest)
    if empty:
        failures.append(f"{empty} answers are empty")
    # leave-one-out precision of the semantic tier at the decision the release ships (measured
    # whenever some phrasings hit; an uncalibrated release measures its fallback decision)
    precision = threshold.precision
    if threshold.semantic and threshold.hit_rate and (precision or 0.0) < gate.min_precision:
        failures.append(f"calibrated precision {precision} is below {gate.min_precision}")
    before = parent_rows(work, manifest.parent)
    if before and rows < (1 - gate.max_shrink) * before:
        failures.append(
            f"the release shrinks from {before} to {rows} rows (more than {gate.max_shrink:.0%})"
        )
    if failures:
        reason = f"release {manifest.version} refused: " + "; ".join(failures)
        mark_refused(store, work.profile, version, reason)
        raise QualityGateError(reason)
    mark_refused(store, work.profile, version, None)  # passed: a refusal under other rules lifted
    mark_checked(store, work.profile, version, sha)
    checked = {"parent_rows": before, "empty_answers": empty}
    return Validated(version=version, rows=rows, precision=precision, status="passed", **checked)


def publish_stage(params: RunParams, mined: Mined) -> Published:
    work = _work(params, mined)
    built = BuiltRelease.of(work.get_json(BUILT))
    if built.rows == 0:
        return Published(version=None, status="nothing_to_publish")
    pointer, _ = read_pointer(work.store, work.profile)
    if pointer and pointer.version == built.version:
        return Published(version=built.version, status="already_current")
    report = publish_uploaded(
        work.store,
        work.profile,
        built.version,
        built.manifest_sha256,
        keep=params.config.keep,
        signer=params.config.settings.signer(),
        expires_s=params.config.settings.pointer_expires_s,
        public_keys=params.config.settings.public_keys,
        high_water=params.config.settings.high_water(),
    )
    return Published(status="published", **report.as_dict())


def prune_stage(params: RunParams, mined: Mined) -> Pruned:
    return Pruned(removed=prune(open_store(params.out_uri), mined.profile, params.config.keep))


def run_stage(name: str, params: RunParams, run: str | None = None) -> dict[str, Any]:
    """One stage on its own, as ``edgeqa precompute stage`` (a Ray Job of the DAG's) runs it:
    ``mine``, or a later stage of the run ``run`` (``<profile>/<run>``, as mine decided), whose
    mine result it reads from the run's work area. The stages themselves are the ones
    ``run_pipeline`` calls in one process. Its result's JSON (what the stage's job prints)."""
    if name == "mine":
        with handed_back(params.config.settings):  # GPUs asked for ahead: not on a failure
            return mine_stage(params).as_json()
    stages: dict[str, Callable[[RunParams, Mined], StageResult]] = {
        "generate": generate_stage,
        "build": build_stage,
        "validate": validate_stage,
        "publish": publish_stage,
        "prune": prune_stage,
    }
    if name not in stages:
        raise EdgeQAError(f"unknown stage {name!r} (stages: {', '.join(STAGES)})")
    if not run:
        raise EdgeQAError(f"stage {name} needs the run mine decided (--run <profile>/<run>)")
    profile, run_id = parse_run(run)
    try:
        mined = Mined.of(WorkArea(open_store(params.out_uri), profile, run_id).get_json(MINED))
    except ObjectNotFoundError:
        raise EdgeQAError(f"run {run} has not been mined in {params.out_uri}") from None
    with handed_back(params.config.settings):
        return stages[name](params, mined).as_json()


def run_pipeline(
    params: RunParams,
    model: LoadedModel | None = None,
    progress: bool = False,
    on_stage: Callable[[str, dict[str, Any], float], None] | None = None,
) -> dict[str, Any]:
    """Every stage, in order, in this process; the run report. ``model``: an already loaded
    (model, tokenizer) to reuse; ``on_stage(name, result, seconds)`` after each stage.
    Raises ``QualityGateError`` (its ``report`` says how far the run got) when the gate refuses."""
    report: dict[str, Any] = {
        "runner": params.runner,
        "log_range": {"since": params.since.isoformat(), "until": params.until.isoformat()},
        "timings_s": {},
    }

    def stage(name: str, call: Callable[[], Result]) -> Result:
        started = time.perf_counter()
        with handed_back(params.config.settings):  # GPUs asked for ahead: not on a failure
            result = call()
        seconds = time.perf_counter() - started
        report["timings_s"][name] = round(seconds, 2)
        if on_stage is not None:
            on_stage(name, result.as_json(), seconds)  # as the DAG passes it on
        return result

    mined = stage("mine", lambda: mine_stage(params, model, progress))
    reported = mined.model_dump(mode="json", include={"logs", "mining", "excluded_rows"})
    report.update(profile=mined.profile, run_id=mined.run, **reported)
    generated = stage("generate", lambda: generate_stage(params, mined, model, progress))
    report["generation"] = generated.as_json()
    report["build"] = stage("build", lambda: build_stage(params, mined)).as_json()
    try:
        report["validate"] = stage("validate", lambda: validate_stage(params, mined)).as_json()
    except QualityGateError as error:
        error.report = {**report, "status": "refused", "version": None, "refused": str(error)}
        raise
    published = stage("publish", lambda: publish_stage(params, mined))
    report["publish"] = published.as_json()
    report["prune"] = stage("prune", lambda: prune_stage(params, mined)).as_json()
    report.update(status=published.status, version=published.version)
    report["ran_on"] = ran_on(report)
    assert list(report["timings_s"]) == list(STAGES), "run_pipeline must run STAGES in order"
    return report


def run_languages(
    params: RunParams,
    languages: tuple[str, ...],
    model: LoadedModel | None = None,
    progress: bool = False,
    on_stage: Callable[[str, dict[str, Any], float], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """``run_pipeline`` for each language profile in turn (``params.language`` replaced); the
    reports by language. Each language is its own release: one refused by the gate does not
    stop the next; ``QualityGateError`` is raised after all ran, its ``report`` holding all."""
    import dataclasses

    reports: dict[str, dict[str, Any]] = {}
    refused: list[str] = []
    for language in languages:
        run = dataclasses.replace(params, language=language)
        try:
            reports[language] = run_pipeline(run, model, progress, on_stage)
        except QualityGateError as error:
            reports[language] = error.report or {"status": "refused", "refused": str(error)}
            refused.append(f"{language}: {error}")
    if refused:
        failed = QualityGateError("; ".join(refused))
        failed.report = reports
        raise failed
    return reports
