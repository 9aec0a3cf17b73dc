from __future__ import annotations

from pathlib import Path

import pytest

from base.config import ConfigError
from origin.config import EngineSettings, OriginSettings
from origin.runtime import engine_config


def test_defaults() -> None:
    config = EngineSettings.from_env({})
    assert config.model == "embedded"
    assert config.cache_dir == Path.home() / ".cache" / "edgeqa"
    assert config.max_tokens == 256 and config.temperature == 0.0


def test_values_from_environment(tmp_path: Path) -> None:
    config = EngineSettings.from_env(
        {"EDGEQA_CACHE_DIR": str(tmp_path), "EDGEQA_MAX_TOKENS": "32", "EDGEQA_DTYPE": "bfloat16"}
    )
    assert config.cache_dir == tmp_path and config.max_tokens == 32 and config.dtype == "bfloat16"


def test_bad_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="EDGEQA_MAX_TOKENS must be an integer"):
        EngineSettings.from_env({"EDGEQA_MAX_TOKENS": "many"})
    with pytest.raises(ConfigError, match="EDGEQA_TEMPERATURE must be at least 0"):
        EngineSettings.from_env({"EDGEQA_TEMPERATURE": "-1"})


def test_engine_settings() -> None:
    config = EngineSettings.from_env(
        {"EDGEQA_MAX_NUM_SEQS": "8", "EDGEQA_QUANTIZATION": "int8", "EDGEQA_KV_CACHE_TOKENS": "0"}
    )
    engine = engine_config(config, "cpu")
    assert engine.max_num_seqs == 8 and engine.quantization == "int8"
    assert engine.kv_cache_tokens is None and engine.token_budget == 512
    none = engine_config(EngineSettings.from_env({"EDGEQA_QUANTIZATION": "none"}), "cpu")
    assert none.quantization == "none"
    auto = engine_config(EngineSettings.from_env({}), "cuda")
    assert auto.quantization == "none"  # fp16 weights as loaded on CUDA
    with pytest.raises(ConfigError, match="EDGEQA_QUANTIZATION must be one of"):
        EngineSettings.from_env({"EDGEQA_QUANTIZATION": "int4"})


def test_speculative_settings() -> None:
    config = engine_config(EngineSettings.from_env({"EDGEQA_SPECULATIVE": "ngram+suffix"}), "cpu")
    assert config.speculative == "ngram+suffix" and config.num_speculative_tokens == 5
    assert engine_config(EngineSettings.from_env({}), "cpu").speculative is None
    with pytest.raises(ConfigError, match="EDGEQA_SPECULATIVE must be one of"):
        EngineSettings.from_env({"EDGEQA_SPECULATIVE": "medusa"})


def test_server_settings() -> None:
    settings = OriginSettings.from_env(
        {
            "EDGEQA_API_KEYS": " key-0123456789abcdef , key-fedcba9876543210 ",
            "EDGEQA_CDN_URL": "https://cdn.example/",
            "EDGEQA_SERVED_MODEL_NAME": "",
        }
    )
    assert settings.api_keys == ("key-0123456789abcdef", "key-fedcba9876543210")
    assert settings.cdn_url == "https://cdn.example"
    assert settings.api_model_name == "SmolLM2-135M-Instruct"
    with pytest.raises(ConfigError, match="EDGEQA_API_KEYS: every key must have at least 16"):
        OriginSettings.from_env({"EDGEQA_API_KEYS": "short"})
    with pytest.raises(ConfigError, match="EDGEQA_CACHE_JITTER must be below 1"):
        OriginSettings.from_env({"EDGEQA_CACHE_JITTER": "1"})
