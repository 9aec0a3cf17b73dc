"""Settings: one declaration per variable, typed, read once, loud on a bad value, documented."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from base.config import ConfigError, EdgeSettings, SharedSettings
from origin.config import EngineSettings, ModelSettings, OriginSettings
from precompute.config import PrecomputeSettings

ROOT = Path(__file__).resolve().parents[2]
EVERY_CLASS = (
    SharedSettings,
    EdgeSettings,
    ModelSettings,
    EngineSettings,
    OriginSettings,
    PrecomputeSettings,
)


def test_defaults_when_unset_or_blank() -> None:
    config = EdgeSettings.from_env({"EDGEQA_MAX_QUERY_CHARS": "  "})
    assert config.embedder == "auto" and config.languages == "en,zh"
    assert config.embedders == {"en": "embedded", "zh": "multilingual"}
    assert config.max_query_chars == 2048
    assert config.device == "auto"


def test_languages_and_their_embedders() -> None:
    one = EdgeSettings.from_env({"EDGEQA_EMBEDDER": "/models/bge-m3", "EDGEQA_LANGUAGES": "zh"})
    assert one.language_list == ("zh",) and one.embedders == {"zh": "/models/bge-m3"}
    pairs = EdgeSettings.from_env({"EDGEQA_EMBEDDER": "zh=/models/bge-m3"})
    assert pairs.embedders == {"en": "embedded", "zh": "/models/bge-m3"}
    named = EdgeSettings.from_env({"EDGEQA_PROFILE": "a-en-1, b-zh-2"})
    assert named.profile_names == ("a-en-1", "b-zh-2")
    with pytest.raises(ConfigError, match="EDGEQA_LANGUAGES: unknown language 'fr'"):
        EdgeSettings.from_env({"EDGEQA_LANGUAGES": "en,fr"})
    with pytest.raises(ConfigError, match="EDGEQA_EMBEDDER: 'fr' is not one of the languages"):
        EdgeSettings.from_env({"EDGEQA_EMBEDDER": "fr=/x"})
    with pytest.raises(ConfigError, match="EDGEQA_EMBEDDER: 'zh=' is not language=embedder"):
        EdgeSettings.from_env({"EDGEQA_EMBEDDER": "en=embedded,zh="})


def test_typed_values_are_cast() -> None:
    config = EdgeSettings.from_env({"EDGEQA_MAX_QUERY_CHARS": "512", "EDGEQA_DEVICE": "CPU"})
    assert config.max_query_chars == 512
    assert config.device == "cpu"


def test_the_environment_is_read_only_through_the_mapping_given() -> None:
    assert EdgeSettings.from_env({}).poll_s == 30.0
    assert EdgeSettings.from_env({"EDGEQA_POLL_S": "2.5", "OTHER": "x"}).poll_s == 2.5
    # an override (a command-line option) wins; None means "not given"
    assert EdgeSettings.from_env({"EDGEQA_POLL_S": "2.5"}, poll_s=1.0).poll_s == 1.0
    assert EdgeSettings.from_env({"EDGEQA_POLL_S": "2.5"}, poll_s=None).poll_s == 2.5


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"EDGEQA_MAX_QUERY_CHARS": "abc"}, "EDGEQA_MAX_QUERY_CHARS must be an integer, got 'abc'"),
        ({"EDGEQA_MAX_QUERY_CHARS": "0"}, "EDGEQA_MAX_QUERY_CHARS must be at least 1"),
        ({"EDGEQA_POLL_S": "fast"}, "EDGEQA_POLL_S must be a number"),
        ({"EDGEQA_DEVICE": "tpu"}, "EDGEQA_DEVICE must be one of auto, cpu, cuda; got 'tpu'"),
    ],
)
def test_bad_values_fail_loudly_naming_the_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EdgeSettings.from_env(environ)


def test_bool_spellings() -> None:
    assert OriginSettings.from_env({"EDGEQA_LOG_REQUESTS": "Yes"}).log_requests is True
    assert OriginSettings.from_env({"EDGEQA_LOG_REQUESTS": "off"}).log_requests is False
    assert OriginSettings.from_env({}).log_requests is True
    with pytest.raises(ConfigError, match="EDGEQA_ORIGIN_TIERS must be one of 1/0"):
        OriginSettings.from_env({"EDGEQA_ORIGIN_TIERS": "maybe"})


def test_replace_checks_like_the_environment() -> None:
    settings = EdgeSettings.from_env({})
    assert settings.replace(poll_s=5).poll_s == 5.0
    with pytest.raises(ConfigError, match=r"EDGEQA_POLL_S must be at least 0\.1"):
        settings.replace(poll_s=0)


def _read_in_code() -> set[str]:
    """Every EDGEQA_ variable the code can read: the settings classes' fields."""
    return {name for cls in EVERY_CLASS for name in cls.variables()}


def test_each_variable_is_declared_in_one_place() -> None:
    owners: dict[str, list[str]] = {}
    for cls in EVERY_CLASS:
        for name in cls.__annotations__:
            if name in cls.model_fields:
                owners.setdefault(name, []).append(cls.__name__)
    assert {n: o for n, o in owners.items() if len(o) > 1} == {}
    # and no module reads the environment for one by name
    for package in ("base", "policy", "edge_index", "origin", "precompute", "edgeqa", "dags"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text("utf-8")
            assert not re.search(r"environ(\.get)?\[?\(?[\"']EDGEQA_", text), path


def test_every_variable_is_documented_and_every_documented_one_is_read() -> None:
    documented = set(
        re.findall(
            r"^\| `(EDGEQA_[A-Z0-9_]+)`",
            (ROOT / "docs" / "configuration.md").read_text("utf-8"),
            re.MULTILINE,
        )
    )
    read = _read_in_code()
    assert read, "no EDGEQA_ variables found"
    assert read - documented == set(), "read but not documented"
    assert documented - read == set(), "documented but never read"


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("150000 100000", 2), ("max 100000", None), ("50000 100000", 1), ("not a quota", None)],
)
def test_the_cpus_a_process_may_use_count_its_cgroup_quota(
    monkeypatch: pytest.MonkeyPatch, cpu_max: str, expected: int | None
) -> None:
    from base.config import usable_cpus

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    real = Path.read_text

    def read_text(self: Path, *args: Any, **kwargs: Any) -> str:
        if str(self) == "/sys/fs/cgroup/cpu.max":
            return cpu_max
        if str(self).startswith("/sys/fs/cgroup/"):
            raise FileNotFoundError(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert usable_cpus() == (expected if expected is not None else 8)


def test_the_cache_folder_must_be_this_users_alone(tmp_path: Path) -> None:
    from base.config import ConfigError, private_folder

    made = private_folder(tmp_path / "new" / "cache")
    assert made.is_dir() and oct(made.stat().st_mode & 0o777) == "0o700"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=r"EDGEQA_CACHE_DIR .* writable by group or others"):
        private_folder(shared)
    shared.chmod(0o755)  # readable by others is the operator's choice; writable is not
    assert private_folder(shared) == shared
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(ConfigError, match="not a folder"):
        private_folder(file)
