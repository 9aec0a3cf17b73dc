"""Settings: every ``EDGEQA_*`` environment variable, declared once, read once at start.

Each variable is one field of one settings class (pydantic-settings): the field's name is the
variable's name without ``EDGEQA_``, its type and bounds are the checks, its default is the
default. The classes build on each other, so a variable two deployables share is still declared
in one place:

    SharedSettings (here)      the store, the profile, the embedder, the device, the cache folder,
      |                        the user-hash salt
      +- EdgeSettings (here)   + the edge index service's own
      +- ModelSettings         + the LLM and its prompt        (origin/config.py)
           +- EngineSettings   + the engine's sizes             (origin/config.py)
           |    +- OriginSettings  + the HTTP server's          (origin/config.py)
           +- PrecomputeSettings   + the nightly job's          (precompute/config.py)

An entry point reads its class once (``OriginSettings.from_env()``) and passes the values down as
plain arguments. An unset or blank variable takes the default; a bad value raises ``ConfigError``
naming the variable. ``docs/configuration.md`` documents every field (a test checks both ways).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from base.errors import EdgeQAError
from base.keys import MAX_QUERY_CHARS

if TYPE_CHECKING:
    from base.highwater import HighWater

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MIN_SECRET_CHARS = 32  # EDGEQA_IDENTITY_SECRET: an HS256 key
MIN_TOKEN_CHARS = 16  # EDGEQA_METRICS_TOKEN, as an API key

PREFIX = "EDGEQA_"
DEFAULT_STORE = "file://./var/store"
# calibration (semantic/matcher.py): the share of semantic lookups assumed to be about something
# the release does not hold, and its ceiling (past 1/2 a weighted held-out hit would count as more
# than one Wilson trial and the bound would understate its variance)
OUT_OF_SCOPE_SHARE = 0.05
MAX_OUT_OF_SCOPE_SHARE = 0.5

Device = Literal["auto", "cpu", "cuda"]
# the fixed-order CPU kernels' instruction-set levels (origin/engine/kernels/fixed_order.h)
KernelIsa = Literal["auto", "scalar", "avx2", "avx512", "vnni"]


DEFAULT_CACHE_DIR = Path.home() / ".cache" / "edgeqa"  # EDGEQA_CACHE_DIR's default
# each language's embedder under EDGEQA_EMBEDDER=auto (semantic/loading.py's names)
DEFAULT_EMBEDDERS = {"en": "embedded", "zh": "multilingual"}


class ConfigError(EdgeQAError, ValueError):
    """An ``EDGEQA_*`` variable (or the option standing for it) has a value of the wrong type."""


class _EnvironSource(EnvSettingsSource):
    """The variables of one mapping (``os.environ`` unless a test passes its own); a value that is
    blank after stripping counts as unset."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = {
            name: value.strip()
            for name, value in environ.items()
            if name.startswith(PREFIX) and value.strip()
        }
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {name.lower(): value for name, value in self._environ.items()}


class Settings(BaseSettings):
    """The base of every settings class: ``EDGEQA_`` names, frozen values, loud errors."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX, extra="ignore", frozen=True, validate_default=True
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """The settings from ``environ`` (default: ``os.environ``); ``overrides`` (an option
        given on the command line, say) win over the environment. Raises ``ConfigError``."""
        sources: tuple[PydanticBaseSettingsSource, ...] = (
            InitSettingsSource(cls, {k: v for k, v in overrides.items() if v is not None}),
            _EnvironSource(cls, os.environ if environ is None else environ),
        )
        try:
            return cls(_build_sources=(sources, {}))  # type: ignore[call-arg]
        except ValidationError as error:
            raise ConfigError(_explain(error)) from None

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied and checked like values from the environment."""
        try:
            values = InitSettingsSource(type(self), {**self.model_dump(), **changes})
            return type(self)(_build_sources=((values,), {}))  # type: ignore[call-arg]
        except ValidationError as error:
            raise ConfigError(_explain(error)) from None

    @classmethod
    def variables(cls) -> Iterator[str]:
        """The names of the environment variables this class reads."""
        for name in cls.model_fields:
            yield env_name(name)


