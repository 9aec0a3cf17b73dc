from __future__ import annotations

from pathlib import Path

import pytest

from edge_index.config import (
    ConfigError,
    EdgeConfig,
    env_bool,
    env_choice,
    env_float,
    env_int,
)


def test_defaults_when_unset_or_blank() -> None:
    config = EdgeConfig.from_env({"EDGEQA_MAX_QUERY_CHARS": "  "})
    assert config.embedder == "embedded"
    assert config.max_query_chars == 2048
    assert config.device == "auto"


def test_typed_values_are_cast() -> None:
    config = EdgeConfig.from_env({"EDGEQA_MAX_QUERY_CHARS": "512", "EDGEQA_DEVICE": "CPU"})
    assert config.max_query_chars == 512
    assert config.device == "cpu"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: env_int({"X": "abc"}, "X", 1), "X must be an integer, got 'abc'"),
        (lambda: env_int({"X": "0"}, "X", 1, minimum=1), "X must be at least 1"),
        (lambda: env_float({"X": "fast"}, "X", 1.0), "X must be a number"),
        (lambda: env_bool({"X": "maybe"}, "X", True), "X must be one of 1/0"),
        (lambda: env_choice({"X": "tpu"}, "X", "cpu", ("cpu", "cuda")), "X must be one of cpu"),
        (lambda: EdgeConfig.from_env({"EDGEQA_DEVICE": "tpu"}), "EDGEQA_DEVICE must be one of"),
    ],
)
def test_bad_values_fail_loudly_naming_the_variable(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=message):
        call()


def test_bool_spellings() -> None:
    assert env_bool({"X": "Yes"}, "X", False) is True
    assert env_bool({"X": "off"}, "X", True) is False
    assert env_bool({}, "X", True) is True


def test_every_variable_is_documented() -> None:
    root = Path(__file__).resolve().parents[2]
    import re

    used: set[str] = set()
    for package in ("edge_index", "origin", "precompute", "edgeqa", "dags"):
        for path in (root / package).rglob("*.py"):
            used.update(re.findall(r"\bEDGEQA_[A-Z0-9_]+\b", path.read_text("utf-8")))
    documented = set(
        re.findall(
            r"`(EDGEQA_[A-Z0-9_]+)`", (root / "docs" / "configuration.md").read_text("utf-8")
        )
    )
    assert used, "no EDGEQA_ variables found"
    assert used - documented == set(), "undocumented variables"
