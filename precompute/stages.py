"""The nightly pipeline as stages, for a scheduler that runs them as separate tasks (Airflow).

``run_precompute`` (pipeline.py) runs everything in one process; here each stage is one call that
reads what the previous stages left in the output store under ``<profile>/work/<run>/`` and returns
a small JSON-able dict (Airflow passes it on as XCom), so tasks may run on different workers:

    mine -> generate(partition) x N -> build -> validate -> publish -> prune

- ``mine_stage``: read the logs of the window, mine hot questions, decide the profile and run id
  (a digest of the profile and the questions), write ``hot.json``; return the partition indexes.
- ``generate_stage``: answer one partition, checkpointed in the store (a finished partition is
  reused by any later run of the same questions).
- ``build_stage``: build the release (FAISS shards, answer objects, manifest) from the
  partitions and upload it to ``<profile>/work/<run>/release/``. Built with ``now`` = the end of the
  data interval, so re-running an interval yields the same version and content.
- ``validate_stage``: the quality gate (``QualityGateError`` keeps the previous release live).
- ``publish_stage``: the atomic publish of the staged release (a no-op when it is already current).
- ``prune_stage``: drop releases beyond the newest ``keep``.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from edge_index.logs import LogReadStats, read_logs
from edge_index.release import read_pointer, release_prefix
from edge_index.store import ObjectNotFoundError, Store, open_store
from precompute.build import build_release
from precompute.generate import generate_all, make_engine, make_profile, partitions, run_id
from precompute.mining import HotQuestion, Phrasing, mine
from precompute.pipeline import PrecomputeConfig
from precompute.publish import prune, publish


class QualityGateError(RuntimeError):
    """The built release must not be published; the previous one stays live."""


@dataclass(frozen=True)
class GateConfig:
    min_rows: int = 1
    # the calibrated leave-one-out precision of the semantic tier must reach this
    min_precision: float = 0.95
    # refuse a release with fewer than (1 - max_shrink) x the parent's rows
    max_shrink: float = 0.5


@dataclass(frozen=True)
class StageParams:
    logs_uri: str
    out_uri: str
    since: date
    until: date
    config: PrecomputeConfig = field(default_factory=PrecomputeConfig)
    gate: GateConfig = field(default_factory=GateConfig)

    @property
    def now(self) -> datetime:
        """The end of the data interval: what the release is built 'as of'."""
        return datetime(self.until.year, self.until.month, self.until.day, 23, 59, 59, tzinfo=UTC)


def _work(profile: str, run: str) -> str:
    return f"{profile}/work/{run}"


def _phrasing_dict(p: Phrasing) -> dict[str, Any]:
    return {
        "key": p.key, "normalized": p.normalized, "question": p.question,
        "users": sorted(p.users), "hits": p.hits,
        "latest_by_user": {u: t.isoformat() for u, t in p.latest_by_user.items()},
    }  # fmt: skip


def _phrasing(d: dict[str, Any]) -> Phrasing:
    return Phrasing(
        d["key"], d["normalized"], d["question"], set(d["users"]), d["hits"],
        {u: datetime.fromisoformat(t) for u, t in d["latest_by_user"].items()},
    )  # fmt: skip


def _save_hot(
    store: Store, profile: str, run: str, hot: list[HotQuestion], inputs: dict[str, Any]
) -> None:
    items = [
        {
            "phrasings": [_phrasing_dict(p) for p in h.phrasings],  # canonical first
            "users": h.users,
            "hits": h.hits,
            "score": h.score,
        }
        for h in hot
    ]
    store.put(f"{_work(profile, run)}/hot.json", json.dumps(items).encode())
    store.put(f"{_work(profile, run)}/profile.json", json.dumps(inputs, sort_keys=True).encode())


def _load_hot(store: Store, profile: str, run: str) -> list[HotQuestion]:
    items = json.loads(store.get(f"{_work(profile, run)}/hot.json"))
    hot = []
    for item in items:
        phrasings = [_phrasing(p) for p in item["phrasings"]]
        hot.append(HotQuestion(phrasings[0], phrasings, item["users"], item["hits"], item["score"]))
    return hot


def _tokenizer(config: PrecomputeConfig) -> Any:
    from origin.model import load_model

    return load_model(config.generation.model, device="cpu", dtype="float32")[1]


def mine_stage(params: StageParams) -> dict[str, Any]:
    from edge_index.embedder import load_embedder

    config = params.config
    stats = LogReadStats()
    rows = read_logs(open_store(params.logs_uri), params.since, params.until, stats)
    hot, mining = mine(rows, load_embedder(config.embedder), config.mining, params.now)
    profile = make_profile(config.generation, _tokenizer(config))
    run = run_id(profile, [h.question for h in hot])
    out = open_store(params.out_uri)
    _save_hot(out, profile.name, run, hot, profile.inputs)
    count = len(partitions(hot, config.generation.partition_size))
    excluded = dict(mining.excluded_rows)
    if stats.malformed_rows:
        excluded["malformed"] = stats.malformed_rows
    return {
        "profile": profile.name, "run": run, "questions": len(hot),
        "partitions": list(range(count)), "logs": {"rows": len(rows), "files": stats.files},
        "excluded_rows": excluded, "mining": mining.as_dict(),
    }  # fmt: skip


def generate_stage(params: StageParams, profile: str, run: str, partition: int) -> dict[str, Any]:
    from origin.model import load_model

    config = params.config
    out = open_store(params.out_uri)
    hot = _load_hot(out, profile, run)
    loaded: list[Any] = []

    def engine() -> Any:
        if not loaded:
            loaded.extend(load_model(config.generation.model, device="auto", dtype="float32"))
        return make_engine(loaded[0], loaded[1], config.generation)

    _, report = generate_all(
        engine, out, profile, run, [h.key for h in hot], [h.question for h in hot],
        config.generation, only=[partition], progress=False,
    )  # fmt: skip
    return {"partition": partition, **report.as_dict()}


def build_stage(params: StageParams, profile: str, run: str) -> dict[str, Any]:
    from edge_index.embedder import load_embedder

    config = params.config
    out = open_store(params.out_uri)
    hot = _load_hot(out, profile, run)

    def missing() -> Any:
        raise RuntimeError("a generation partition is missing: run the generate tasks first")

    rows, _ = generate_all(
        missing, out, profile, run, [h.key for h in hot], [h.question for h in hot],
        config.generation, progress=False,
    )  # fmt: skip
    pointer, _ = read_pointer(out, profile)
    parent = pointer["version"] if pointer else None
    staged = f"{_work(profile, run)}/release"
    out.delete_prefix(staged)
    with tempfile.TemporaryDirectory(prefix="edgeqa-build-") as tmp:
        manifest, report = build_release(
            Path(tmp), hot, {r["key"]: r for r in rows}, load_embedder(config.embedder),
            config.embedder, profile, json.loads(out.get(f"{_work(profile, run)}/profile.json")),
            config.build, extra={
                "parent": parent, "run_id": run,
                "log_range": {"since": params.since.isoformat(), "until": params.until.isoformat()},
            },
            now=params.now,
        )  # fmt: skip
        for path in sorted(Path(tmp).rglob("*")):
            if path.is_file():
                out.put_file(f"{staged}/{path.relative_to(tmp).as_posix()}", path)
    return {"version": manifest["version"], "parent": parent, **report.as_dict()}


def _staged_manifest(out: Store, profile: str, run: str) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(out.get(f"{_work(profile, run)}/release/manifest.json"))
    return manifest


def validate_stage(params: StageParams, profile: str, run: str) -> dict[str, Any]:
    """The quality gate: raise ``QualityGateError`` naming every failed check."""
    gate, out = params.gate, open_store(params.out_uri)
    manifest = _staged_manifest(out, profile, run)
    rows = int(manifest["counts"]["rows"])
    failures = []
    if rows < gate.min_rows:
        failures.append(f"the release has {rows} rows (at least {gate.min_rows} required)")
    empty = _empty_answers(out, profile, run, manifest)
    if empty:
        failures.append(f"{empty} answers are empty")
    threshold = manifest.get("threshold", {})
    # leave-one-out precision of the semantic tier at the decision the release ships (measured
    # whenever some phrasings hit; an uncalibrated release measures its fallback decision)
    if threshold.get("hit_rate") and float(threshold["precision"]) < gate.min_precision:
        failures.append(
            f"calibrated precision {threshold['precision']} is below {gate.min_precision}"
        )
    parent_rows = None
    if manifest.get("parent"):
        try:
            parent = json.loads(
                out.get(f"{release_prefix(profile, manifest['parent'])}/manifest.json")
            )
            parent_rows = int(parent["counts"]["rows"])
        except ObjectNotFoundError:
            parent_rows = None
    if parent_rows and rows < (1 - gate.max_shrink) * parent_rows:
        failures.append(
            f"the release shrinks from {parent_rows} to {rows} rows "
            f"(more than {gate.max_shrink:.0%})"
        )
    result = {"version": manifest["version"], "rows": rows, "parent_rows": parent_rows,
              "empty_answers": empty, "precision": threshold.get("precision"),
              "gate": asdict(gate)}  # fmt: skip
    if failures:
        raise QualityGateError(f"release {manifest['version']} refused: " + "; ".join(failures))
    return result


def _empty_answers(out: Store, profile: str, run: str, manifest: dict[str, Any]) -> int:
    import io

    import pyarrow.parquet as pq

    empty = 0
    for shard in manifest.get("shards", []):
        table = pq.read_table(
            io.BytesIO(out.get(f"{_work(profile, run)}/release/{shard['rows']['path']}"))
        )
        empty += sum(1 for a in table.column("answer").to_pylist() if not (a or "").strip())
    return empty


def publish_stage(params: StageParams, profile: str, run: str) -> dict[str, Any]:
    out = open_store(params.out_uri)
    manifest = _staged_manifest(out, profile, run)
    pointer, _ = read_pointer(out, profile)
    if pointer and pointer.get("version") == manifest["version"]:
        return {"version": manifest["version"], "status": "already_current"}
    staged = f"{_work(profile, run)}/release/"
    with tempfile.TemporaryDirectory(prefix="edgeqa-publish-") as tmp:
        for path in out.list(staged):
            target = Path(tmp) / path[len(staged) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(out.get(path))
        report = publish(out, Path(tmp), keep=params.config.keep)
    return {"status": "published", **report.as_dict()}


def prune_stage(params: StageParams, profile: str) -> dict[str, Any]:
    removed = prune(open_store(params.out_uri), profile, params.config.keep)
    return {"removed": removed}
