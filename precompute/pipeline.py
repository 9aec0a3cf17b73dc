"""The nightly precompute, end to end: logs -> mining -> generation -> release -> publish.

``run_precompute`` is what ``edgeqa precompute run`` calls; the Airflow DAG calls the same stage
functions one task each. It returns the run report (a JSON-ready dict): counts by stage and by
exclusion reason, generation throughput next to one-at-a-time ``generate`` on a sample of the same
questions, the release version, and timings.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from edge_index.config import env_int, env_str
from edge_index.logs import LogReadStats, read_logs
from edge_index.release import read_pointer
from edge_index.store import Store
from origin.config import DEFAULT_SYSTEM_PROMPT
from precompute.build import BuildConfig, build_release
from precompute.generate import (
    GenerationConfig,
    GenerationReport,
    generate_all,
    make_engine,
    make_profile,
    run_id,
    sequential_baseline,
)
from precompute.mining import MiningConfig, mine
from precompute.publish import publish


@dataclass(frozen=True)
class PrecomputeConfig:
    mining: MiningConfig = field(default_factory=MiningConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    build: BuildConfig = field(default_factory=BuildConfig)
    embedder: str = "embedded"
    keep: int = 5
    baseline_sample: int = 8  # questions answered one at a time for the throughput comparison
    finetune_steps: int = 0  # > 0: tune the embedder on the release's phrasings and ship it

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> PrecomputeConfig:
        env = os.environ if environ is None else environ
        mining = MiningConfig(
            k=env_int(env, "EDGEQA_MIN_USERS", 5, minimum=1),
            top_n=env_int(env, "EDGEQA_TOP_N", 10_000, minimum=1),
        )
        generation = GenerationConfig(
            model=env_str(env, "EDGEQA_MODEL", "embedded"),
            max_tokens=env_int(env, "EDGEQA_MAX_TOKENS", 256, minimum=1),
            system_prompt=env_str(env, "EDGEQA_SYSTEM_PROMPT", DEFAULT_SYSTEM_PROMPT),
        )
        config = cls(
            mining=mining,
            generation=generation,
            embedder=env_str(env, "EDGEQA_EMBEDDER", "embedded"),
            keep=env_int(env, "EDGEQA_KEEP_RELEASES", 5, minimum=2),
        )
        return config.replace(**overrides) if overrides else config

    def replace(self, **changes: Any) -> PrecomputeConfig:
        """Override fields; ``k``, ``top_n``, ``max_tokens``... reach the nested configs."""
        from dataclasses import fields, replace

        nested: dict[str, dict[str, Any]] = {"mining": {}, "generation": {}, "build": {}}
        top: dict[str, Any] = {}
        for name, value in changes.items():
            if value is None:
                continue
            for part in nested:
                if name in {f.name for f in fields(getattr(self, part))}:
                    nested[part][name] = value
                    break
            else:
                top[name] = value
        parts = {p: replace(getattr(self, p), **c) for p, c in nested.items() if c}
        return replace(self, **parts, **top)


def _finetuned(
    embedder: Any, hot: list[Any], config: PrecomputeConfig, folder: Path
) -> tuple[Any, Path | None, dict[str, Any] | None]:
    """The embedder tuned on the clusters' phrasings (label = cluster), saved to ``folder``;
    the base embedder when too few clusters have two phrasings or more."""
    import copy

    from edge_index.finetune import finetune, model_digest

    texts = [p.normalized for h in hot for p in h.phrasings]
    labels = [h.key for h in hot for p in h.phrasings]
    if sum(1 for h in hot if len(h.phrasings) >= 2) < 2:
        return embedder, None, None
    tuned = finetune(copy.deepcopy(embedder), texts, labels, steps=config.finetune_steps)
    tuned.save(str(folder))
    info = {"finetuned": {"base": config.embedder, "steps": config.finetune_steps,
                          "examples": len(texts), "sha256": model_digest(folder)}}  # fmt: skip
    return tuned, folder, info


def _timed(timings: dict[str, float], name: str, started: float) -> None:
    timings[name] = round(time.perf_counter() - started, 2)


def run_precompute(
    logs: Store,
    out: Store,
    since: date,
    until: date,
    config: PrecomputeConfig | None = None,
    progress: bool = True,
    now: datetime | None = None,
    on_publish_stage: Callable[[str], None] | None = None,
    model: Any = None,
) -> dict[str, Any]:
    """Run every stage; ``model``: an already loaded (model, tokenizer) to reuse."""
    from edge_index.embedder import load_embedder
    from origin.model import load_model

    config = config or PrecomputeConfig()
    now = now or datetime.now(UTC)
    timings: dict[str, float] = {}
    report: dict[str, Any] = {"log_range": {"since": since.isoformat(), "until": until.isoformat()}}

    started = time.perf_counter()
    read_stats = LogReadStats()
    rows = read_logs(logs, since, until, read_stats)
    report["logs"] = dict(read_stats.__dict__)
    _timed(timings, "read_logs", started)

    started = time.perf_counter()
    embedder = load_embedder(config.embedder)
    hot, mining = mine(rows, embedder, config.mining, now)
    report["mining"] = mining.as_dict()
    _timed(timings, "mine", started)

    started = time.perf_counter()
    model, tokenizer = model or load_model(config.generation.model, device="auto", dtype="float32")
    profile = make_profile(config.generation, tokenizer)
    run = run_id(profile, [h.question for h in hot])
    report["profile"] = profile.name
    report["run_id"] = run
    _timed(timings, "load_model", started)

    started = time.perf_counter()
    generated, generation = generate_all(
        lambda: make_engine(model, tokenizer, config.generation),
        out,
        profile.name,
        run,
        [h.key for h in hot],
        [h.question for h in hot],
        config.generation,
        GenerationReport(),
        progress=progress,
    )
    if config.baseline_sample and generation.generated:
        sample = [h.question for h in hot[: config.baseline_sample]]
        generation.sequential_sample = sequential_baseline(
            model, tokenizer, sample, config.generation
        )
    report["generation"] = generation.as_dict()
    if generation.sequential_sample and generation.seconds:
        seq = generation.sequential_sample
        report["generation"]["speedup_vs_sequential_tokens_per_s"] = (
            round(generation.tokens / generation.seconds / seq["tokens_per_s"], 2)
            if seq.get("tokens_per_s")
            else None
        )
    _timed(timings, "generate", started)

    answers = {row["key"]: row for row in generated}
    pointer, _ = read_pointer(out, profile.name)
    parent = pointer["version"] if pointer else None
    with tempfile.TemporaryDirectory(prefix="edgeqa-release-") as tmp:
        started = time.perf_counter()
        release_embedder, embedder_dir, embedder_info = embedder, None, None
        if config.finetune_steps:
            release_embedder, embedder_dir, embedder_info = _finetuned(
                embedder, hot, config, Path(tmp) / "embedder"
            )
            timings["finetune"] = round(time.perf_counter() - started, 2)
            started = time.perf_counter()
        _manifest, build = build_release(
            Path(tmp) / "release",
            hot,
            answers,
            release_embedder,
            config.embedder,
            profile.name,
            profile.inputs,
            config.build,
            extra={
                "parent": parent,
                "run_id": run,
                "log_range": report["log_range"],
                "mining": {
                    "k": config.mining.k,
                    "top_n": config.mining.top_n,
                    "half_life_days": config.mining.half_life_days,
                    "cluster_threshold": config.mining.cluster_threshold,
                },
            },
            now=now,
            embedder_dir=embedder_dir,
            embedder_info=embedder_info,
        )
        report["build"] = build.as_dict()
        _timed(timings, "build", started)
        if build.rows == 0:
            report["status"] = "nothing_to_publish"
            report["version"] = None
        else:
            started = time.perf_counter()
            published = publish(
                out, Path(tmp) / "release", keep=config.keep, on_stage=on_publish_stage
            )
            report["publish"] = published.as_dict()
            report["version"] = published.version
            report["status"] = "published"
            _timed(timings, "publish", started)
    excluded = dict(read_stats.malformed_by_field and {"malformed": read_stats.malformed_rows})
    excluded.update(mining.excluded_rows)
    report["excluded_rows"] = excluded
    report["timings_s"] = timings
    return report
