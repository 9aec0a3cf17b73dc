from __future__ import annotations

from pathlib import Path

import pytest

from edge_index.config import ConfigError
from origin.config import OriginConfig


def test_defaults() -> None:
    config = OriginConfig.from_env({})
    assert config.model == "embedded"
    assert config.cache_dir == Path.home() / ".cache" / "edgeqa"
    assert config.max_tokens == 256 and config.temperature == 0.0


def test_values_from_environment(tmp_path: Path) -> None:
    config = OriginConfig.from_env(
        {"EDGEQA_CACHE_DIR": str(tmp_path), "EDGEQA_MAX_TOKENS": "32", "EDGEQA_DTYPE": "bfloat16"}
    )
    assert config.cache_dir == tmp_path and config.max_tokens == 32 and config.dtype == "bfloat16"


def test_bad_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="EDGEQA_MAX_TOKENS must be an integer"):
        OriginConfig.from_env({"EDGEQA_MAX_TOKENS": "many"})
    with pytest.raises(ConfigError, match="EDGEQA_TEMPERATURE must be at least 0"):
        OriginConfig.from_env({"EDGEQA_TEMPERATURE": "-1"})
