"""What each nightly stage returns (``pipeline.py``), as typed models: mine's ``Mined`` (what the
stages after it take), then ``Generated``, ``Built``, ``Validated``, ``Published``, ``Pruned``.

A result crosses processes as JSON: the DAG passes it from task to task as XCom, a stage's Ray
Job prints it last (``fleet/jobs.py``: ``edgeqa-stage-result:``) and mine's is kept in the run's
work area (``mined.json``). ``as_json()`` is that JSON (its fields, as the dicts the stages
returned before had them), and ``of()`` reads it back. What a stage passes on from another
module's report as it is stays a dict (mine's ``mining``, build's ``upload``) or an extra field
(publish's ``publish.PublishReport``; ``extra="allow"``, also for the DAG's ``ray_job``). A
field a result leaves unset stays out of its JSON (validate's ``parent_rows`` when there is
nothing to publish).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

if TYPE_CHECKING:
    from base.logreader import LogReadStats
    from precompute.mining import MiningReport


class StageResult(BaseModel):
    """A stage's result."""

    model_config = ConfigDict(extra="allow")

    @classmethod
    def of(cls, value: Self | Mapping[str, Any]) -> Self:
        """``value`` (the result, or its JSON) as this result."""
        return value if isinstance(value, cls) else cls.model_validate(value)

    def as_json(self) -> dict[str, Any]:
        """The result as JSON holds it (XCom, the stage's last log line, ``mined.json``)."""
        return self.model_dump(mode="json", exclude_unset=True)


class LogsRead(BaseModel):
    """The log files and rows read (``base.logreader.LogReadStats``)."""

    model_config = ConfigDict(extra="allow")

    files: StrictInt
    rows: StrictInt
    bad_files: StrictInt
    malformed_rows: StrictInt
    malformed_by_field: dict[str, int]

    @classmethod
    def of(cls, stats: LogReadStats, rows: int) -> LogsRead:
        """What the reader counted, with the ``rows`` mining read."""
        return cls.model_validate({**stats.__dict__, "rows": rows})


def excluded_rows(stats: LogReadStats, mining: MiningReport) -> dict[str, int]:
    """Log rows left out of the release, by reason: malformed ones, then mining's reasons."""
    excluded = {"malformed": stats.malformed_rows} if stats.malformed_rows else {}
    excluded.update(mining.excluded_rows)
    return excluded


class BuiltRelease(StageResult):
    """The release a run built (``built.json`` in its work area): what validate checks and
    publish publishes."""

    version: StrictStr
    manifest_sha256: StrictStr
    rows: StrictInt


class Mined(StageResult):
    """``mine_stage``'s result: the run it decided (``<profile>/<run>``), its parent, the
    questions mined and how many are answered already (reused, the operator's), the partitions
    to generate; what was read and left out (the run report's ``logs``, ``excluded_rows``,
    ``mining``)."""

    profile: StrictStr
    run: StrictStr
    parent: StrictStr | None
    questions: StrictInt
    reusable: StrictInt
    curated: StrictInt
    partitions: StrictInt
    logs: LogsRead
    excluded_rows: dict[str, int]
    mining: dict[str, Any]  # ``mining.MiningReport``, the curated count and the cluster report

    @property
    def ref(self) -> str:
        """``<profile>/<run>``: what a later stage's ``--run`` names."""
        return f"{self.profile}/{self.run}"


class Generated(StageResult):
    """``generate_stage``'s: ``generate.GenerationReport`` as its ``as_dict`` writes it."""

    partitions: StrictInt
    partitions_reused: StrictInt
    answers: StrictInt
    generated: StrictInt
    reused: StrictInt  # taken from the parent release (or the operator's) instead of generated
    tokens: StrictInt
    seconds: float
    flagged: dict[str, int]
    ran_on: StrictStr
    redone: list[int]
    answers_per_s: float | None
    tokens_per_s: float | None
    seconds_saved: float | None


class Built(StageResult):
    """``build_stage``'s: the release built on ``parent``, whether its semantic tier serves,
    ``build.BuildReport``'s fields and what was uploaded (``publish.UploadReport``; empty for an
    empty release)."""

    version: StrictStr
    parent: StrictStr | None
    semantic: StrictBool
    semantic_off_reason: StrictStr | None
    clusters: StrictInt
    rows: StrictInt
    shards: StrictInt
    excluded_clusters: dict[str, int]
    seconds: float
    embedded_on: StrictStr
    steps: dict[str, dict[str, float]]  # each step's wall and CPU seconds
    upload: dict[str, Any]


class Validated(StageResult):
    """``validate_stage``'s: ``passed`` (the gate's checks, on the release where it is served), or
    ``nothing_to_publish`` (no rows: the previous release stays)."""

    version: StrictStr
    rows: StrictInt
    precision: int | float | None
    status: StrictStr
    parent_rows: StrictInt | None = None
    empty_answers: StrictInt | None = None


class Published(StageResult):
    """``publish_stage``'s: ``published`` (with ``publish.PublishReport``'s fields),
    ``already_current`` or ``nothing_to_publish`` (``version`` None)."""

    version: StrictStr | None
    status: StrictStr


class Pruned(StageResult):
    """``prune_stage``'s: the versions removed."""

    removed: list[str]


# each stage's result, by the stage's name (``config.STAGES``)
RESULTS: dict[str, type[StageResult]] = {
    "mine": Mined,
    "generate": Generated,
    "build": Built,
    "validate": Validated,
    "publish": Published,
    "prune": Pruned,
}