def usable_cpus() -> int:
    """The CPUs this process may use: those it may run on, and no more than its cgroup's CPU
    quota (a container limited to 4 CPUs on a 96-core node may use 4, not 96)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpus = cpus or 1
    for path, parse in (
        ("/sys/fs/cgroup/cpu.max", lambda text: text.split()),  # cgroup v2: "<quota> <period>"
        ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", None),  # cgroup v1
    ):
        try:
            text = Path(path).read_text().strip()
            if parse is not None:
                quota, period = parse(text)
            else:
                quota = text
                period = Path(path).with_name("cpu.cfs_period_us").read_text().strip()
            if quota not in ("max", "-1") and int(period) > 0:
                return max(1, min(cpus, -(-int(quota) // int(period))))
            break
        except (OSError, ValueError):
            continue
    return cpus


def env_name(field: str) -> str:
    return PREFIX + field.upper()


def _explain(error: ValidationError) -> str:
    """pydantic's errors in one line per variable, in the words the docs use."""
    lines = []
    for item in error.errors():
        name = env_name(str(item["loc"][0])) if item["loc"] else "settings"
        got = item.get("input")
        ctx = item.get("ctx") or {}
        kind = item["type"]
        if kind == "int_parsing":
            lines.append(f"{name} must be an integer, got {got!r}")
        elif kind == "float_parsing":
            lines.append(f"{name} must be a number, got {got!r}")
        elif kind == "bool_parsing":
            lines.append(f"{name} must be one of 1/0, true/false, yes/no, on/off; got {got!r}")
        elif kind == "literal_error":
            expected = str(ctx.get("expected", "")).replace("'", "").replace(" or ", ", ")
            lines.append(f"{name} must be one of {expected}; got {got!r}")
        elif kind in ("greater_than_equal", "greater_than"):
            bound = ctx.get("ge", ctx.get("gt"))
            word = "at least" if kind == "greater_than_equal" else "above"
            lines.append(f"{name} must be {word} {bound:g}, got {got}")
        elif kind in ("less_than", "less_than_equal"):
            bound = ctx.get("lt", ctx.get("le"))
            word = "below" if kind == "less_than" else "at most"
            lines.append(f"{name} must be {word} {bound:g}, got {got}")
        else:
            lines.append(f"{name}: {item['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines)


def parse_networks(value: str) -> tuple[Network, ...]:
    """``"10.0.0.0/16, 192.168.1.5"`` as networks; ``ValueError`` naming a bad entry."""
    networks = []
    for item in value.split(","):
        if item.strip():
            try:
                networks.append(ipaddress.ip_network(item.strip(), strict=False))
            except ValueError:
                raise ValueError(f"{item.strip()!r} is not an IP address or CIDR") from None
    return tuple(networks)


def lowercase(value: Any) -> Any:
    """A ``mode="before"`` validator: settings words are case-insensitive."""
    return value.lower() if isinstance(value, str) else value


class StoreSettings(Settings):
    """How the store is reached (``base/store.py``: ``open_store`` reads it when not told)."""

    # S3 requests in flight at once in a bulk transfer (uploads, read-back, deletes), and the
    # client's connection pool: an object store answers each in 15-25 ms, so throughput is
    # requests in flight over latency
    s3_concurrency: int = Field(128, ge=1, le=4096)


class SharedSettings(StoreSettings):
    """What the edge service, the origin and the nightly job all read."""

    store: str = Field(DEFAULT_STORE, description="root of releases and logs")
    # the release profiles served: '' = for each language, the store's newest profile of that
    # language; or a comma-separated list of profile names to choose from
    profile: str = ""
    # the language profiles built and served (a question goes to one by its script)
    languages: str = "en,zh"
    poll_s: float = Field(30.0, ge=0.1)
    # auto (each language its default), one embedder for all, or language=embedder pairs
    embedder: str = "auto"
    device: Device = "auto"
    cache_dir: Path = DEFAULT_CACHE_DIR
    # the level the fixed-order kernels run at: auto = the highest this CPU has; a lower one
    # reproduces another CPU's code path (every level computes the same bits)
    kernel_isa: KernelIsa = "auto"
    # the secret of the user hashes in request logs; "" = a random one per process
    user_salt: str = ""
    # request-log files kept on local disk while the store fails (0: none, rows wait in memory)
    log_spill_mb: int = Field(256, ge=0)
    # the HS256 key of the user tokens the deployment's backend signs ("" = user ids never count)
    identity_secret: str = ""
    # CIDRs of the proxies (the load balancer) whose forwarding headers are believed
    trusted_proxies: str = ""
    # a local IP-to-AS table (base/asn.py) the services log each viewer's AS from ("" = none)
    asn_table: str = ""
    # publish and cache answers that send the reader elsewhere (a link, a domain, "visit ...", a
    # phone number, an e-mail address: policy/answers.py's "link"); off: never stored
    allow_answer_links: bool = False
    # base64 Ed25519 keys a release must be signed by ("" = signatures not checked)
    release_public_keys: str = ""
    # the bearer token /metrics asks for ("" = /metrics answers this machine only)
    metrics_token: str = ""
    # where the highest pointer and revocation-list sequences ever signed are kept, outside the
    # store (base/highwater.py: file://, ssm://, dynamodb://; "" = none: only each reader's memory)
    high_water_uri: str = ""

    @field_validator("release_public_keys", mode="after")
    @classmethod
    def _public_keys(cls, value: str) -> str:
        from base.signing import parse_public_keys

        parse_public_keys(value)
        return value

    @property
    def public_keys(self) -> tuple[str, ...]:
        from base.signing import parse_public_keys

        return parse_public_keys(self.release_public_keys)

    @field_validator("high_water_uri", mode="after")
    @classmethod
    def _high_water(cls, value: str) -> str:
        from base.highwater import parse_high_water

        parse_high_water(value)
        return value.strip()

    def high_water(self) -> HighWater | None:
        """The high-water mark ``EDGEQA_HIGH_WATER_URI`` names (None: none)."""
        from base.highwater import open_high_water

        return open_high_water(self.high_water_uri)

    @field_validator("languages", mode="after")
    @classmethod
    def _languages(cls, value: str) -> str:
        from base.languages import parse_languages

        parse_languages(value)
        return value

    @property
    def language_list(self) -> tuple[str, ...]:
        from base.languages import parse_languages

        return parse_languages(self.languages)

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.profile.split(",") if p.strip())

    @model_validator(mode="after")
    def _embedders(self) -> Self:
        try:
            self.embedders  # noqa: B018 (parsed for its errors)
        except ValueError as error:
            raise ValueError(f"EDGEQA_EMBEDDER: {error}") from None
        return self

    @property
    def embedders(self) -> dict[str, str]:
        """The embedder spec of each language (``EDGEQA_EMBEDDER``)."""
        return parse_embedders(self.embedder, self.language_list)

    @field_validator("identity_secret", "metrics_token", mode="after")
    @classmethod
    def _long_secret(cls, value: str, info: ValidationInfo) -> str:
        least = MIN_SECRET_CHARS if info.field_name == "identity_secret" else MIN_TOKEN_CHARS
        if value and len(value) < least:
            raise ValueError(f"must have at least {least} characters")
        return value

    @field_validator("trusted_proxies", mode="after")
    @classmethod
    def _networks(cls, value: str) -> str:
        parse_networks(value)
        return value

    @field_validator("device", mode="before")
    @classmethod
    def _lower_device(cls, value: Any) -> Any:
        return lowercase(value)

    @field_validator("cache_dir", mode="after")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()


