"""Configuration of the edge index service, read once from ``EDGEQA_*`` environment variables.

The typed readers here (``env_str``, ``env_int``, ...) are shared by every deployable's config so
that a bad value fails the same loud way everywhere: ``ConfigError`` naming the variable.
Every variable is listed in ``docs/configuration.md``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edge_index.keys import MAX_QUERY_CHARS

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """An ``EDGEQA_*`` variable is missing or has a value of the wrong type."""


def env_str(environ: Mapping[str, str], name: str, default: str) -> str:
    value = environ.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip()


def env_int(environ: Mapping[str, str], name: str, default: int, minimum: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def env_float(
    environ: Mapping[str, str], name: str, default: float, minimum: float | None = None
) -> float:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def env_bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{name} must be one of 1/0, true/false, yes/no, on/off; got {raw!r}")


def env_choice(
    environ: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]
) -> str:
    value = env_str(environ, name, default).lower()
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def env_path(environ: Mapping[str, str], name: str, default: Path) -> Path:
    return Path(env_str(environ, name, str(default))).expanduser()


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    return env_path(environ, "EDGEQA_CACHE_DIR", Path.home() / ".cache" / "edgeqa")


@dataclass(frozen=True)
class EdgeConfig:
    embedder: str
    device: str
    max_query_chars: int
    store_uri: str
    profile: str  # "" = the store's only profile
    poll_s: float

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EdgeConfig:
        env = os.environ if environ is None else environ
        return cls(
            embedder=env_str(env, "EDGEQA_EMBEDDER", "embedded"),
            device=env_choice(env, "EDGEQA_DEVICE", "auto", ("auto", "cpu", "cuda")),
            max_query_chars=env_int(env, "EDGEQA_MAX_QUERY_CHARS", MAX_QUERY_CHARS, minimum=1),
            store_uri=env_str(env, "EDGEQA_STORE", "file://./var/store"),
            profile=env_str(env, "EDGEQA_PROFILE", ""),
            poll_s=env_float(env, "EDGEQA_POLL_S", 30.0, minimum=0.1),
        )
