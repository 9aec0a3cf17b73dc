"""Shared fixtures: the real embedded model and embedder, loaded once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# nothing may come from a hub: every model is local
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache dir holding the converted embedded model (converted once per session)."""
    from origin.model import embedded_gguf_path, ensure_converted

    cache = tmp_path_factory.mktemp("edgeqa-cache")
    ensure_converted(embedded_gguf_path(), cache)
    return cache


@pytest.fixture(scope="session")
def embedded_model(model_cache_dir: Path):  # type: ignore[no-untyped-def]
    from origin.model import load_model

    return load_model("embedded", cache_dir=model_cache_dir)


@pytest.fixture(scope="session")
def embedder():  # type: ignore[no-untyped-def]
    from edge_index.embedder import load_embedder

    return load_embedder("embedded")


@pytest.fixture()
def cli_env(model_cache_dir: Path) -> dict[str, str]:
    """Environment for running the ``edgeqa`` console script against the session's cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEQA_")}
    env["EDGEQA_CACHE_DIR"] = str(model_cache_dir)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env