class EdgeSettings(SharedSettings):
    """The edge index service."""

    max_query_chars: int = Field(MAX_QUERY_CHARS, ge=1)


def private_folder(path: Path, variable: str = "EDGEQA_CACHE_DIR") -> Path:
    """``path``, made (mode 0700) if missing; ``ConfigError`` when it is not a folder, or belongs
    to another user than this one or root, or group or others may write it: a service trusts
    what it reads there (the pointers it verified, model conversions), so nobody else may plant
    it."""
    import stat

    try:
        if not path.exists():
            path.mkdir(mode=0o700, parents=True)
        status = path.stat()
    except OSError as error:
        raise ConfigError(f"{variable} {path}: {error}") from None
    problem = None
    if not stat.S_ISDIR(status.st_mode):
        problem = "is not a folder"
    elif status.st_uid not in (0, os.geteuid()):
        problem = f"belongs to uid {status.st_uid}, not this user ({os.geteuid()})"
    elif status.st_mode & 0o022:
        problem = f"is writable by group or others (mode {stat.S_IMODE(status.st_mode):o})"
    if problem is not None:
        raise ConfigError(f"{variable} {path} {problem}: make it this user's alone (chmod 700)")
    return path


def parse_embedders(value: str, languages: tuple[str, ...]) -> dict[str, str]:
    """``EDGEQA_EMBEDDER``: ``auto`` (each language its default: ``DEFAULT_EMBEDDERS``), one spec
    for every language, or ``lang=spec`` pairs (``zh=/models/bge-m3``; languages not named keep
    their default). ``ValueError`` naming a bad entry."""
    chosen = {language: DEFAULT_EMBEDDERS.get(language, "embedded") for language in languages}
    value = value.strip()
    if not value or value == "auto":
        return chosen
    if "=" not in value:
        return dict.fromkeys(languages, value)
    for item in value.split(","):
        if not item.strip():
            continue
        language, sep, spec = (part.strip() for part in item.partition("="))
        if not sep or not language or not spec:
            raise ValueError(f"{item.strip()!r} is not language=embedder")
        if language not in chosen:
            raise ValueError(f"{language!r} is not one of the languages {', '.join(languages)}")
        chosen[language] = spec
    return chosen


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: Linux's ``VmHWM``, the high-water mark of its
    own memory since it started (``ru_maxrss`` is not: Linux keeps it across ``exec``, so a
    child started by a large parent reports the parent's); ``ru_maxrss`` elsewhere."""
    import resource

    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
