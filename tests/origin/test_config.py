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


def test_engine_settings() -> None:
    config = OriginConfig.from_env(
        {"EDGEQA_MAX_NUM_SEQS": "8", "EDGEQA_QUANTIZATION": "int8", "EDGEQA_KV_CACHE_TOKENS": "0"}
    )
    engine = config.engine_config("cpu")
    assert engine.max_num_seqs == 8 and engine.quantization == "int8"
    assert engine.kv_cache_tokens is None and engine.token_budget == 512
    assert (
        OriginConfig.from_env({"EDGEQA_QUANTIZATION": "none"}).engine_config("cpu").quantization
        is None
    )
    auto = OriginConfig.from_env({}).engine_config("cuda")
    assert auto.quantization is None  # fp16 weights as loaded on CUDA
    with pytest.raises(ConfigError, match="EDGEQA_QUANTIZATION must be one of"):
        OriginConfig.from_env({"EDGEQA_QUANTIZATION": "int4"})


def test_speculative_settings() -> None:
    config = OriginConfig.from_env({"EDGEQA_SPECULATIVE": "ngram+suffix"}).engine_config("cpu")
    assert config.speculative == "ngram+suffix" and config.num_speculative_tokens == 5
    assert OriginConfig.from_env({}).engine_config("cpu").speculative is None
    with pytest.raises(ConfigError, match="EDGEQA_SPECULATIVE must be one of"):
        OriginConfig.from_env({"EDGEQA_SPECULATIVE": "medusa"})
