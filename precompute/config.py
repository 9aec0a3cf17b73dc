"""The nightly job's settings and the parameters of one run.

A leaf module (dataclasses and settings only), light enough for the DAG file to import while
Airflow parses it.

- ``PrecomputeSettings``: the ``EDGEQA_*`` variables the nightly job reads (the model, the engine's
  sizes, the embedder — shared with the origin — plus mining's k and top-N and releases kept).
- ``MiningConfig``, ``GenerationConfig``, ``BuildConfig``, ``GateConfig``: each stage's knobs.
- ``PipelineConfig``: all of them for one run. ``RUN_OPTIONS`` is the one list of what an operator
  sets per run — the ``edgeqa precompute run`` options and the DAG's params are both made from it,
  with the defaults of the field each one sets. A run cannot lower the bar the settings set: k
  only rises above ``EDGEQA_MIN_USERS``, and the stores and the curated answers' pin are the
  deployment's alone (``DEPLOYMENT_ONLY``, ``check_run_config``: a DAG run config naming one is
  refused).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from base.config import MAX_OUT_OF_SCOPE_SHARE, OUT_OF_SCOPE_SHARE, ConfigError, usable_cpus
from base.pointers import DEFAULT_EXPIRES_S
from base.signing import LocalSigner, Signer, signer_from
from origin.config import EngineSettings
from origin.precision import ENGINE_QUANTIZATIONS, EngineQuantization

log = logging.getLogger(__name__)

# the nightly pipeline's stages, in order (``pipeline.py`` runs them; the DAG has a task each)
STAGES = ("mine", "generate", "build", "validate", "publish", "prune")


class PrecomputeSettings(EngineSettings):
    """The nightly job: the origin's model and engine settings, and its own."""

    min_users: int = Field(5, ge=1)  # k: distinct users who must have asked
    # the crowd rule (precompute/mining.py): of those, at least this many signed users (a token
    # the deployment's backend signed, EDGEQA_IDENTITY_SECRET), and askers from at least this
    # many autonomous systems (the services' EDGEQA_ASN_TABLE); 0 = that part off
    min_signed_users: int = Field(3, ge=0)
    min_asns: int = Field(0, ge=0)
    # both of those 0 (the crowd rule off: k askers anyone can mint from k networks) is refused
    # unless this says the deployment means it
    allow_unverified_crowd: bool = False
    # the clusters a night publishes at most: the seed's "hottest million"; k decides the rest
    top_n: int = Field(1_000_000, ge=1)
    # DuckDB's memory while it reduces the log window; past it, it spills to a temporary folder
    mining_memory_mb: int = Field(1024, ge=64)
    # processes the mining stage's text rules run on; 0 = one per CPU the stage may use
    mining_workers: int = Field(0, ge=0)
    keep_releases: int = Field(5, ge=2)
    # where embedding and generation run (precompute/fleet/): "" = a local Ray started by the
    # run; else the cluster's address (ray://head:10001)
    ray_address: str = ""
    # the Ray Jobs API each task of the Airflow DAG submits its stage to (``fleet/jobs.py``):
    # the cluster head's dashboard port; a local one: ``ray start --head``
    ray_jobs_address: str = "http://127.0.0.1:8265"
    # Ray's token (a cluster started with RAY_AUTH_MODE=token), sent to the Jobs API as a bearer
    # token: a secret, from the environment only ("" = a Jobs API without token authentication)
    ray_jobs_token: str = ""
    # the Ray resource of the cluster's CPU workers (Terraform's "cpu_worker"): the drivers of
    # the CPU stages (mine, build, validate) ask for one (``fleet/jobs.py``); "" = the head's
    ray_cpu_resource: str = Field("", pattern=r"^[A-Za-z0-9_]{0,64}$")
    # the most model actors (one engine or embedder each) a job runs at once; 0 = one per CPU
    # slot (or GPU) locally, and on a cluster as many GPU workers as it has, at least 8
    ray_workers: int = Field(0, ge=0)
    # base64 Ed25519 private key releases are signed with ("" = published unsigned) ...
    signing_key: str = ""
    # ... or an AWS KMS key (id, ARN or alias) of spec ECC_NIST_EDWARDS25519, which wins
    signing_kms_key: str = ""
    # how long a signed current.json stays fresh (base/pointers.py); the nightly renews it
    pointer_expires_s: float = Field(DEFAULT_EXPIRES_S, gt=0)
    # the curated answers file (JSON Lines, a path or s3:// URI; precompute/curated.py) the
    # nightly publishes for the questions it answers ("": none), and the sha256 it must have: the
    # file an operator reviewed. The pin is the deployment's alone (no run option sets it); a
    # file whose digest differs is refused, nothing of it published
    curated_answers: str = ""
    curated_answers_sha256: str = ""
    # what generates the answers (precompute/fleet/llm.py): the project's engine on the Ray
    # actors (the local default: CPU, or the fleet's GPUs), vLLM on the fleet's GPUs through Ray
    # Data's LLM API, or an OpenAI-compatible server serving EDGEQA_MODEL at the run's precision
    # (the project's origin) through the same API's HTTP processor
    generation_engine: Literal["edgeqa", "vllm", "http"] = "edgeqa"
    # vllm: the checkpoint (an s3:// models prefix the workers' role reads, or a folder with its
    # config.json and tokenizer) and its weights: "w8a8", an INT8 W8A8 checkpoint
    # (compressed-tensors), or "fp16", an unquantized one served in float16
    vllm_model: str = ""
    vllm_quantization: Literal["w8a8", "fp16"] = "w8a8"
    # http: the server's base URL (http://host:port) and its API key (a secret: environment only)
    generation_url: str = ""
    generation_api_key: str = ""

    @field_validator("ray_address", mode="after")
    @classmethod
    def _ray_address(cls, value: str) -> str:
        found = re.fullmatch(r"(ray://)?[A-Za-z0-9.\-]+:(\d{1,5})|auto", value)
        if value and (not found or (found.group(2) and not 0 < int(found.group(2)) < 65536)):
            raise ValueError(
                f"{value!r} is not a Ray address: ray://<head>:10001 (Ray Client), "
                "<head>:6379 (inside the cluster) or auto"
            )
        return value

    @field_validator("ray_jobs_address", mode="after")
    @classmethod
    def _ray_jobs_address(cls, value: str) -> str:
        found = re.fullmatch(r"https?://[A-Za-z0-9.\-]+(:(\d{1,5}))?/?", value)
        if not found or (found.group(2) and not 0 < int(found.group(2)) < 65536):
            raise ValueError(
                f"{value!r} is not the Ray Jobs API's address: http://<head>:8265 (the head's "
                "dashboard port)"
            )
        return value.rstrip("/")

    @field_validator("curated_answers_sha256", mode="after")
    @classmethod
    def _curated_answers_sha256(cls, value: str) -> str:
        if value and not re.fullmatch(r"[0-9A-Fa-f]{64}", value):
            raise ValueError(
                f"{value!r} is not a sha256 (64 hexadecimal digits, as `sha256sum FILE` prints)"
            )
        return value.lower()

    @field_validator("signing_key", mode="after")
    @classmethod
    def _signing_key(cls, value: str) -> str:
        if value:
            LocalSigner(value)  # a malformed key fails here, naming the variable
        return value

    @field_validator("vllm_quantization", "generation_engine", mode="before")
    @classmethod
    def _lower_choice(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("generation_url", mode="after")
    @classmethod
    def _generation_url(cls, value: str) -> str:
        found = re.fullmatch(r"https?://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:]+\])(:(\d{1,5}))?/?", value)
        if value and (not found or (found.group(3) and not 0 < int(found.group(3)) < 65536)):
            raise ValueError(f"{value!r} is not a server's base URL: http(s)://<host>:<port>")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _crowd_rule(self) -> PrecomputeSettings:
        if self.min_signed_users == 0 and self.min_asns == 0 and not self.allow_unverified_crowd:
            raise ValueError(
                "EDGEQA_MIN_SIGNED_USERS=0 with EDGEQA_MIN_ASNS=0 turns the crowd rule off: k "
                "askers anyone can mint from k rented networks would publish. Set "
                "EDGEQA_MIN_ASNS (with EDGEQA_ASN_TABLE on the services) or "
                "EDGEQA_MIN_SIGNED_USERS, or EDGEQA_ALLOW_UNVERIFIED_CROWD=true if you mean it"
            )
        return self

    @model_validator(mode="after")
    def _generation_needs(self) -> PrecomputeSettings:
        if self.generation_engine == "vllm" and not self.vllm_model:
            raise ValueError(
                "EDGEQA_GENERATION_ENGINE=vllm needs EDGEQA_VLLM_MODEL: the checkpoint vLLM "
                "loads (s3://<bucket>/models/<name>, or a folder)"
            )
        if self.generation_engine == "http" and not self.generation_url:
            raise ValueError(
                "EDGEQA_GENERATION_ENGINE=http needs EDGEQA_GENERATION_URL: the base URL of an "
                "OpenAI-compatible server serving EDGEQA_MODEL (http://host:port)"
            )
        return self

    def signer(self) -> Signer | None:
        """What signs releases (``base/signing.py``); None = published unsigned."""
        return signer_from(self.signing_key, self.signing_kms_key)


@dataclass(frozen=True)
class MiningConfig:
    k: int = 5
    # the crowd rule: what a question (and every token of a published text) needs besides k
    # askers: that many of them signed users, from that many autonomous systems (0: not needed)
    min_signed_users: int = 3
    min_asns: int = 0
    top_n: int = 1_000_000
    half_life_days: float = 7.0
    # wordings at or above this cosine are one question; None: the embedder's own
    # (``semantic.embedder.score_scale``), else estimated from the night's scores
    cluster_threshold: float | None = None
    # the neighbour search clustering runs (``clustering.py``): exact up to ``exact_cluster_rows``
    # wordings, past it an inverted file of ~``cluster_list_rows`` wordings a list, searched in
    # the ``cluster_nprobe`` nearest lists
    exact_cluster_rows: int = 20_000
    cluster_list_rows: int = 256
    cluster_nprobe: int = 16
    # past exact_cluster_rows, probes double until the search finds this share of the
    # neighbours an exact search finds for sampled wordings
    cluster_recall: float = 0.99
    # the latest askers (users, networks) kept by name per wording, and never fewer than k (that
    # decides k exactly: ``logwindow.py``); the rest are counted
    askers_kept: int = 1024
    # DuckDB's memory limit while it reduces the log window (it spills to disk past it)
    memory_mb: int = 1024
    # processes the text rules run on (``textrules.judge_all``); 0: one per CPU this process may
    # use (``base.config.usable_cpus``: its affinity and cgroup quota). A night with fewer than
    # ``logwindow.PARALLEL_TEXTS`` texts to judge judges them here
    rule_workers: int = 0
    # one identity's (one network's) rows that count in a window: past it, theirs are dropped
    max_rows_per_user: int = 500
    max_rows_per_network: int = 5000
    # the parent run's evidence (asks) is carried forward while younger than this many
    # half-lives (4: weight 1/16, 28 days at a 7-day half-life); 0: nothing is carried
    carry_half_lives: float = 4.0

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ConfigError("k must be at least 1")
        if self.min_signed_users < 0 or self.min_asns < 0:
            raise ConfigError("min_signed_users and min_asns must not be negative")
        if self.top_n < 1:
            raise ConfigError("top_n must be at least 1")
        if self.half_life_days <= 0:
            raise ConfigError("half_life_days must be positive")
        if self.cluster_threshold is not None and not 0 < self.cluster_threshold <= 1:
            raise ConfigError("cluster_threshold must be in (0, 1]")
        if self.max_rows_per_user < 1 or self.max_rows_per_network < 1:
            raise ConfigError("max_rows_per_user and max_rows_per_network must be at least 1")
        if self.carry_half_lives < 0:
            raise ConfigError("carry_half_lives must not be negative")
        if (
            min(
                self.askers_kept,
                self.exact_cluster_rows,
                self.cluster_list_rows,
                self.cluster_nprobe,
            )
            < 1
        ):
            raise ConfigError(
                "askers_kept, exact_cluster_rows, cluster_list_rows and cluster_nprobe must be >= 1"
            )
        if not 0 < self.cluster_recall <= 1:
            raise ConfigError("cluster_recall must be in (0, 1]")
        if self.memory_mb < 64:
            raise ConfigError("memory_mb must be at least 64")
        if self.rule_workers < 0:
            raise ConfigError("rule_workers must not be negative")

    def workers(self) -> int:
        """The processes the text rules run on (``rule_workers``, 0: this process's CPUs)."""
        return self.rule_workers or usable_cpus()

    @property
    def kept_askers(self) -> int:
        """Askers (users, networks, ASes) kept by name per wording: ``askers_kept``, and at
        least k and ``min_asns`` (so those are decided exactly)."""
        return max(self.askers_kept, self.k, self.min_asns)

    def verified_crowd(self, signers: int, asns: int) -> bool:
        """The crowd rule: ``signers`` distinct signed users and ``asns`` distinct autonomous
        systems among the askers are enough."""
        return signers >= self.min_signed_users and asns >= self.min_asns


@dataclass(frozen=True)
class GenerationConfig:
    # INT8 unless told otherwise: the nightly job answers in bulk, where INT8 pays. Not "auto":
    # the release's profile names the weights its answers came from
    quantization: EngineQuantization = "int8"
    partition_size: int = 64  # questions per checkpointed partition (one DAG task each)
    # the parent release's answer to a cluster is reused (not generated again) while younger
    # than this fraction of the build's ttl_days, so it has at least the rest to live; 0: never
    reuse_ttl_fraction: float = 0.5
    # a JSON Lines file of operator answers ({"question", "answer"}; precompute/curated.py)
    # published for the mined questions they answer instead of generated ones; "": none
    curated_answers: str = ""

    def __post_init__(self) -> None:
        if self.quantization not in ENGINE_QUANTIZATIONS:
            raise ConfigError(f"quantization must be one of {', '.join(ENGINE_QUANTIZATIONS)}")
        if self.partition_size < 1:
            raise ConfigError("partition_size must be at least 1")
        if not 0 <= self.reuse_ttl_fraction <= 1:
            raise ConfigError("reuse_ttl_fraction must be in [0, 1]")


@dataclass(frozen=True)
class BuildConfig:
    factory: str = "auto"
    ef_construction: int = 200
    ef_search: int = 128
    ivf_rows: int = 200_000  # HNSW below, IVF from here (HNSW builds slowly at millions of rows)
    nprobe: int = 16  # IVF lists searched per query
    shard_rows: int = 2_000_000
    ttl_days: float = 7.0
    ttl_jitter: float = 0.2
    # when calibration cannot show the target precision (too few phrasings, or an embedder that
    # does not separate them), the release's semantic tier is off: exact hits only. This
    # decision is measured and reported then, and served only with ``semantic_uncalibrated``
    # (a decision known good from elsewhere; the small releases of tests)
    # None: the embedder's measured decision (``semantic.embedder.score_scale``), else 0.9/0.05
    threshold: float | None = None
    margin: float | None = None
    semantic_uncalibrated: bool = False
    target_precision: float = 0.99
    # calibration counts this share of semantic lookups as about questions the release does not
    # hold (its leave-label-out hits as wrong answers: ``semantic.matcher.calibrate``)
    out_of_scope_share: float = OUT_OF_SCOPE_SHARE
    # leave-one-out calibration on at most this many phrasings (and as many held-back wordings)
    calibration_rows: int = 20_000
    # publish answers that send the reader elsewhere (policy/answers.py's "link"):
    # EDGEQA_ALLOW_ANSWER_LINKS; off, such an answer's cluster is left out (answer_link)
    allow_links: bool = False

    def __post_init__(self) -> None:
        if self.ef_construction < 1 or self.shard_rows < 1 or self.ttl_days <= 0:
            raise ConfigError("ef_construction, shard_rows and ttl_days must be positive")
        if not 0 <= self.ttl_jitter < 1:
            raise ConfigError("ttl_jitter must be in [0, 1)")
        if not 0 <= self.out_of_scope_share <= MAX_OUT_OF_SCOPE_SHARE:
            raise ConfigError(f"out_of_scope_share must be in [0, {MAX_OUT_OF_SCOPE_SHARE}]")


@dataclass(frozen=True)
class GateConfig:
    """The quality gate between build and publish."""

    min_rows: int = 1
    # the calibrated leave-one-out precision of the semantic tier must reach this
    min_precision: float = 0.95
    # refuse a release with fewer than (1 - max_shrink) x the parent's rows
    max_shrink: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.max_shrink <= 1:
            raise ConfigError("max_shrink must be in [0, 1]")


@dataclass(frozen=True)
class PipelineConfig:
    settings: PrecomputeSettings
    mining: MiningConfig = field(default_factory=MiningConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    build: BuildConfig = field(default_factory=BuildConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    # > 0: tune the embedder on the release's phrasings and ship it in the release
    finetune_steps: int = 0

    def __post_init__(self) -> None:
        # what is published never depends on a file someone changed after it was reviewed
        if self.generation.curated_answers and not self.settings.curated_answers_sha256:
            raise ConfigError(
                "curated answers (--answers, EDGEQA_CURATED_ANSWERS) are read only pinned: set "
                "EDGEQA_CURATED_ANSWERS_SHA256 to the sha256 of the file you reviewed "
                "(sha256sum FILE)"
            )

    @classmethod
    def from_settings(cls, settings: PrecomputeSettings) -> PipelineConfig:
        if settings.min_signed_users == 0 and settings.min_asns == 0:
            log.warning(
                "the crowd rule is off (EDGEQA_MIN_SIGNED_USERS=0, EDGEQA_MIN_ASNS=0, "
                "EDGEQA_ALLOW_UNVERIFIED_CROWD): k askers of any kind publish a question"
            )
        mining = MiningConfig(
            k=settings.min_users,
            min_signed_users=settings.min_signed_users,
            min_asns=settings.min_asns,
            top_n=settings.top_n,
            memory_mb=settings.mining_memory_mb,
            rule_workers=settings.mining_workers,
        )
        generation = GenerationConfig(curated_answers=settings.curated_answers)
        build = BuildConfig(allow_links=settings.allow_answer_links)
        return cls(settings, mining, generation, build)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> PipelineConfig:
        """The ``EDGEQA_*`` settings, then the run's ``options`` (``RUN_OPTIONS`` names; ``None``:
        not given) on top. An option that would lower a floor the settings set (``k`` below
        ``EDGEQA_MIN_USERS``) is refused, as is one only the deployment sets (``DEPLOYMENT_ONLY``:
        the answers' pin)."""
        by_name = {o.name: o for o in RUN_OPTIONS}
        refused = sorted(set(options) & (set(DEPLOYMENT_ONLY) - set(by_name)))
        if refused:
            raise ConfigError(deployment_only(refused[0]))
        unknown = set(options) - set(by_name)
        if unknown:
            raise ConfigError(f"unknown run options: {', '.join(sorted(unknown))}")
        given = {n: v for n, v in options.items() if v is not None}
        deployed = PrecomputeSettings.from_env(environ)
        overrides = {
            by_name[n].field: v for n, v in given.items() if by_name[n].section == "settings"
        }
        settings = PrecomputeSettings.from_env(environ, **overrides) if overrides else deployed
        for option in (o for o in RUN_OPTIONS if o.floor and o.name in given):
            value, floor = getattr(settings, option.field), getattr(deployed, option.field)
            if value < floor:
                raise ConfigError(
                    f"{option.name}={value} is below EDGEQA_{option.field.upper()}={floor}: a run "
                    f"may raise {option.name}, not lower it (the deployment lowers "
                    f"EDGEQA_{option.field.upper()} itself where it means to)"
                )
        sections: dict[str, dict[str, Any]] = {}
        for name, value in given.items():
            option = by_name[name]
            if option.section != "settings":
                sections.setdefault(option.section, {})[option.field] = value
        return cls.from_settings(settings).replace(**sections)

    def replace(
        self,
        *,
        mining: Mapping[str, Any] | None = None,
        generation: Mapping[str, Any] | None = None,
        build: Mapping[str, Any] | None = None,
        gate: Mapping[str, Any] | None = None,
        run: Mapping[str, Any] | None = None,
    ) -> PipelineConfig:
        """A copy with fields of the named parts changed: ``replace(mining={"k": 3})``; ``run``
        holds this class's own fields (``finetune_steps``)."""
        return dataclasses.replace(
            self,
            mining=dataclasses.replace(self.mining, **(mining or {})),
            generation=dataclasses.replace(self.generation, **(generation or {})),
            build=dataclasses.replace(self.build, **(build or {})),
            gate=dataclasses.replace(self.gate, **(gate or {})),
            **(run or {}),
        )

    @property
    def keep(self) -> int:
        return self.settings.keep_releases


@dataclass(frozen=True)
class RunOption:
    """One parameter an operator sets per run: a CLI option and a DAG param."""

    name: str
    section: str  # "settings", "generation", "build", "gate" or "run": where its value goes
    field: str
    kind: type
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    # the deployment's setting is a floor: a run may raise it, never lower it (k)
    floor: bool = False
    # offered as a param of the Airflow DAG (else the cluster's setting alone: the answers file)
    dag: bool = True

    @property
    def default(self) -> Any:
        if self.section == "settings":
            return PrecomputeSettings.model_fields[self.field].default
        owner = {
            "generation": GenerationConfig,
            "build": BuildConfig,
            "gate": GateConfig,
            "run": PipelineConfig,
        }
        for f in dataclasses.fields(owner[self.section]):
            if f.name == self.field:
                return f.default
        raise AssertionError(f"{self.section} has no field {self.field}")


RUN_OPTIONS = (
    RunOption(
        "k",
        "settings",
        "min_users",
        int,
        "distinct users who must have asked (raised, never below EDGEQA_MIN_USERS)",
        1,
        floor=True,
    ),
    RunOption("top_n", "settings", "top_n", int, "question clusters kept", 1),
    RunOption("max_tokens", "settings", "max_tokens", int, "tokens per answer", 1),
    RunOption(
        "quantization",
        "generation",
        "quantization",
        str,
        "the weights answers are generated with",
        choices=ENGINE_QUANTIZATIONS,
    ),
    RunOption("partition_size", "generation", "partition_size", int, "questions per partition", 1),
    RunOption(
        "answers",
        "settings",
        "curated_answers",
        str,
        "JSON Lines of operator answers ({question, answer}, a path or s3:// URI) published for "
        "the mined questions they answer instead of generated ones; read only when its sha256 is "
        "EDGEQA_CURATED_ANSWERS_SHA256 (not a DAG param: the cluster's setting)",
        dag=False,
    ),
    RunOption("keep", "settings", "keep_releases", int, "releases kept for rollback", 2),
    RunOption(
        "ttl_days",
        "build",
        "ttl_days",
        float,
        "days a published answer is served (plus up to 20% jitter) before it expires",
        0.01,
    ),
    RunOption(
        "out_of_scope_share",
        "build",
        "out_of_scope_share",
        float,
        "calibration: the share of semantic lookups about questions the release does not hold",
        0,
        MAX_OUT_OF_SCOPE_SHARE,
    ),
    RunOption(
        "min_rows", "gate", "min_rows", int, "quality gate: refuse a release with fewer rows", 1
    ),
    RunOption(
        "min_precision",
        "gate",
        "min_precision",
        float,
        "quality gate: the semantic tier's calibrated precision must reach this (when it serves)",
        0,
        1,
    ),
    RunOption(
        "max_shrink",
        "gate",
        "max_shrink",
        float,
        "quality gate: refuse a release this much smaller than its parent",
        0,
        1,
    ),
    RunOption(
        "finetune_steps",
        "run",
        "finetune_steps",
        int,
        "tune the embedder on the release's phrasings first and ship it in the release",
        0,
    ),
)


# what only the deployment's settings decide: a DAG run config naming one is refused
# (``check_run_config``), as is the pin given to ``PipelineConfig.from_env`` as an option
DEPLOYMENT_ONLY = {
    "logs_uri": "EDGEQA_STORE",
    "out_uri": "EDGEQA_STORE",
    "answers": "EDGEQA_CURATED_ANSWERS",
    "answers_sha256": "EDGEQA_CURATED_ANSWERS_SHA256",
}


def deployment_only(name: str) -> str:
    """Why ``name`` (of ``DEPLOYMENT_ONLY``) is refused from a run."""
    what = {
        "EDGEQA_STORE": "the night's stores are the deployment's",
        "EDGEQA_CURATED_ANSWERS": "the curated answers file is the cluster's",
        "EDGEQA_CURATED_ANSWERS_SHA256": "the curated answers' pin is the deployment's alone",
    }
    setting = DEPLOYMENT_ONLY[name]
    return f"{name} refused: {what[setting]} ({setting}); a run may not set it"


def check_run_config(conf: Mapping[str, Any], params: Iterable[str]) -> None:
    """Raise ``ConfigError`` for a DAG run's ``conf`` that sets what only the deployment decides
    (``DEPLOYMENT_ONLY``: the stores, the answers file, its pin), a key that is none of the
    DAG's ``params`` (a misspelt option would otherwise be dropped without a word), or a quality
    gate looser than its default (``GATE_BARS``: a run may tighten it; an operator loosens it on
    the CLI)."""
    refused = sorted(set(conf) & set(DEPLOYMENT_ONLY))
    if refused:
        raise ConfigError(deployment_only(refused[0]))
    known = set(params)
    unknown = sorted(set(conf) - known)
    if unknown:
        raise ConfigError(
            f"run config refused: {', '.join(unknown)} is not a param of this DAG "
            f"(its params: {', '.join(sorted(known))})"
        )
    for name, sign in GATE_BARS.items():
        value, bar = conf.get(name), next(o.default for o in RUN_OPTIONS if o.name == name)
        if value is not None and (value - bar) * sign < 0:
            raise ConfigError(f"run config refused: {name}={value} loosens the gate ({bar})")


# the quality gate's bars a DAG run may tighten, never loosen: 1, at least its default; -1, at most
GATE_BARS = {"min_rows": 1, "min_precision": 1, "max_shrink": -1}
