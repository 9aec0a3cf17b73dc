"""What a generation job on the fleet is, whichever engine answers: the run it answers
(``Job``: its work area, partitions and settings, handed to every worker), the engine Ray Data's
LLM API drives when it is not the project's (``LLMEngine``), and what the job did
(``Generated``: a row per partition). ``generation.py`` runs it with the project's engine in
each actor, ``llm.py`` with vLLM or an HTTP server."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from precompute.fleet import Fleet, shipped

if TYPE_CHECKING:
    from origin.config import EngineSettings
    from origin.precision import EngineQuantization
    from precompute.config import PrecomputeSettings
    from precompute.workarea import WorkArea


@dataclass(frozen=True)
class LLMEngine:
    """What Ray Data's LLM API is built from for a run: the engine (``vllm`` or ``http``), the
    model (vLLM's checkpoint; the server's API name), the weights and, for HTTP, the server."""

    engine: str
    model: str
    quantization: str
    url: str = ""
    api_key: str = field(default="", repr=False)  # a secret: never in a log or report

    @classmethod
    def of(cls, settings: PrecomputeSettings, quantization: str) -> LLMEngine | None:
        """The run's engine on Ray Data's LLM API; None for the project's own
        (``EDGEQA_GENERATION_ENGINE=edgeqa``)."""
        from origin.config import OriginSettings

        if settings.generation_engine == "vllm":
            return cls("vllm", settings.vllm_model, settings.vllm_quantization)
        if settings.generation_engine == "http":
            name = OriginSettings.model_construct(model=settings.model).api_model_name
            return cls(
                "http", name, quantization, settings.generation_url, settings.generation_api_key
            )
        return None

    def describe(self) -> str:
        """What the run report says generated the answers (no secret, no credentials)."""
        if self.engine == "vllm":
            return f"vLLM via ray.data.llm: {self.model}, {self.quantization}"
        return f"{self.url} via ray.data.llm's HTTP processor: {self.model}, {self.quantization}"


@dataclass(frozen=True)
class Job:
    """One run's generation, as its actors need it: where its work area is and how to answer."""

    out_uri: str  # the store's absolute URI: an actor's working folder is not the driver's
    profile: str
    run: str
    settings: EngineSettings
    quantization: EngineQuantization
    generated_at: datetime
    partition_size: int  # questions a partition
    questions: int  # in the run's hot/
    own_cache: bool = False  # the actors use their own EDGEQA_CACHE_DIR (a fleet's machines)
    # the engine Ray Data's LLM API drives instead of the project's (``llm.py``: vLLM, HTTP)
    llm: LLMEngine | None = None

    @classmethod
    def of(
        cls,
        fleet: Fleet,
        settings: PrecomputeSettings,
        quantization: EngineQuantization,
        work: WorkArea,
        generated_at: datetime,
        partition_size: int,
        questions: int,
    ) -> Job:
        """The job of ``work``'s run (``questions`` in ``hot/``, ``partition_size`` a partition)
        on ``fleet``, its settings without a secret (``shipped``), its engine the settings'
        (``EDGEQA_GENERATION_ENGINE``)."""
        engine = shipped(settings)
        return cls(
            work.store.uri,
            work.profile,
            work.run,
            engine,
            quantization,
            generated_at,
            partition_size,
            questions,
            not fleet.local,
            LLMEngine.of(settings, quantization),
        )


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
